import re
import uuid

from hypothesis import given
from hypothesis import strategies as st

from dra_driver.kube.k8s_names import (
    dns_label_problem,
    dns_subdomain_problem,
    driver_name_problem,
    shown,
    uid_problem,
)

label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)


@given(label)
def test_every_dns_label_is_accepted(value: str) -> None:
    assert dns_label_problem(value) is None
    assert dns_subdomain_problem(value) is None


@given(st.lists(label, min_size=1, max_size=4))
def test_dotted_labels_are_subdomains(labels: list[str]) -> None:
    value = ".".join(labels)
    assert dns_subdomain_problem(value) is None
    assert (driver_name_problem(value) is None) == (len(value) <= 63)


@given(st.text(max_size=80))
def test_anything_else_is_refused_with_a_reason(value: str) -> None:
    is_label = re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", value) is not None and len(value) <= 63
    problem = dns_label_problem(value)
    assert (problem is None) == is_label
    if problem:
        assert shown(value) in problem


def test_lengths_are_limited() -> None:
    assert dns_label_problem("a" * 63) is None
    assert dns_label_problem("a" * 64) == f"{shown('a' * 64)} is longer than 63 characters"
    assert dns_subdomain_problem(".".join(["a" * 63] * 3 + ["a" * 61])) is None  # 253 characters
    assert dns_subdomain_problem("a" * 254) is not None


@given(st.uuids())
def test_uuids_are_uids(value: uuid.UUID) -> None:
    assert uid_problem(str(value)) is None
    assert uid_problem(str(value).upper()) is not None or str(value) == str(value).upper()


def test_path_like_uids_are_refused() -> None:
    for value in ("../x", "a/b", "", ".", "3f9c1e52-7a4b-4d2e-9b61-0c8d5e2f4a17/..", "3f9c1e52 7a4b"):
        assert uid_problem(value) is not None


def test_long_values_are_cut_short_in_messages() -> None:
    message = dns_label_problem("x" * 10_000)
    assert message is not None
    assert len(message) < 200
    assert "(10000 characters)" in message
