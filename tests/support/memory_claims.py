"""Allocated claims held in memory, read back as the API server returns them: the claim source of
engine tests that need no API server (tests.support.claims creates them in the stand-in one)."""

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.claims.engine import RawClaim
from tests.support.engines import POOL


class MemoryClaims:
    """Claims in namespace default, each allocated on the engines' pool by the default driver."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}

    def add(
        self,
        name: str,
        *results: Mapping[str, Any],
        config: Sequence[Mapping[str, Any]] = (),
        annotations: Mapping[str, str] | None = None,
    ) -> RawClaim:
        """`results`: the allocation's device results, for request `gpu` unless they name one."""
        uid = str(uuid.uuid4())
        metadata: dict[str, Any] = {"namespace": "default", "name": name, "uid": uid}
        if annotations:
            metadata["annotations"] = dict(annotations)
        full = [
            {"request": "gpu", "driver": DEFAULT_DRIVER_NAME, "pool": POOL, **result} for result in results
        ]
        self.claims[("default", name)] = {
            "metadata": metadata,
            "status": {"allocation": {"devices": {"results": full, "config": [dict(c) for c in config]}}},
        }
        return RawClaim("default", name, uid)

    async def get(self, namespace: str, name: str) -> object:
        return self.claims[(namespace, name)]
