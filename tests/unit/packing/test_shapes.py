"""`--pods` parses what operators write and names the item and field of every mistake."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.base.quantity import QUANTITY_FACTORS
from dra_driver.packing.shapes import (
    MAX_COUNT,
    MAX_GPUS_PER_POD,
    PodGroup,
    PodShape,
    ShapeError,
    parse_item,
    parse_pods,
)

SUFFIXES = ["Ki", "Mi", "Gi", "Ti", "k", "M", "G", "T"]
counts = st.integers(1, MAX_COUNT)
profiles = st.builds(
    lambda g, gb, extra: f"{g}g.{gb}gb{extra}",
    st.integers(1, 8),
    st.integers(1, 200),
    st.sampled_from(["", "+me", "-me", "+gfx"]),
)


@given(counts, profiles)
def test_a_mig_item_gives_its_count_and_profile(count: int, profile: str) -> None:
    group = parse_item(f"{count}x{profile}", 3)

    assert (group.count, group.shape.kind, group.shape.profile, group.position) == (count, "mig", profile, 3)
    assert group.item == f"{count}x{profile}"


@given(st.integers(1, 10**6), st.sampled_from(SUFFIXES), st.none() | st.integers(1, 100))
def test_a_vgpu_item_gives_its_memory_in_bytes_and_its_cores(
    digits: int, suffix: str, cores: int | None
) -> None:
    kind = f"vgpu:{digits}{suffix}" + ("" if cores is None else f"/{cores}%")

    group = parse_item(kind, 0)

    assert group.count == 1
    assert group.shape.kind == "vgpu"
    assert group.shape.memory_bytes == digits * QUANTITY_FACTORS[suffix]
    assert group.shape.cores == cores
    assert group.shape.text == kind


def test_a_gpu_item_asks_for_its_number_of_whole_gpus_in_one_request() -> None:
    eights, one, plain = parse_pods("3xgpu:8,gpu:1,gpu")

    assert (eights.count, eights.shape, eights.item) == (3, PodShape("gpu", "gpu:8", devices=8), "3xgpu:8")
    # gpu:1 keeps its text but asks what gpu asks: one device.
    assert (one.shape.kind, one.shape.text, one.shape.devices) == ("gpu", "gpu:1", 1)
    assert (plain.shape.kind, plain.shape.text, plain.shape.devices) == ("gpu", "gpu", 1)
    assert MAX_GPUS_PER_POD == 8
    assert [parse_item(f"gpu:{n}", 0).shape.devices for n in range(1, 9)] == list(range(1, 9))


@given(
    st.lists(
        st.sampled_from(
            ["gpu", "2xgpu", "gpu:4", "2xgpu:8", "1g.10gb", "7x3g.40gb", "vgpu:1Gi", "3xvgpu:5Gi/25%"]
        ),
        min_size=1,
    )
)
def test_a_list_keeps_the_items_in_order_with_their_positions(items: list[str]) -> None:
    groups = parse_pods(" , ".join(items))

    assert [group.position for group in groups] == list(range(len(items)))
    assert [group.item for group in groups] == [
        item if "x" in item.split(":")[0] else f"1x{item}" for item in items
    ]


def message(text: str) -> str:
    with pytest.raises(ShapeError) as raised:
        parse_pods(text)
    assert "\n" not in str(raised.value)
    return str(raised.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "1x1g.10gb,4xvgpu:10Qi/30%",
            '--pods[1] "4xvgpu:10Qi/30%": memory "10Qi": expected a quantity like 10Gi',
        ),
        ("vgpu:0Gi", '--pods[0] "vgpu:0Gi": memory "0Gi": expected a quantity like 10Gi, more than zero'),
        ("vgpu:1.5Gi", '--pods[0] "vgpu:1.5Gi": memory "1.5Gi"'),
        ("vgpu:10Gi/130%", '--pods[0] "vgpu:10Gi/130%": cores "130%": expected a percentage from 1% to 100%'),
        ("vgpu:10Gi/30", '--pods[0] "vgpu:10Gi/30": cores "30": expected a percentage'),
        ("gpu,0xgpu", '--pods[1] "0xgpu": count "0": expected a whole number from 1 to 100000'),
        ("007xgpu", '--pods[0] "007xgpu": count "007"'),
        (f"{MAX_COUNT + 1}xgpu", f'count "{MAX_COUNT + 1}"'),
        (
            "2xtpu",
            '--pods[0] "2xtpu": kind "tpu": expected gpu or gpu:<GPUs 1 to 8>, a MIG profile such as 1g.10gb',
        ),
        ("gpu:9", '--pods[0] "gpu:9": gpus "9": expected a whole number of GPUs from 1 to 8'),
        ("gpu,2xgpu:0", '--pods[1] "2xgpu:0": gpus "0": expected a whole number of GPUs from 1 to 8'),
        ("gpu:08", '--pods[0] "gpu:08": gpus "08": expected a whole number of GPUs'),
        ("gpu:eight", '--pods[0] "gpu:eight": gpus "eight": expected a whole number of GPUs'),
        ("gpu:", '--pods[0] "gpu:": gpus "": expected a whole number of GPUs'),
        ("gpu:+8", 'gpus "+8"'),
        ("gpu:\u0668", 'gpus "\u0668"'),
        ("gpu:80", 'gpus "80"'),
        ("gpu:100000000000000000000", 'gpus "100000000000000000000"'),
        ("2x1g.10GB", 'kind "1g.10GB"'),
        ("gpu,,gpu", '--pods[1] "": expected [<count>x]<kind>'),
        ("3x", '--pods[0] "3x": expected [<count>x]<kind>'),
        ("  ", "--pods: expected at least one pod shape"),
    ],
)
def test_a_bad_item_is_named_with_its_field_and_what_was_expected(text: str, expected: str) -> None:
    assert expected in message(text)


@given(st.text(max_size=30))
def test_any_text_parses_or_raises_a_shape_error(text: str) -> None:
    try:
        groups = parse_pods(text)
    except ShapeError as error:
        assert str(error).startswith("--pods")
    else:
        assert all(isinstance(group, PodGroup) and 1 <= group.count <= MAX_COUNT for group in groups)
        assert all(1 <= group.shape.devices <= MAX_GPUS_PER_POD for group in groups)
        assert all(group.shape.devices == 1 for group in groups if group.shape.kind != "gpu")
