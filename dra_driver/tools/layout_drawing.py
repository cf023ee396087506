"""`dra-driver plan -o svg|png`: the node drawn, one column per mode and one row per GPU.

A MIG GPU is its placement grid: memory slices across, compute slices up, each allocated
placement a box over the slices it covers, as tall as its compute slices. Any other GPU is two
bars, memory and cores, with each allocation's share. Boxes are coloured by pod shape. Every
allocation's box carries `gid="placement-<mode>-<n>"`, so tests count them in the figure
rather than in pixels.

matplotlib is an optional dependency (`pip install 'dra-driver[plot]'`) and is imported only
here, through its object API (no pyplot, so no global figure state and no display backend).
"""

from collections.abc import Sequence
from pathlib import Path

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from dra_driver.packing.layout import GpuLayout, Occupant
from dra_driver.packing.planner import ModePlan

# Colour-blind safe (Okabe-Ito), then matplotlib's tab10 for more shapes.
_COLOURS = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7")
_EXTRA = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
_FREE = "#eeeeee"
_OFFERED = "#bbbbbb"
# Devices a live node's claims hold already: one colour for all of them.
_CLAIMED = "#666666"
CLAIMED = "allocated before"


class Colours(dict[str, str]):
    """A colour per pod shape; any other label (a claim's) is drawn as allocated before."""

    def __missing__(self, label: str) -> str:
        return _CLAIMED


def colours(labels: Sequence[str]) -> Colours:
    palette = (*_COLOURS, *_EXTRA)
    return Colours(
        {label: palette[number % len(palette)] for number, label in enumerate(dict.fromkeys(labels))}
    )


def _mig(axes: Axes, layout: GpuLayout, colour: Colours, gid: str) -> int:
    slices, compute = layout.memory_slices, layout.compute_slices or 1
    for index in range(slices):
        axes.add_patch(Rectangle((index, 0), 1, compute, facecolor=_FREE, edgecolor="white"))
    drawn = 0
    for block in layout.blocks:
        occupant = block.occupant
        rectangle = Rectangle(
            (block.start, 0),
            block.size,
            block.compute,
            facecolor=colour[occupant.label] if occupant else _OFFERED,
            edgecolor="black",
            linewidth=0.8,
        )
        if occupant:
            rectangle.set_gid(f"{gid}-{drawn}")
            drawn += 1
        axes.add_patch(rectangle)
        axes.text(
            block.start + block.size / 2,
            block.compute / 2,
            # A one-slice box has room for "1g" only.
            block.profile if block.size > 1 else block.profile.split(".")[0],
            ha="center",
            va="center",
            fontsize=6,
        )
    axes.set_xlim(0, slices)
    axes.set_ylim(0, compute)
    axes.set_xticks(range(slices + 1))
    axes.set_yticks(range(compute + 1))
    axes.tick_params(labelsize=5)
    return drawn


def _bars(axes: Axes, layout: GpuLayout, colour: Colours, gid: str) -> int:
    """Memory on the upper bar, cores on the lower, each as a fraction of the GPU's."""
    axes.add_patch(Rectangle((0, 1.1), 1, 0.8, facecolor=_FREE))
    axes.add_patch(Rectangle((0, 0.1), 1, 0.8, facecolor=_FREE))
    memory_at = cores_at = 0.0
    for number, occupant in enumerate(layout.occupants):
        width = occupant.memory_bytes / layout.memory_bytes if layout.memory_bytes else 0
        box = Rectangle(
            (memory_at, 1.1), width, 0.8, facecolor=colour[occupant.label], edgecolor="black", lw=0.6
        )
        box.set_gid(f"{gid}-{number}")
        axes.add_patch(box)
        memory_at += width
        cores = occupant.cores / 100
        axes.add_patch(
            Rectangle(
                (cores_at, 0.1), cores, 0.8, facecolor=colour[occupant.label], edgecolor="black", lw=0.6
            )
        )
        cores_at += cores
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 2)
    axes.set_yticks([0.5, 1.5], ["cores", "memory"], fontsize=6)
    axes.set_xticks([0, 0.5, 1], ["0", "50%", "100%"], fontsize=5)
    return len(layout.occupants)


def _occupants(layout: GpuLayout) -> list[Occupant]:
    return [*layout.occupants, *(block.occupant for block in layout.blocks if block.occupant)]


def layout_figure(node: str, plans: Sequence[ModePlan]) -> Figure:
    labels = [outcome.group.shape.text for plan in plans for outcome in plan.groups]
    colour = colours(labels)
    rows = max((len(plan.gpus) for plan in plans), default=1)
    figure = Figure(figsize=(3.2 * len(plans), 0.9 * rows + 1.2), layout="constrained")
    grid = figure.subplots(rows, len(plans), squeeze=False)
    for column, plan in enumerate(plans):
        grid[0][column].set_title(f"{plan.mode}: {plan.placed} of {plan.asked} fit", fontsize=8)
        for row in range(rows):
            axes = grid[row][column]
            if row >= len(plan.gpus):
                axes.set_axis_off()
                continue
            layout = plan.gpus[row].layout
            gid = f"placement-{plan.mode}-gpu{layout.index}"
            (_mig if layout.kind == "mig" else _bars)(axes, layout, colour, gid)
            axes.set_ylabel(f"GPU {layout.index}", fontsize=6)
    if any(o.label not in colour for plan in plans for gpu in plan.gpus for o in _occupants(gpu.layout)):
        colour[CLAIMED] = _CLAIMED
    handles = [Rectangle((0, 0), 1, 1, facecolor=value) for value in colour.values()]
    figure.legend(
        handles, list(colour), loc="outside lower center", ncols=min(6, len(colour)) or 1, fontsize=7
    )
    figure.suptitle(node, fontsize=9)
    return figure


def placement_patches(figure: Figure) -> list[Rectangle]:
    """The boxes that stand for allocations (what the tests count)."""
    return [
        patch
        for axes in figure.axes
        for patch in axes.patches
        if isinstance(patch, Rectangle) and (patch.get_gid() or "").startswith("placement-")
    ]


def save_layout(figure: Figure, path: Path, output: str) -> None:
    # A fixed hash salt and no date keep the SVG the same from run to run (a committed example
    # then changes only when the picture does); text as text, not glyph outlines, keeps it small.
    metadata = {"Date": None} if output == "svg" else {}
    with rc_context({"svg.hashsalt": "dra-driver-plan", "svg.fonttype": "none"}):
        figure.savefig(path, format=output, metadata=metadata, dpi=150)
