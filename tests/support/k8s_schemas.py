"""The Kubernetes versions the driver supports, and strict validation against their upstream
OpenAPI schemas (`kubernetes-validate`)."""

from collections.abc import Iterable, Mapping
from typing import Any

import kubernetes_validate

KUBERNETES_VERSIONS = ["1.34.0", "1.35.0", "1.36.0", "1.37.0"]


def validate_everywhere(objects: Iterable[Mapping[str, Any]]) -> None:
    """Raises kubernetes_validate.ValidationError for the first object that some supported version
    refuses, unknown fields included."""
    for item in objects:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(dict(item), version, strict=True)
