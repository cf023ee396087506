"""`dra-driver plan -o svg|png`: the node drawn, one column per mode and one row per GPU.

A MIG GPU is its placement grid: memory slices across, compute slices up, each allocated
placement a box over the slices it covers, as tall as its compute slices. Any other GPU is two
bars, memory in GiB and cores in percent, with each allocation's share. Free memory no shape
asked for can use any more is hatched as stranded, and each column's title lists the pods that
did not fit. Every allocation's box carries `gid="placement-<mode>-<n>"` and every stranded area
`gid="stranded-<mode>-<n>"`, so tests count them in the figure rather than in pixels.

Colours belong to kinds, not to the order shapes are asked in: a 1g MIG pod, a whole GPU or a
vGPU share is the same colour in every picture, so pictures of two plans compare at a glance.
Shapes of one kind (vgpu:10Gi and vgpu:4Gi) share the colour and differ by hatching.

matplotlib is an optional dependency (`pip install 'dra-driver[plot]'`) and is imported only
here, through its object API (no pyplot, so no global figure state and no display backend).
"""

import re
from collections.abc import Sequence
from pathlib import Path

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from dra_driver.packing.layout import GpuLayout, Occupant
from dra_driver.packing.planner import GpuOutcome, ModePlan

GIB = 2**30
# Colour-blind safe (Okabe-Ito), one per kind: whole GPUs, vGPU shares, MIG by compute slices.
KIND_COLOURS = {
    "gpu": "#0072B2",
    "vgpu": "#009E73",
    "1g": "#E69F00",
    "2g": "#56B4E9",
    "3g": "#D55E00",
    "4g": "#CC79A7",
    "7g": "#F0E442",
}
# A MIG profile with a compute-slice count no GPU of the catalog had when this was written.
_OTHER_MIG = "#999933"
# Further shapes of a kind already drawn: the kind's colour with these hatches, in order.
_HATCHES = ("", "///", "...", "xxx", "\\\\\\", "++")
_FREE = "#eeeeee"
_OFFERED = "#bbbbbb"
_STRANDED = "#c0392b"
# Devices a live node's claims hold already: one colour for all of them.
_CLAIMED = "#666666"
CLAIMED = "allocated before"
STRANDED = "stranded"
_MIG_PROFILE = re.compile(r"([0-9]+)g\.")
# Points: what reads at 100 % zoom of a 150-dpi picture (5 and 6 did not).
_TICK_SIZE = 7
_LABEL_SIZE = 7
# Each kind of GPU's axis, said once per column under its lowest row.
MIG_AXIS = "memory slices"
BAR_AXIS = "memory, GiB (cores: the same width is 100 %)"


def kind_of(label: str) -> str:
    """The key of KIND_COLOURS a pod shape's text falls under ("" for a claim's label)."""
    if label == "gpu" or label.startswith("gpu:"):
        return "gpu"
    if label.startswith("vgpu:"):
        return "vgpu"
    if match := _MIG_PROFILE.match(label):
        return f"{match[1]}g"
    return ""


def colour_of(label: str) -> str:
    kind = kind_of(label)
    return KIND_COLOURS.get(kind, _OTHER_MIG) if kind else _CLAIMED


class Colours(dict[str, tuple[str, str]]):
    """The colour and hatch of each pod shape; any other label (a claim's) is allocated before."""

    def __missing__(self, label: str) -> tuple[str, str]:
        return colour_of(label), ""


def colours(labels: Sequence[str]) -> Colours:
    """Each shape in its kind's colour; the second shape of a kind and later ones hatched."""
    styles = Colours()
    seen: dict[str, int] = {}
    for label in dict.fromkeys(labels):
        kind = kind_of(label)
        number = seen.get(kind, 0)
        seen[kind] = number + 1
        styles[label] = (colour_of(label), _HATCHES[number % len(_HATCHES)])
    return styles


def _gib(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def _box(xy: tuple[float, float], width: float, height: float, style: tuple[str, str]) -> Rectangle:
    colour, hatch = style
    return Rectangle(xy, width, height, facecolor=colour, hatch=hatch, edgecolor="black", linewidth=0.6)


def _stranded(xy: tuple[float, float], width: float, height: float, gid: str) -> Rectangle:
    box = Rectangle(xy, width, height, facecolor="white", edgecolor=_STRANDED, hatch="xx", linewidth=0.6)
    box.set_gid(gid)
    return box


def _mig(axes: Axes, gpu: GpuOutcome, colour: Colours, gid: str) -> tuple[int, int]:
    layout = gpu.layout
    slices, compute = layout.memory_slices, layout.compute_slices or 1
    used = {
        index
        for block in layout.blocks
        if block.occupant
        for index in range(block.start, block.start + block.size)
    }
    stranded = 0
    for index in range(slices):
        if gpu.stranded_bytes and index not in used:
            axes.add_patch(_stranded((index, 0), 1, compute, f"stranded-{gid}-{stranded}"))
            stranded += 1
        else:
            axes.add_patch(Rectangle((index, 0), 1, compute, facecolor=_FREE, edgecolor="white"))
    drawn = 0
    for block in layout.blocks:
        occupant = block.occupant
        if occupant:
            rectangle = _box((block.start, 0), block.size, block.compute, colour[occupant.label])
            rectangle.set_gid(f"placement-{gid}-{drawn}")
            drawn += 1
        else:
            # An instance offered and free: outlined, so stranded hatching shows through it.
            rectangle = Rectangle(
                (block.start, 0),
                block.size,
                block.compute,
                facecolor=_OFFERED,
                edgecolor="black",
                linewidth=0.8,
                alpha=0.5 if gpu.stranded_bytes else 1.0,
            )
        axes.add_patch(rectangle)
        axes.text(
            block.start + block.size / 2,
            block.compute / 2,
            # A one-slice box has room for "1g" only.
            block.profile if block.size > 1 else block.profile.split(".")[0],
            ha="center",
            va="center",
            fontsize=_LABEL_SIZE,
        )
    axes.set_xlim(0, slices)
    axes.set_ylim(0, compute)
    axes.set_xticks(range(slices + 1))
    axes.set_yticks(range(compute + 1))
    axes.set_ylabel(f"GPU {layout.index}\ncompute slices", fontsize=_LABEL_SIZE)
    axes.tick_params(labelsize=_TICK_SIZE)
    return drawn, stranded


def _bars(axes: Axes, gpu: GpuOutcome, colour: Colours, gid: str) -> tuple[int, int]:
    """Memory on the upper bar in GiB, cores on the lower, 100 % as wide as the GPU's memory."""
    layout = gpu.layout
    total = layout.memory_bytes / GIB
    axes.add_patch(Rectangle((0, 1.1), total, 0.8, facecolor=_FREE))
    axes.add_patch(Rectangle((0, 0.1), total, 0.8, facecolor=_FREE))
    memory_at = cores_at = 0.0
    for number, occupant in enumerate(layout.occupants):
        width = min(occupant.memory_bytes / GIB, total - memory_at)
        box = _box((memory_at, 1.1), width, 0.8, colour[occupant.label])
        box.set_gid(f"placement-{gid}-{number}")
        axes.add_patch(box)
        if width >= total / 8:
            axes.text(memory_at + width / 2, 1.5, _gib(width), ha="center", va="center", fontsize=_LABEL_SIZE)
        memory_at += width
        cores = occupant.cores / 100 * total
        axes.add_patch(_box((cores_at, 0.1), cores, 0.8, colour[occupant.label]))
        cores_at += cores
    stranded = 0
    if gpu.stranded_bytes:
        axes.add_patch(_stranded((memory_at, 1.1), total - memory_at, 0.8, f"stranded-{gid}-0"))
        stranded = 1
    axes.set_xlim(0, total)
    axes.set_ylim(0, 2)
    axes.set_yticks([0.5, 1.5], ["cores", "memory"], fontsize=_TICK_SIZE)
    axes.set_xticks([0, total / 2, total], ["0", _gib(total / 2), _gib(total)], fontsize=_TICK_SIZE)
    axes.set_ylabel(f"GPU {layout.index}", fontsize=_LABEL_SIZE)
    return len(layout.occupants), stranded


def _occupants(layout: GpuLayout) -> list[Occupant]:
    return [*layout.occupants, *(block.occupant for block in layout.blocks if block.occupant)]


def column_title(plan: ModePlan, hidden: int = 0) -> str:
    """The mode, how many fit, the pods that did not (each shape with how many), and how many
    alike GPUs that hold nothing are not drawn."""
    refused = ", ".join(f"{o.refused}x{o.group.shape.text}" for o in plan.groups if o.refused)
    title = f"{plan.column}: {plan.placed} of {plan.asked} fit" + (f"\nrefused: {refused}" if refused else "")
    return title + (f"\n{hidden} more GPUs like these hold nothing (not drawn)" if hidden else "")


def _shape(gpu: GpuOutcome) -> tuple[object, ...]:
    layout = gpu.layout
    blocks = tuple((block.start, block.size, block.profile) for block in layout.blocks)
    return layout.product, layout.kind, layout.memory_bytes, layout.memory_slices, blocks


def drawn_gpus(plan: ModePlan) -> tuple[list[GpuOutcome], int]:
    """The GPUs a column draws, and how many it leaves out: of GPUs that hold nothing and are
    all alike (a node of eight H100s with two pods), one is drawn to show what is free; GPUs that
    differ are all drawn, since each shows something the others do not."""
    empty = [gpu for gpu in plan.gpus if not _occupants(gpu.layout) and not gpu.stranded_bytes]
    if len(empty) < 2 or len({_shape(gpu) for gpu in empty}) != 1:
        return list(plan.gpus), 0
    left_out = {id(gpu) for gpu in empty[1:]}
    return [gpu for gpu in plan.gpus if id(gpu) not in left_out], len(left_out)


def layout_figure(node: str, plans: Sequence[ModePlan]) -> Figure:
    labels = [outcome.group.shape.text for plan in plans for outcome in plan.groups]
    colour = colours(labels)
    columns = [drawn_gpus(plan) for plan in plans]
    rows = max((len(gpus) for gpus, _ in columns), default=1) or 1
    figure = Figure(figsize=(3.4 * len(plans), 1.2 * rows + 1.6), layout="constrained")
    grid = figure.subplots(rows, len(plans), squeeze=False)
    any_stranded = False
    for column, (plan, (gpus, hidden)) in enumerate(zip(plans, columns, strict=True)):
        grid[0][column].set_title(column_title(plan, hidden), fontsize=8)
        for row in range(rows):
            axes = grid[row][column]
            if row >= len(gpus):
                axes.set_axis_off()
                continue
            gpu = gpus[row]
            gid = f"{plan.mode}{'-' + plan.order if plan.order else ''}-gpu{gpu.layout.index}"
            _, stranded = (_mig if gpu.layout.kind == "mig" else _bars)(axes, gpu, colour, gid)
            any_stranded = any_stranded or bool(stranded)
        kinds = {gpu.layout.kind == "mig" for gpu in gpus}
        if gpus:
            note = " / ".join(
                label for is_mig, label in ((True, MIG_AXIS), (False, BAR_AXIS)) if is_mig in kinds
            )
            grid[len(gpus) - 1][column].set_xlabel(note, fontsize=_LABEL_SIZE, labelpad=1)
    if any(o.label not in colour for plan in plans for gpu in plan.gpus for o in _occupants(gpu.layout)):
        colour[CLAIMED] = (_CLAIMED, "")
    handles = [_box((0, 0), 1, 1, style) for style in colour.values()]
    names = list(colour)
    if any_stranded:
        handles.append(_stranded((0, 0), 1, 1, ""))
        names.append(STRANDED)
    figure.legend(handles, names, loc="outside lower center", ncols=min(6, len(names)) or 1, fontsize=7)
    figure.suptitle(node, fontsize=9)
    return figure


def placement_patches(figure: Figure, kind: str = "placement") -> list[Rectangle]:
    """The boxes that stand for allocations, or with `kind` "stranded" the stranded areas (what
    the tests count)."""
    return [
        patch
        for axes in figure.axes
        for patch in axes.patches
        if isinstance(patch, Rectangle) and (patch.get_gid() or "").startswith(f"{kind}-")
    ]


def save_layout(figure: Figure, path: Path, output: str) -> None:
    # A fixed hash salt and no date keep the SVG the same from run to run (a committed example
    # then changes only when the picture does); text as text, not glyph outlines, keeps it small.
    metadata = {"Date": None} if output == "svg" else {}
    with rc_context({"svg.hashsalt": "dra-driver-plan", "svg.fonttype": "none"}):
        figure.savefig(path, format=output, metadata=metadata, dpi=150)
