"""The utilisation pictures: per order, the memory and compute the real scheduler had allocated
over the trace's time, one line per fleet, drawn as `plan` draws (matplotlib's object API, 7 pt
text, the Okabe-Ito colours, the same reproducible SVG), and the headline table as Markdown.

    python -m tests.bench.cluster_scale.pictures docs/bench/cluster-utilization.json
"""

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from dra_driver.tools.layout_drawing import save_layout

FLEET_COLOURS = {
    "whole": "#0072B2",
    "mig-dynamic": "#E69F00",
    "vgpu-capacity": "#009E73",
    "vgpu-partitions": "#56B4E9",
    "mixed": "#CC79A7",
}
_TEXT = 7
HOURS = 3600.0


def draw(rows: Sequence[Mapping[str, Any]], order: str, trace: str) -> Figure:
    figure = Figure(figsize=(6.8, 4.0), layout="constrained")
    memory, compute = figure.subplots(2, 1, sharex=True)
    for row in rows:
        if row["order"] != order or row["trace"] != trace:
            continue
        hours = [point[0] / HOURS for point in row["series"]]
        colour = FLEET_COLOURS.get(row["mode"], "#999933")
        label = f"{row['mode']}: {row['placed']} placed, {row['refused']} refused"
        memory.plot(
            hours, [100 * point[1] for point in row["series"]], color=colour, linewidth=1.2, label=label
        )
        compute.plot(hours, [100 * point[2] for point in row["series"]], color=colour, linewidth=1.2)
    for axes, what in ((memory, "GPU memory allocated, %"), (compute, "compute allocated, %")):
        axes.set_ylim(0, 100)
        axes.set_ylabel(what, fontsize=_TEXT)
        axes.tick_params(labelsize=_TEXT)
        axes.grid(True, linewidth=0.3)
    compute.set_xlabel("hours into the trace", fontsize=_TEXT)
    memory.legend(fontsize=_TEXT, loc="lower right")
    figure.suptitle(f"{trace}, {order} order: the real kube-scheduler over kwok nodes", fontsize=9)
    return figure


def headline(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The Markdown table: per trace, fleet and order, placed and refused through the scheduler
    and in the model, allocated and stranded means, and more pods than whole GPUs."""
    whole = {(row["trace"], row["order"]): row for row in rows if row["mode"] == "whole"}
    lines = [
        "| fleet | order | placed | refused | model placed/refused | vs whole GPUs | memory allocated "
        "| compute allocated | free memory on used GPUs | nodes free for 8-GPU jobs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        base = whole.get((row["trace"], row["order"]))
        more = f"{row['placed'] / base['placed']:.2f}x" if base and base["placed"] else "-"
        lines.append(
            f"| {row['mode']} | {row['order']} | {row['placed']} | {row['refused']} "
            f"| {row['model_placed']}/{row['model_refused']} | {more} "
            f"| {row['memory_allocated_mean']:.1%} | {row['compute_allocated_mean']:.1%} "
            f"| {row['fragment_memory_mean']:.1%} | {row['free_8gpu_nodes_mean']:.1f} |"
        )
    return lines


def write_pictures(results: Mapping[str, Any], directory: Path) -> list[Path]:
    rows = results["rows"]
    written = []
    for trace in dict.fromkeys(row["trace"] for row in rows):
        for order in dict.fromkeys(row["order"] for row in rows):
            path = directory / f"cluster-utilization-{order}.svg"
            save_layout(draw(rows, order, trace), path, "svg")
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tests.bench.cluster_scale.pictures RESULTS.json", file=sys.stderr)
        return 2
    path = Path(args[0])
    results = json.loads(path.read_text())
    for written in write_pictures(results, path.parent):
        print(f"wrote {written}")
    print("\n".join(headline(results["rows"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
