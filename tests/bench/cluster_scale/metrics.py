"""Prometheus figures of the control plane, read over HTTPS with the admin's certificate:
counters and histograms diffed between two scrapes, histogram quantiles as Prometheus'
histogram_quantile computes them (linear within the bucket)."""

import asyncio
import ssl
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.layout import SCHEDULER_PORT

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
SCHEDULER_METRICS = f"https://127.0.0.1:{SCHEDULER_PORT}/metrics"


def _context(pki: Path, verify: bool) -> ssl.SSLContext:
    context = (
        ssl.create_default_context(cafile=str(pki / "ca.crt"))
        if verify
        else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    )
    if not verify:
        # The scheduler serves a certificate it made itself at start; it is on loopback.
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return context


def _scrape(url: str, pki: Path, verify: bool) -> Samples:
    with urllib.request.urlopen(url, context=_context(pki, verify), timeout=30) as answer:
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def scrape(url: str, pki: Path, verify: bool = False) -> Samples:
    return await asyncio.to_thread(_scrape, url, pki, verify)


def delta(after: Samples, before: Samples) -> Samples:
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(
        value
        for (sample, sample_labels), value in samples.items()
        if sample == name and all(dict(sample_labels).get(k) == v for k, v in labels.items())
    )


def quantile(samples: Samples, histogram: str, share: float, **labels: str) -> float | None:
    """The `share` quantile of a histogram's observations in `samples` (None: none observed)."""
    buckets: dict[float, float] = {}
    for (sample, sample_labels), value in samples.items():
        found: Mapping[str, str] = dict(sample_labels)
        if sample != f"{histogram}_bucket" or any(found.get(k) != v for k, v in labels.items()):
            continue
        bound = float(found["le"])
        buckets[bound] = buckets.get(bound, 0.0) + value
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = share * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        if buckets[bound] >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(buckets[bound] - below, 1e-12)
        lower, below = bound, buckets[bound]
    return lower
