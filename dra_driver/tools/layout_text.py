"""The node's layout in the terminal: one row per GPU, for `inspect -o layout` and `plan -o layout`.

A MIG GPU is drawn as its memory slices, one column each, so a stranded slice shows where it
is; every other GPU as a bar of its memory (and, shared, of its cores), filled in the order
the allocations sit on it. Each allocation is marked with the letter of its label (a pod shape,
or "allocated"); the legend says which.
"""

from collections.abc import Iterable, Sequence
from string import ascii_lowercase

from dra_driver.packing.layout import GpuLayout, Occupant

BAR_COLUMNS = 40
CORE_COLUMNS = 20
FREE = "."
OFFERED = "-"


def markers(labels: Iterable[str]) -> dict[str, str]:
    """A letter per label, in first-seen order (after z: A-Z, then '#')."""
    letters = ascii_lowercase + ascii_lowercase.upper()
    found: dict[str, str] = {}
    for label in labels:
        if label not in found:
            found[label] = letters[len(found)] if len(found) < len(letters) else "#"
    return found


def _mig_cells(layout: GpuLayout, marks: dict[str, str]) -> list[str]:
    cells = [FREE] * layout.memory_slices
    for block in layout.blocks:
        mark = marks[block.occupant.label] if block.occupant else OFFERED
        for index in range(block.start, min(block.start + block.size, layout.memory_slices)):
            cells[index] = mark
    return cells


def _mig_picture(layout: GpuLayout, marks: dict[str, str]) -> str:
    """The slices separated by spaces, or by '|' where a MIG instance begins or ends."""
    cells = _mig_cells(layout, marks)
    edges = {edge for block in layout.blocks for edge in (block.start, block.start + block.size)}
    separators = ["|" if index in edges else " " for index in range(1, len(cells))]
    return (
        cells[0] + "".join(sep + cell for sep, cell in zip(separators, cells[1:], strict=True))
        if cells
        else ""
    )


def _bar(amounts: Sequence[tuple[str, int]], total: int, columns: int) -> str:
    """Columns filled left to right, each allocation by its share of `total` (at least one column)."""
    cells: list[str] = []
    for mark, amount in amounts:
        width = max(1, round(amount * columns / total)) if total else 0
        cells += [mark] * width
    return "".join(cells[:columns]).ljust(columns, FREE)


def _bars(layout: GpuLayout, marks: dict[str, str]) -> str:
    occupants: Sequence[Occupant] = layout.occupants
    memory = _bar([(marks[o.label], o.memory_bytes) for o in occupants], layout.memory_bytes, BAR_COLUMNS)
    text = f"memory [{memory}]"
    if layout.kind.startswith("vgpu"):
        cores = _bar([(marks[o.label], o.cores) for o in occupants], 100, CORE_COLUMNS)
        text += f" cores [{cores}]"
    return text


def _gib(value: int) -> str:
    return f"{value / 2**30:.1f}Gi"


def gpu_row(layout: GpuLayout, marks: dict[str, str]) -> str:
    picture = f"slices [{_mig_picture(layout, marks)}]" if layout.kind == "mig" else _bars(layout, marks)
    used = f"{_gib(layout.used_bytes)} of {_gib(layout.memory_bytes)} used"
    return f"GPU {layout.index:<2} {layout.kind:<15} {picture}  {used}"


def layout_text(layouts: Sequence[GpuLayout], labels: Iterable[str] = ()) -> str:
    """The legend, then one row per GPU. `labels` fixes the letters' order (pod shapes as asked)."""
    occupant_labels = [o.label for layout in layouts for o in layout.occupants]
    block_labels = [b.occupant.label for layout in layouts for b in layout.blocks if b.occupant]
    marks = markers([*labels, *block_labels, *occupant_labels])
    legend = [f"{mark} = {label}" for label, mark in marks.items()]
    legend += [f"{FREE} free", f"{OFFERED} MIG instance, free"]
    return "\n".join([f"legend: {', '.join(legend)}", *(gpu_row(layout, marks) for layout in layouts)]) + "\n"
