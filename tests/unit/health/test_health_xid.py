"""XID classes: the defaults, the operator's policy and its errors, and the taint effect of each class."""

import pytest
import yaml

from dra_driver.health.xid import (
    DEFAULT_XID_POLICY,
    XID_DESCRIPTIONS,
    XidClass,
    XidPolicy,
    XidPolicyError,
    parse_xid_policy,
    taint_effect,
)


@pytest.mark.parametrize(
    ("xid", "xid_class"),
    [
        (13, XidClass.IGNORED),
        (31, XidClass.IGNORED),
        (43, XidClass.IGNORED),
        (45, XidClass.IGNORED),
        (68, XidClass.IGNORED),
        (63, XidClass.INFORMATIONAL),
        (94, XidClass.INFORMATIONAL),
        (64, XidClass.DEGRADED),
        (74, XidClass.DEGRADED),
        (92, XidClass.DEGRADED),
        (46, XidClass.FATAL),
        (48, XidClass.FATAL),
        (62, XidClass.FATAL),
        (79, XidClass.FATAL),
        (95, XidClass.FATAL),
        (119, XidClass.FATAL),
        (120, XidClass.FATAL),
        (140, XidClass.FATAL),
    ],
)
def test_the_default_classes(xid: int, xid_class: XidClass) -> None:
    assert DEFAULT_XID_POLICY.classify(xid) is xid_class
    assert xid in XID_DESCRIPTIONS


@pytest.mark.parametrize("xid", [1, 109, 154, 999, 2**40])
def test_an_xid_without_a_class_is_degraded(xid: int) -> None:
    assert DEFAULT_XID_POLICY.classify(xid) is XidClass.DEGRADED


def test_classes_are_ordered_by_severity() -> None:
    assert max(XidClass.INFORMATIONAL, XidClass.FATAL, XidClass.DEGRADED) is XidClass.FATAL
    assert [xid_class.label for xid_class in sorted(XidClass)] == [
        "ignored",
        "informational",
        "degraded",
        "fatal",
    ]


def test_no_policy_is_the_default_policy() -> None:
    assert parse_xid_policy(None) == DEFAULT_XID_POLICY
    assert parse_xid_policy({}) == DEFAULT_XID_POLICY


def test_listed_xids_move_to_their_class_and_the_others_keep_theirs() -> None:
    raw = yaml.safe_load("""
        ignored: [109]
        fatal: [92, 200]
        informational: [48]
    """)
    policy = parse_xid_policy(raw)

    assert policy.classify(109) is XidClass.IGNORED
    assert policy.classify(92) is XidClass.FATAL
    assert policy.classify(200) is XidClass.FATAL
    assert policy.classify(48) is XidClass.INFORMATIONAL
    assert policy.classify(95) is XidClass.FATAL
    assert policy.classify(13) is XidClass.IGNORED
    assert policy.classify(201) is XidClass.DEGRADED
    assert 48 not in policy.fatal
    assert 92 not in policy.degraded


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            [48],
            r"^XID policy: expected an object with fields "
            r"ignored, informational, degraded, fatal, got a list$",
        ),
        ({"fatl": [48]}, r"^XID policy\.fatl: unknown field \(allowed here: ignored, "),
        (
            {"fatal": 48},
            r"^XID policy\.fatal: expected a list of XID numbers such as \[48, 79\], got the integer 48$",
        ),
        (
            {"fatal": [48, "79"]},
            r'^XID policy\.fatal\[1\]: expected an XID number \(an integer ≥ 1\), got the string "79"$',
        ),
        ({"ignored": [True]}, r"^XID policy\.ignored\[0\]: expected an XID number .*, got true$"),
        ({"degraded": [0]}, r"^XID policy\.degraded\[0\]: expected an XID number .*, got the integer 0$"),
        ({"degraded": [4.5]}, r"^XID policy\.degraded\[0\]: .*, got the number 4\.5$"),
        ({"degraded": None}, r"^XID policy\.degraded: expected a list"),
        (
            {"degraded": [48], "fatal": [48]},
            r"^XID policy\.fatal: XID 48 is already listed under degraded; each XID has one class$",
        ),
        ({"fatal": [79, 79]}, r"^XID policy\.fatal: XID 79 is already listed under fatal"),
    ],
)
def test_a_malformed_policy_is_refused_naming_the_field(raw: object, message: str) -> None:
    with pytest.raises(XidPolicyError, match=message):
        parse_xid_policy(raw)


def test_errors_name_where_the_policy_came_from() -> None:
    with pytest.raises(XidPolicyError, match=r"^node config /etc/dra\.yaml xids\.fatal\[0\]: "):
        parse_xid_policy({"fatal": ["x"]}, "node config /etc/dra.yaml xids")


def test_a_policy_cannot_put_one_xid_in_two_classes() -> None:
    with pytest.raises(ValueError, match=r"XIDs \[48\] are both degraded and fatal"):
        XidPolicy(degraded=frozenset({48, 92}), fatal=frozenset({48}))


@pytest.mark.parametrize(
    ("xid_class", "on_134", "on_135"),
    [
        (XidClass.IGNORED, None, None),
        (XidClass.INFORMATIONAL, None, "None"),
        (XidClass.DEGRADED, "NoSchedule", "NoSchedule"),
        (XidClass.FATAL, "NoExecute", "NoExecute"),
    ],
)
def test_each_class_has_its_taint_effect_where_the_api_has_it(
    xid_class: XidClass, on_134: str | None, on_135: str | None
) -> None:
    assert taint_effect(xid_class, "1.34") == on_134
    assert taint_effect(xid_class, "1.35") == on_135
