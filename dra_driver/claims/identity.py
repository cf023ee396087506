"""Claim identities as kubelet sends them, checked before they name anything on disk."""

from typing import ClassVar

import msgspec

from dra_driver.base.errors import ClaimFault
from dra_driver.kube.k8s_names import dns_label_problem, dns_subdomain_problem, uid_problem
from dra_driver.observability.error_reasons import ErrorReason


class InvalidClaimIdentity(ClaimFault, ValueError):
    """A claim namespace, name or UID that Kubernetes itself would never produce."""

    metric_reason: ClassVar[ErrorReason] = "invalid_identity"


class ClaimRef(msgspec.Struct, frozen=True):
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


def claim_ref(namespace: str, name: str, uid: str) -> ClaimRef:
    """Returns a checked ClaimRef, or raises naming every field that is wrong."""
    problems = [
        f"{field}: {problem}"
        for field, problem in (
            ("uid", uid_problem(uid)),
            ("namespace", dns_label_problem(namespace)),
            ("name", dns_subdomain_problem(name)),
        )
        if problem
    ]
    if problems:
        raise InvalidClaimIdentity("invalid claim identity: " + "; ".join(problems))
    return ClaimRef(namespace=namespace, name=name, uid=uid)
