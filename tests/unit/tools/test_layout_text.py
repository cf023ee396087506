"""The text layout: one row per GPU, a column per MIG memory slice, the occupant's letter on
exactly the slices its placement covers; bars for the other GPUs. Expected cells are computed
from the plan's layouts (the model), not written out as a picture."""

import re

from dra_driver.packing.allocator import Pool
from dra_driver.packing.layout import GpuLayout, gpu_layouts
from dra_driver.packing.planner import plan_node_modes
from dra_driver.packing.shapes import parse_pods
from dra_driver.tools.layout_text import BAR_COLUMNS, CORE_COLUMNS, FREE, OFFERED, layout_text, markers
from tests.support.nodes import inventory_for, simulated_node

DRIVER = "gpu.dra-driver.dev"
ROW = re.compile(r"GPU (\d+) +(\S+) +(.*)")


def rows(text: str) -> list[re.Match[str]]:
    legend, *lines = text.splitlines()
    assert legend.startswith("legend: ")
    matches = [ROW.fullmatch(line) for line in lines]
    assert all(matches), lines
    return [match for match in matches if match]


def slices(picture: str) -> list[str]:
    inner = re.search(r"slices \[(.*?)\]", picture)
    assert inner
    cells = inner[1][0::2]
    assert set(inner[1][1::2]) <= {" ", "|"}
    return list(cells)


def test_each_mig_gpu_is_a_row_of_its_slices_with_each_pod_on_the_slices_it_covers() -> None:
    pods = parse_pods("9x1g.10gb,3x3g.40gb,2g.20gb")
    (plan,) = plan_node_modes(simulated_node("dgx-h100"), pods, DRIVER, ("mig-dynamic",))
    layouts = [gpu.layout for gpu in plan.gpus]
    labels = [group.shape.text for group in pods]

    found = rows(layout_text(layouts, labels))

    marks = markers(labels)
    assert [int(row[1]) for row in found] == [layout.index for layout in layouts]
    for row, layout in zip(found, layouts, strict=True):
        cells = slices(row[3])
        assert len(cells) == layout.memory_slices
        expected = [FREE] * layout.memory_slices
        for block in layout.blocks:
            assert block.occupant is not None
            expected[block.start : block.start + block.size] = [marks[block.occupant.label]] * block.size
        assert cells == expected
    occupied = sum(cell != FREE for row in found for cell in slices(row[3]))
    assert occupied == sum(block.size for layout in layouts for block in layout.blocks) > 0


def test_static_instances_show_as_offered_and_their_edges() -> None:
    layouts = gpu_layouts(Pool.from_inventory(inventory_for("mixed"), DRIVER), ())
    found = rows(layout_text(layouts))

    mig: list[tuple[re.Match[str], GpuLayout]] = [
        (row, layout) for row, layout in zip(found, layouts, strict=True) if layout.kind == "mig"
    ]
    assert mig
    for row, layout in mig:
        picture = re.search(r"slices \[(.*?)\]", row[3])
        assert picture
        covered = {i for block in layout.blocks for i in range(block.start, block.start + block.size)}
        assert slices(row[3]) == [OFFERED if i in covered else FREE for i in range(layout.memory_slices)]
        ends = {0, layout.memory_slices}
        edges = {e for block in layout.blocks for e in (block.start, block.start + block.size)} - ends
        assert [i for i, sep in enumerate(picture[1][1::2], start=1) if sep == "|"] == sorted(edges)


def test_shared_gpus_show_memory_and_cores_bars_filled_by_their_shares() -> None:
    (plan,) = plan_node_modes(
        simulated_node("l4x8"), parse_pods("3xvgpu:4Gi/20%"), DRIVER, ("vgpu-capacity",)
    )
    layouts = [gpu.layout for gpu in plan.gpus]

    found = rows(layout_text(layouts, ["vgpu:4Gi/20%"]))

    assert len(found) == len(layouts)
    first = re.fullmatch(r"memory \[(.*)\] cores \[(.*)\]  .*", found[0][3])
    assert first
    memory, cores = first[1], first[2]
    assert (len(memory), len(cores)) == (BAR_COLUMNS, CORE_COLUMNS)
    # Each share is drawn its share of the bar.
    assert cores.count("a") == 3 * round(20 * CORE_COLUMNS / 100)
    assert memory.count("a") == 3 * round(4 * 2**30 * BAR_COLUMNS / layouts[0].memory_bytes)
    assert set(memory.replace("a", "")) == {FREE}
