"""Why a claim failed, in the closed set of words the failure counters use as their label.

The metrics' own vocabulary: the error types of the layers below name their word in a
`metric_reason` class attribute, so that `metrics` reads the word off an error and imports none of
the layers that raise them (the import contract in pyproject.toml checks both this module and
`metrics`). A closed set because the error messages name claims and devices: as labels they would
make a new series per claim.
"""

from typing import Literal, get_args

ErrorReason = Literal["invalid_identity", "claim_rejected", "config", "hardware", "internal"]
ERROR_REASONS: tuple[ErrorReason, ...] = get_args(ErrorReason)
