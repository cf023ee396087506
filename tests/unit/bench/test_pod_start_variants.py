"""The pod-start benchmark's variants swap what they say they swap: a variant whose plain form
silently did not take would measure the shipped code twice."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.pod_start.plain_forms import PIECES
from tests.bench.pod_start.pods import dra_series, mean_per_call
from tests.bench.pod_start.variants import VARIANTS, variants_named

REPOSITORY = Path(__file__).resolve().parents[3]

# For each piece: a module that imports it by name before the swap runs, and the name it uses.
_USERS = {
    "claim-locks": ("dra_driver.claims.engine", "ClaimLocks"),
    "http-client": ("dra_driver.kube.kube_api", "KeepAliveClient"),
    "call-lock": ("dra_driver.agent.claim_serving", "ClaimEngine"),
}


def test_every_piece_is_swapped_in_its_module_and_where_it_was_imported_before() -> None:
    assert set(_USERS) == set(PIECES)
    script = f"""
import importlib, json
users = {_USERS!r}
for module, _ in users.values():
    importlib.import_module(module)  # bound by `from ... import` before the swap
from tests.bench.pod_start import plain_forms
plain_forms.apply(list(users))
found = {{}}
for piece, (module, name) in users.items():
    home, home_name, _ = plain_forms.PIECES[piece]
    found[piece] = [
        getattr(importlib.import_module(module), name).__module__,
        getattr(importlib.import_module(home), home_name).__module__,
    ]
print(json.dumps(found))
"""
    completed = subprocess.run(
        [sys.executable, "-c", script], cwd=REPOSITORY, capture_output=True, text=True, check=True
    )
    found = json.loads(completed.stdout.splitlines()[-1])
    assert found == {piece: ["tests.bench.pod_start.plain_forms"] * 2 for piece in PIECES}


def test_an_overlay_adds_the_plain_forms_and_aiohttp_only_where_a_variant_asks(tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "dra_driver").mkdir(parents=True)
    (source / "dra_driver" / "__init__.py").write_text('__version__ = "0"\n')
    (source / "pyproject.toml").write_text('[project]\ndependencies = [\n  "msgspec",\n]\n')
    (aiohttp,) = variants_named(["aiohttp"])
    aiohttp.overlay(source)
    assert "_plain_forms.apply(['http-client'])" in (source / "dra_driver" / "__init__.py").read_text()
    assert '"aiohttp>=3.9,<4"' in (source / "pyproject.toml").read_text()
    assert (source / "dra_driver" / "_plain_forms.py").is_file()
    shipped = tmp_path / "shipped"
    (shipped / "dra_driver").mkdir(parents=True)
    VARIANTS[0].overlay(shipped)
    assert not (shipped / "dra_driver" / "_plain_forms.py").exists()


def test_an_unknown_variant_is_named() -> None:
    with pytest.raises(ValueError, match="--variants: unknown nope; expected some of shipped"):
        variants_named(["shipped", "nope"])


def test_kubelets_histograms_give_the_mean_call_of_our_driver_only() -> None:
    def metrics(ours: tuple[float, int], theirs: tuple[float, int]) -> str:
        method = 'method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"'
        series = "dra_grpc_operations_duration_seconds"
        return "\n".join(
            [
                "# HELP dra_grpc_operations_duration_seconds ...",
                f'{series}_sum{{driver_name="gpu.dra-driver.dev",{method}}} {ours[0]}',
                f'{series}_count{{driver_name="gpu.dra-driver.dev",{method}}} {ours[1]}',
                f'dra_grpc_operations_duration_seconds_sum{{driver_name="other",{method}}} {theirs[0]}',
                f'dra_grpc_operations_duration_seconds_count{{driver_name="other",{method}}} {theirs[1]}',
            ]
        )

    before = dra_series(metrics((0.010, 4), (1.0, 1)), "gpu.dra-driver.dev")
    after = dra_series(metrics((0.040, 10), (9.0, 2)), "gpu.dra-driver.dev")
    means = mean_per_call(before, after)
    assert json.loads(json.dumps(means)) == {
        next(iter(after)): {"calls": 6.0, "mean_ms": 5.0},
    }


def test_the_summary_pools_rounds_per_size_including_pods_started_together() -> None:
    from tests.bench.pod_start.__main__ import summary  # noqa: PLC0415

    prepare = 'dra_grpc_operations_duration_seconds{method_name=".../NodePrepareResources"}'

    def block(round_index: int, together: list[float]) -> dict[str, object]:
        return {
            "variant": "call-lock",
            "round": round_index,
            "claims_1": {"pod_start_s": [0.5], "kubelet_dra": {prepare: {"calls": 1, "mean_ms": 4.0}}},
            "together_4x1": {"pod_start_s": together, "kubelet_dra": {prepare: {"calls": 4, "mean_ms": 8.0}}},
        }

    found = summary([block(0, [0.6, 0.7, 0.8, 0.9]), block(1, [1.0, 1.1, 1.2, 1.3])])["call-lock"]
    assert found["claims_1"]["pods"] == 2
    assert found["together_4x1"]["pods"] == 8
    assert found["together_4x1"]["p50_ms"] == 950.0
    assert found["together_4x1"]["kubelet_prepare_call_mean_ms"] == 8.0
