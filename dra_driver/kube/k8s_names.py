"""Kubernetes naming rules, as pure checks.

Claim identities arrive from kubelet and end up in file names and CDI IDs, so every one is
checked against the exact rule the API server applies before anything touches the disk.
Each check returns None when the value is fine, else a sentence saying what was expected;
callers prefix it with the field name.
"""

import re

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# A Kubernetes UID, for building larger patterns (file and socket names) too.
UID_PATTERN = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_UID = re.compile(UID_PATTERN)

_EXAMPLE_UID = "0b7c4d6e-1f2a-4b3c-8d9e-0a1b2c3d4e5f"

DNS_LABEL_MAX = 63
SHOWN_MAX = 80
DNS_SUBDOMAIN_MAX = 253
DRIVER_NAME_MAX = 63
LABEL_VALUE_MAX = 63


def shown(value: str) -> str:
    """The value quoted for an error message, cut short: untrusted input can be megabytes long."""
    if len(value) <= SHOWN_MAX:
        return repr(value)
    return repr(value[:SHOWN_MAX]) + f"... ({len(value)} characters)"


def _name_problem(value: str, pattern: re.Pattern[str], max_length: int, rule: str) -> str | None:
    if len(value) > max_length:
        return f"{shown(value)} is longer than {max_length} characters"
    if not pattern.fullmatch(value):
        return f"{shown(value)} is not {rule}"
    return None


def dns_label_problem(value: str) -> str | None:
    return _name_problem(
        value,
        _DNS_LABEL,
        DNS_LABEL_MAX,
        "a DNS label (lowercase letters, digits and '-', starting and ending with a letter or digit)",
    )


def dns_subdomain_problem(value: str, max_length: int = DNS_SUBDOMAIN_MAX) -> str | None:
    return _name_problem(
        value,
        _DNS_SUBDOMAIN,
        max_length,
        "a DNS subdomain (dot-separated lowercase labels of letters, digits and '-', "
        "each starting and ending with a letter or digit)",
    )


def label_value_problem(value: str) -> str | None:
    """A non-empty label value (the empty value is valid for a label but names nothing)."""
    return _name_problem(
        value,
        _LABEL_VALUE,
        LABEL_VALUE_MAX,
        "a label value (letters, digits, '-', '_' and '.', starting and ending with a letter or digit)",
    )


def uid_problem(value: str) -> str | None:
    """Kubernetes UIDs are RFC 4122 UUIDs in their lowercase text form."""
    if not _UID.fullmatch(value):
        return f"{shown(value)} is not a Kubernetes UID (a lowercase UUID like {_EXAMPLE_UID})"
    return None


def driver_name_problem(value: str) -> str | None:
    """Driver names follow the CSI driver-name rule: a lowercase DNS subdomain of at most 63."""
    return dns_subdomain_problem(value, DRIVER_NAME_MAX)
