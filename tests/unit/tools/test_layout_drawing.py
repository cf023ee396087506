"""The drawing has one box per placed pod, where the plan put it, and saves as a real PNG/SVG."""

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from dra_driver.packing.planner import plan_node_modes
from dra_driver.packing.shapes import parse_pods
from dra_driver.tools.layout_drawing import colours, layout_figure, placement_patches, save_layout
from tests.support.nodes import simulated_node

DRIVER = "gpu.dra-driver.dev"
PODS = parse_pods("9x1g.10gb,2x3g.40gb,3xvgpu:10Gi/30%,2xgpu")
# Two GPUs keep the figures small (drawing dozens of axes costs seconds).
PLANS = plan_node_modes(simulated_node("dgx-h100")[:2], PODS, DRIVER)


def test_every_placed_pod_is_one_box_in_its_shapes_colour() -> None:
    figure = layout_figure("node", PLANS)

    patches = placement_patches(figure)

    assert len(patches) == sum(plan.placed for plan in PLANS) > 0
    colour = colours([group.shape.text for group in PODS])
    from matplotlib.colors import to_rgba  # noqa: PLC0415

    expected = sorted(
        to_rgba(colour[pod.shape]) for plan in PLANS for outcome in plan.groups for pod in outcome.placed
    )
    assert sorted(patch.get_facecolor() for patch in patches) == expected


def test_a_mig_box_covers_the_slices_and_compute_of_its_placement() -> None:
    (plan,) = [plan for plan in PLANS if plan.mode == "mig-dynamic"]

    patches = placement_patches(layout_figure("node", [plan]))

    drawn = sorted((p.get_x(), p.get_width(), p.get_height()) for p in patches)
    blocks = sorted(
        (float(b.start), float(b.size), float(b.compute)) for gpu in plan.gpus for b in gpu.layout.blocks
    )
    assert drawn == blocks


@pytest.mark.parametrize("output", ["png", "svg"])
def test_the_file_is_a_valid_picture(output: str, tmp_path: Path) -> None:
    path = tmp_path / f"plan.{output}"

    save_layout(layout_figure("node", PLANS[:1]), path, output)

    data = path.read_bytes()
    if output == "png":
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        assert data[12:16] == b"IHDR"
    else:
        root = ET.fromstring(data)
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        ids = {element.get("id") for element in root.iter()}
        assert sum(1 for i in ids if i and i.startswith("placement-")) == PLANS[0].placed
