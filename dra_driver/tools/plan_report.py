"""`dra-driver plan`'s answer as a table for people and as JSON for scripts.

Both say the same: per mode, how many pods of each shape fit, on which GPUs, why the first one
that did not fit was refused, and per GPU the memory used, free and stranded.
"""

import json
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from dra_driver.packing.planner import GroupOutcome, ModePlan
from dra_driver.packing.shapes import PodGroup
from dra_driver.tools.layout_text import layout_text

GIB = 2**30


def _gib(value: int) -> str:
    return f"{value / GIB:.1f}Gi"


def _aligned(rows: list[tuple[str, ...]]) -> Iterator[str]:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        yield "  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()


def _where(outcome: GroupOutcome) -> str:
    # A pod of several GPUs (gpu:8) counts on each GPU it holds.
    per_gpu = Counter(gpu for pod in outcome.placed for gpu in pod.gpus)
    return ", ".join(f"GPU {gpu}: {count}" for gpu, count in sorted(per_gpu.items()))


def _mode_lines(plan: ModePlan, layout: bool) -> list[str]:
    lines = [
        f"mode {plan.mode}: {plan.placed} of {plan.asked} pods fit; {_gib(plan.used_bytes)} of "
        f"{_gib(plan.memory_bytes)} GPU memory allocated, {_gib(plan.stranded_bytes)} stranded"
    ]
    lines += [f"  note: {note}" for note in plan.notes]
    lines += _aligned(
        [
            ("PODS", "FIT", "WHERE", "FIRST REFUSED BECAUSE"),
            *((o.group.item, str(len(o.placed)), _where(o), o.refusal) for o in plan.groups),
        ]
    )
    shapes_on: dict[int, Counter[str]] = {}
    for outcome in plan.groups:
        for pod in outcome.placed:
            for gpu in pod.gpus:
                shapes_on.setdefault(gpu, Counter())[pod.shape] += 1
    lines += _aligned(
        [
            ("GPU", "OFFERED AS", "USED", "FREE", "STRANDED", "PODS"),
            *(
                (
                    str(gpu.layout.index),
                    gpu.layout.kind,
                    _gib(gpu.layout.used_bytes),
                    _gib(gpu.layout.free_bytes),
                    _gib(gpu.stranded_bytes),
                    ", ".join(f"{n}x{s}" for s, n in shapes_on.get(gpu.layout.index, Counter()).items()),
                )
                for gpu in plan.gpus
            ),
        ]
    )
    if layout:
        labels = [outcome.group.shape.text for outcome in plan.groups]
        lines += ["  " + line for line in layout_text([g.layout for g in plan.gpus], labels).splitlines()]
    return lines


def _pods(count: int) -> str:
    return "1 pod" if count == 1 else f"{count} pods"


def plan_table(node: str, groups: Sequence[PodGroup], plans: Sequence[ModePlan], layout: bool = False) -> str:
    lines = [
        f"node: {node}",
        f"pods: {', '.join(g.item for g in groups)} ({_pods(sum(g.count for g in groups))})",
    ]
    for plan in plans:
        lines += ["", *_mode_lines(plan, layout)]
    return "\n".join(lines) + "\n"


def plan_document(node: str, groups: Sequence[PodGroup], plans: Sequence[ModePlan]) -> dict[str, Any]:
    return {
        "node": node,
        "pods": [
            {
                "item": g.item,
                "count": g.count,
                "shape": g.shape.text,
                "kind": g.shape.kind,
                "devices": g.shape.devices,
            }
            for g in groups
        ],
        "modes": [
            {
                "mode": plan.mode,
                "asked": plan.asked,
                "fit": plan.placed,
                "memoryBytes": plan.memory_bytes,
                "usedBytes": plan.used_bytes,
                "strandedBytes": plan.stranded_bytes,
                "notes": list(plan.notes),
                "groups": [
                    {
                        "item": outcome.group.item,
                        "asked": outcome.group.count,
                        "fit": len(outcome.placed),
                        "refused": outcome.refused,
                        "refusal": outcome.refusal,
                        "placements": [
                            {
                                "pod": pod.number,
                                "device": pod.device,
                                "gpu": pod.gpu,
                                # Every device and GPU: several for a gpu:N pod; device, gpu: the first.
                                "devices": list(pod.devices),
                                "gpus": list(pod.gpus),
                                "memoryBytes": pod.memory_bytes,
                                "cores": pod.cores,
                            }
                            for pod in outcome.placed
                        ],
                    }
                    for outcome in plan.groups
                ],
                "gpus": [
                    {
                        "index": gpu.layout.index,
                        "uuid": gpu.layout.uuid,
                        "product": gpu.layout.product,
                        "offeredAs": gpu.layout.kind,
                        "memoryBytes": gpu.layout.memory_bytes,
                        "usedBytes": gpu.layout.used_bytes,
                        "freeBytes": gpu.layout.free_bytes,
                        "strandedBytes": gpu.stranded_bytes,
                    }
                    for gpu in plan.gpus
                ],
            }
            for plan in plans
        ],
    }


def plan_json(node: str, groups: Sequence[PodGroup], plans: Sequence[ModePlan]) -> str:
    return json.dumps(plan_document(node, groups, plans), indent=2) + "\n"
