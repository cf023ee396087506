"""Pod start latency on the real local cluster, for the agent as it ships and for variants with
one hand-built hot-path piece swapped for its plain form (issue 50, part 6; docs/benchmarks.md,
"Pod start on the real cluster").

    python -m tests.bench.pod_start --pods 10 --rounds 2 --output docs/bench/pod-start.json

As root: brings the local cluster up as `make cluster` does (tests/cluster, Kubernetes 1.37 by
default), then for each round and each variant (the order reversed every other round, so a slow
stretch of the machine falls on all of them) builds the variant's agent image, rolls it out with
the chart, starts one pod of each size unrecorded, and then `--pods` pods of one whole GPU and as
many of eight dynamic-MIG 1g.10gb claims, one at a time, each timed from its create request to
Running and deleted, its claims waited out, before the next. `--together N` then starts pods
together, N times per variant and round: four 1-GPU pods at once, and three pods of four MIG
claims at once (the e2e node's five whole GPUs and fourteen 1g.10gb placements), each pod timed
on its own: what the locks' shapes decide when kubelet prepares several pods' claims at a time.
Kubelet's own DRA histograms (its NodePrepareResources gRPC calls to the driver) are read before
and after each size. The cluster is
taken down at the end unless `--keep`.
"""

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from tests.bench.pod_start.pods import MIG_1G, WHOLE_GPU, Cluster, mean_per_call, refused_start
from tests.bench.pod_start.variants import VARIANTS, Variant, variants_named
from tests.cluster import agent_image, driver, node
from tests.cluster.build import build_all
from tests.cluster.layout import Layout
from tests.cluster.teardown import tear_down
from tests.cluster.up import kubectl_argv, up
from tests.cluster.versions import KubernetesVersion, kubernetes_version

SIZES = ((1, WHOLE_GPU), (8, MIG_1G))
# Pods started together: (pods at once, claims each, template).
TOGETHER = ((4, 1, WHOLE_GPU), (3, 4, MIG_1G))
# Where --busy-disk writes: the file system of the agent's state directory (/var/lib, hostPath).
BUSY_DIRECTORY = Path("/var/tmp/pod-start-busy")
_BUSY_CHUNK = 4 * 2**20
_BUSY_FILE_BYTES = 256 * 2**20


@contextlib.contextmanager
def busy_disk(mib_per_second: float) -> Iterator[None]:
    """Another writer on the state directory's file system, as an image pull or a container's
    logs are on a node: `mib_per_second` of data written and never flushed, the file replaced
    every 256 MiB. A flush of the whole file system (the syncfs of the group commit that flushed
    records until issue 50 part 6) paid for its dirty pages too."""
    if not mib_per_second:
        yield
        return
    stop = threading.Event()

    def write() -> None:
        BUSY_DIRECTORY.mkdir(parents=True, exist_ok=True)
        target, chunk, written = BUSY_DIRECTORY / "data", os.urandom(_BUSY_CHUNK), 0
        stream = target.open("wb")
        while not stop.wait(_BUSY_CHUNK / (mib_per_second * 2**20)):
            stream.write(chunk)
            written += _BUSY_CHUNK
            if written >= _BUSY_FILE_BYTES:
                stream.close()
                target.unlink()
                stream, written = target.open("wb"), 0
        stream.close()
        shutil.rmtree(BUSY_DIRECTORY, ignore_errors=True)

    writer = threading.Thread(target=write, name="busy-disk", daemon=True)
    writer.start()
    try:
        yield
    finally:
        stop.set()
        writer.join()


def say(message: str) -> None:
    print(f"pod start: {message}", file=sys.stderr, flush=True)


def deploy(variant: Variant, layout: Layout, version: KubernetesVersion) -> str:
    """Rolls the variant's agent out; returns its image."""
    binaries = build_all(version)
    tar, image = agent_image.build_agent_image(variant.overlay, flavour=f"bench-{variant.name}")
    node.import_images(layout, binaries, [tar])
    values = driver.local_values(image, layout, version)
    values["flushRecords"] = variant.flush_records
    driver.install_chart(layout.kubeconfig("admin"), values)
    kubectl = kubectl_argv(layout, binaries)
    driver.wait_for_rollout(kubectl)
    driver.wait_for_slices(kubectl)
    return image


def _figures(
    cluster: Cluster, seconds: list[float], before: dict[str, tuple[float, float]]
) -> dict[str, Any]:
    """The pods' start times, and kubelet's DRA calls since `before`."""
    after = cluster.kubelet_dra_seconds(DEFAULT_DRIVER_NAME)
    return {
        "pod_start_s": [round(value, 4) for value in seconds],
        "kubelet_dra": mean_per_call(before, after),
    }


def _p50_ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1000


def measure_together(cluster: Cluster, name: str, bursts: int) -> dict[str, Any]:
    """Each burst's pods created at once (one thread each) and timed on their own, then deleted
    together and waited out."""
    found: dict[str, Any] = {}
    for count, claims, template in TOGETHER:
        before = cluster.kubelet_dra_seconds(DEFAULT_DRIVER_NAME)
        seconds: list[float] = []
        with ThreadPoolExecutor(max_workers=count) as pool:
            for burst in range(bursts):
                names = [f"{name}-t{count}x{claims}-{burst}-{index}" for index in range(count)]
                seconds.extend(pool.map(cluster.start_pod, names, [template] * count, [claims] * count))
                list(pool.map(cluster.stop_pod, names))
        found[f"together_{count}x{claims}"] = _figures(cluster, seconds, before)
        say(f"{name}: {count} pods of {claims} claim(s) together: p50 {_p50_ms(seconds):.0f} ms")
    return found


def measure(cluster: Cluster, variant: Variant, round_index: int, pods: int, together: int) -> dict[str, Any]:
    block: dict[str, Any] = {"variant": variant.name, "round": round_index}
    for claims, template in SIZES:
        name = f"{variant.name}-r{round_index}-{claims}"
        # Unrecorded: the first pod after a rollout also waits for kubelet to find the new plugin.
        cluster.start_pod(f"{name}-warm", template, claims)
        cluster.stop_pod(f"{name}-warm")
        before = cluster.kubelet_dra_seconds(DEFAULT_DRIVER_NAME)
        seconds = []
        for index in range(pods):
            seconds.append(cluster.start_pod(f"{name}-{index}", template, claims))
            cluster.stop_pod(f"{name}-{index}")
        block[f"claims_{claims}"] = _figures(cluster, seconds, before)
        say(f"{variant.name} round {round_index}, {claims} claim(s): p50 {_p50_ms(seconds):.0f} ms")
    if together:
        block.update(measure_together(cluster, f"{variant.name}-r{round_index}", together))
    return block


def summary(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """Per variant and size, every round's pods pooled: p50, p90 and mean; and kubelet's mean
    NodePrepareResources call."""
    result: dict[str, Any] = {}
    for block in blocks:
        for size in (key for key in block if key.startswith(("claims_", "together_"))):
            entry = result.setdefault(block["variant"], {}).setdefault(
                size, {"pod_start_s": [], "prepare_ms": []}
            )
            part = block[size]
            entry["pod_start_s"].extend(part["pod_start_s"])
            entry["prepare_ms"].extend(
                value["mean_ms"]
                for key, value in part["kubelet_dra"].items()
                if "NodePrepareResources" in key
            )
    for sizes in result.values():
        for entry in sizes.values():
            seconds = sorted(entry.pop("pod_start_s"))
            prepare = entry.pop("prepare_ms")
            entry.update(
                pods=len(seconds),
                p50_ms=round(statistics.median(seconds) * 1000, 1),
                p90_ms=round(seconds[int(0.9 * (len(seconds) - 1))] * 1000, 1),
                mean_ms=round(statistics.fmean(seconds) * 1000, 1),
                kubelet_prepare_call_mean_ms=round(statistics.fmean(prepare), 3) if prepare else None,
            )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.pod_start", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--pods", type=int, default=10, help="recorded pods per size, variant and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", default=",".join(variant.name for variant in VARIANTS))
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--keep", action="store_true", help="leave the cluster up at the end")
    parser.add_argument(
        "--together", type=int, default=0, metavar="N", help="N bursts of pods started together (0: none)"
    )
    parser.add_argument(
        "--busy-disk", type=float, default=0.0, metavar="MIB_PER_S", help="another writer on the state's disk"
    )
    args = parser.parse_args(argv)
    try:
        variants = variants_named(args.variants.split(","))
    except ValueError as error:
        print(f"pod start: {error}", file=sys.stderr)
        return 2
    if args.busy_disk < 0:
        print(f"pod start: --busy-disk: expected 0 or more MiB/s, got {args.busy_disk}", file=sys.stderr)
        return 2
    if args.together < 0:
        print(f"pod start: --together: expected 0 or more bursts, got {args.together}", file=sys.stderr)
        return 2
    if (refused := refused_start("pod start", args.pods, args.rounds)) is not None:
        return refused
    layout, version = Layout.from_environment(), kubernetes_version()
    started = time.monotonic()
    up(layout, version)
    cluster = Cluster(str(layout.kubeconfig("admin")))
    cluster.set_up()
    blocks: list[dict[str, Any]] = []
    try:
        with busy_disk(args.busy_disk):
            for round_index in range(args.rounds):
                for variant in variants if round_index % 2 == 0 else list(reversed(variants)):
                    image = deploy(variant, layout, version)
                    say(f"{variant.name} ({variant.what}) rolled out: {image}")
                    blocks.append(measure(cluster, variant, round_index, args.pods, args.together))
                    report = {
                        "kubernetes": version.release,
                        "pods_per_size_per_round": args.pods,
                        "together_bursts_per_round": args.together,
                        "busy_disk_mib_per_s": args.busy_disk,
                        "variants": {variant.name: variant.what for variant in variants},
                        "summary": summary(blocks),
                        "blocks": blocks,
                        "elapsed_s": round(time.monotonic() - started),
                    }
                    args.output.write_text(json.dumps(report, indent=1) + "\n")
    finally:
        if not args.keep:
            tear_down(layout)
    say(f"done in {time.monotonic() - started:.0f}s: {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
