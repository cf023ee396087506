"""Whether a decoded claim is the one kubelet asked to prepare, and allocated (pure).

Its fields were checked when it was decoded (claim_object.py); this is what the claim must be
for kubelet's request, beyond being well-formed.
"""

from dra_driver.claims.claim_object import AllocatedDevice, ResourceClaimView
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.identity import ClaimRef
from dra_driver.kube.k8s_names import shown


def allocated_devices(claim: ResourceClaimView, ref: ClaimRef) -> tuple[AllocatedDevice, ...]:
    """The claim's results of this driver, after checking it is the claim kubelet meant."""
    if claim.uid != ref.uid:
        raise ClaimRejected(
            f"claim {ref.namespace}/{ref.name} now has UID {shown(claim.uid)}, kubelet asked for {ref.uid}: "
            "the claim was deleted and re-created"
        )
    if not claim.allocated:
        raise ClaimRejected(f"claim {ref} is not allocated (status.allocation is missing)")
    return claim.results
