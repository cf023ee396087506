"""The refusal every step of prepare can give a claim, in a module of its own so that taking it
costs no importer the code of the step that first needed it."""

from typing import ClassVar

from dra_driver.base.errors import ClaimFault
from dra_driver.observability.error_reasons import ErrorReason


class ClaimRejected(ClaimFault):
    """This claim cannot be prepared; the message goes back to kubelet as the claim's error."""

    metric_reason: ClassVar[ErrorReason] = "claim_rejected"
