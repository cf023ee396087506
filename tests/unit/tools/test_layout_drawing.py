"""The drawing has one box per placed pod, where the plan put it, and saves as a real PNG/SVG."""

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from matplotlib.patches import Rectangle

from dra_driver.packing.planner import plan_node_modes
from dra_driver.packing.shapes import parse_pods
from dra_driver.tools.layout_drawing import (
    BAR_AXIS,
    KIND_COLOURS,
    colours,
    layout_figure,
    placement_patches,
    save_layout,
)
from tests.support.nodes import simulated_node

DRIVER = "gpu.dra-driver.dev"
GIB = 2**30
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
        to_rgba(colour[pod.shape][0]) for plan in PLANS for outcome in plan.groups for pod in outcome.placed
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


def test_each_kind_has_one_colour_whatever_else_is_asked_for() -> None:
    assert KIND_COLOURS == {
        "gpu": "#0072B2",
        "vgpu": "#009E73",
        "1g": "#E69F00",
        "2g": "#56B4E9",
        "3g": "#D55E00",
        "4g": "#CC79A7",
        "7g": "#F0E442",
    }
    alone = colours(["1g.10gb"])
    asked_after_others = colours(["gpu", "vgpu:10Gi", "3g.40gb", "1g.10gb"])
    assert alone["1g.10gb"] == asked_after_others["1g.10gb"] == (KIND_COLOURS["1g"], "")
    assert asked_after_others["gpu"] == (KIND_COLOURS["gpu"], "")
    # A second shape of a kind keeps the kind's colour and is told apart by its hatch.
    second = colours(["vgpu:10Gi", "vgpu:4Gi"])
    assert second["vgpu:4Gi"][0] == second["vgpu:10Gi"][0] == KIND_COLOURS["vgpu"]
    assert second["vgpu:4Gi"][1] != second["vgpu:10Gi"][1]


def test_stranded_memory_is_marked_where_it_is() -> None:
    figure = layout_figure("node", PLANS)

    stranded = placement_patches(figure, "stranded")

    by_gpu: dict[str, list[float]] = {}
    for patch in stranded:
        mode_gpu = str(patch.get_gid()).removeprefix("stranded-").rsplit("-", 1)[0]
        by_gpu.setdefault(mode_gpu, []).append(round(patch.get_width(), 6))
    expected: dict[str, list[float]] = {}
    for plan in PLANS:
        for gpu in plan.gpus:
            layout = gpu.layout
            if not gpu.stranded_bytes:
                continue
            key = f"{plan.mode}-gpu{layout.index}"
            if layout.kind == "mig":
                used = sum(block.size for block in layout.blocks if block.occupant)
                expected[key] = [1.0] * (layout.memory_slices - used)
            else:
                expected[key] = [round(gpu.stranded_bytes / GIB, 6)]
    assert expected and by_gpu == expected


def test_each_column_lists_the_pods_that_did_not_fit() -> None:
    figure = layout_figure("node", PLANS)

    titles = [axes.get_title() for axes in figure.axes if axes.get_title()]

    assert len(titles) == len(PLANS)
    for plan, title in zip(PLANS, titles, strict=True):
        refused = [f"{o.refused}x{o.group.shape.text}" for o in plan.groups if o.refused]
        assert refused
        assert title.splitlines() == [
            f"{plan.mode}: {plan.placed} of {plan.asked} fit",
            f"refused: {', '.join(refused)}",
        ]


def test_mig_grids_name_their_axes_and_bars_are_in_gib() -> None:
    (mig,) = [plan for plan in PLANS if plan.mode == "mig-dynamic"]
    (shared,) = [plan for plan in PLANS if plan.mode == "vgpu-capacity"]
    figure = layout_figure("node", [mig, shared])
    grid = figure.axes

    mig_axes, bar_axes = grid[0], grid[1]
    # The axis note once per column, under its lowest row.
    assert [axes.get_xlabel() for axes in grid] == ["", "", "memory slices", BAR_AXIS]
    assert mig_axes.get_ylabel() == "GPU 0\ncompute slices"
    assert bar_axes.get_xlim() == (0, shared.gpus[0].layout.memory_bytes / GIB)
    boxes = [
        p
        for p in bar_axes.patches
        if isinstance(p, Rectangle) and (p.get_gid() or "").startswith("placement-")
    ]
    assert [box.get_width() for box in boxes] == [
        occupant.memory_bytes / GIB for occupant in shared.gpus[0].layout.occupants
    ]


def test_gpus_that_hold_nothing_and_are_alike_are_one_row_and_counted() -> None:
    """Two pods on a DGX H100: two GPUs drawn with them, one empty GPU for what is free, and the
    title says the other five are not drawn; every text is readable at normal size."""
    (plan,) = plan_node_modes(simulated_node("dgx-h100"), parse_pods("2xgpu"), DRIVER, modes=("gpu",))
    figure = layout_figure("node", [plan])

    drawn = [axes for axes in figure.axes if axes.get_ylabel().startswith("GPU")]
    assert [axes.get_ylabel() for axes in drawn] == ["GPU 0", "GPU 1", "GPU 2"]
    (title,) = [axes.get_title() for axes in figure.axes if axes.get_title()]
    assert title.splitlines()[-1] == "5 more GPUs like these hold nothing (not drawn)"
    sizes = [
        float(text.get_fontsize()) for axes in figure.axes for text in (*axes.texts, *axes.get_xticklabels())
    ]
    assert sizes and min(sizes) >= 7


def test_gpus_that_hold_nothing_but_differ_are_all_drawn() -> None:
    gpus = simulated_node("mixed")
    (plan,) = plan_node_modes(gpus, parse_pods("1xgpu"), DRIVER, modes=("gpu",))
    figure = layout_figure("node", [plan])

    assert len([axes for axes in figure.axes if axes.get_ylabel().startswith("GPU")]) == len(plan.gpus)
