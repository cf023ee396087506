"""The generated node config schema and the node config decoder agree on generated configs.

tests/api/test_chart_schema.py shows it through Helm for a table of hand-picked values; here
Hypothesis draws many more settings blocks from the decoder's vocabulary (and a few values just
outside it) and the JSON Schema validator must accept exactly those the decoder accepts. Left out,
because the schema does not express them: memory that is not a whole number of MiB (the schema's
pattern cannot count bytes) and MIG profile names outside the catalog (the decoder does not check
them yet: issue 33 item 1, another change).
"""

from typing import Any

from hypothesis import find, given, settings
from hypothesis import strategies as st
from jsonschema import Draft7Validator

from dra_driver.devices.extended_resources import catalog_mig_profiles
from dra_driver.devices.node_config import MODES, NodeConfigError
from dra_driver.devices.node_config_decode import parse_node_config
from dra_driver.tools.manifests.chart_schema import node_config_schema

VALIDATOR = Draft7Validator(node_config_schema())
MEMORY = st.sampled_from(["10Gi", "1536Mi", 1073741824, "1Gi", "-10Gi", -1048576, "ten", "010Gi", True, 0.5])
MAYBE = st.sampled_from([True, False])


def _block(draw: Any) -> dict[str, Any]:
    block: dict[str, Any] = {}
    if draw(MAYBE):
        block["mode"] = draw(st.sampled_from([*MODES, "warp"]))
    if draw(MAYBE):
        vgpu: dict[str, Any] = {}
        if draw(MAYBE):
            vgpu["memoryStep"] = draw(MEMORY)
        if draw(MAYBE):
            vgpu["partitions"] = [
                {
                    "memory": draw(MEMORY),
                    **({"cores": draw(st.sampled_from([1, 50, 100, 0, 101]))} if draw(MAYBE) else {}),
                }
                for _ in range(draw(st.integers(0, 2)))
            ]
        if draw(MAYBE):
            vgpu["enforcement"] = draw(st.sampled_from(["mps", "hami-core", "none", "cgroups"]))
        if vgpu:
            block["vgpu"] = vgpu
    if draw(MAYBE):
        block["mig"] = {"profiles": draw(st.lists(st.sampled_from(catalog_mig_profiles()), max_size=2))}
    if draw(MAYBE):
        block["packing"] = draw(st.sampled_from(["binpack", "spread", "tight"]))
    return block


@st.composite
def node_configs(draw: st.DrawFn) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if draw(MAYBE):
        config["default"] = _block(draw)
    if draw(MAYBE):
        selectors: list[dict[str, Any]] = [
            {"index": 0},
            {"uuid": "GPU-1"},
            {"model": "L4"},
            {"model": "H900"},
            {},
        ]
        selector = draw(st.sampled_from(selectors))
        config["gpus"] = [{**selector, **_block(draw)}]
    return config


def decoder_accepts(config: dict[str, Any]) -> bool:
    try:
        parse_node_config(config, "node config")
    except NodeConfigError:
        return False
    return True


@settings(max_examples=600, deadline=None)
@given(node_configs())
def test_the_schema_accepts_exactly_what_the_decoder_accepts(config: dict[str, Any]) -> None:
    errors = [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in VALIDATOR.iter_errors(config)
    ]

    assert (not errors) == decoder_accepts(config), errors


def test_a_schema_that_lost_a_rule_is_caught() -> None:
    """Guards the test above: without the rules between fields (vgpu only with a vGPU mode, ...)
    the drawn configs soon include one the decoder refuses and the schema accepts."""
    loose_schema = node_config_schema()
    del loose_schema["properties"]["default"]["allOf"]
    loose = Draft7Validator(loose_schema)

    found = find(node_configs(), lambda config: loose.is_valid(config) != decoder_accepts(config))

    assert loose.is_valid(found) and not decoder_accepts(found)
