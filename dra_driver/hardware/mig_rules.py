"""NVML's rules for where a GPU instance may go: placements, overlap, per-profile and per-GPU
instance limits, and the engine and SM budget all instances of a GPU share."""

from collections.abc import Sequence
from typing import NamedTuple

from dra_driver.hardware.catalog import MigGeometry
from dra_driver.hardware.model import HardwareErrorReason, MigProfile, MigResources, Placement


class MigRejection(NamedTuple):
    reason: HardwareErrorReason
    detail: str


def format_placement(placement: Placement) -> str:
    return f"(start {placement.start}, size {placement.size})"


def mig_rejection(
    geometry: MigGeometry,
    existing: Sequence[tuple[MigProfile, Placement]],
    profile: MigProfile,
    placement: Placement,
) -> MigRejection | None:
    """Why NVML would refuse a GPU instance of `profile` at `placement` next to `existing`, or None.

    One pure function for both the backend and the node-file decoder, so a pre-existing instance
    that a node file declares is held to exactly the rules a created one is.
    """
    if placement not in profile.placements:
        allowed = ", ".join(format_placement(p) for p in profile.placements)
        return MigRejection(
            HardwareErrorReason.INVALID_ARGUMENT,
            f"placement {format_placement(placement)} is not one the profile has; its placements: {allowed}",
        )
    for other_profile, other_placement in existing:
        if set(placement.memory_slices) & set(other_placement.memory_slices):
            return MigRejection(
                HardwareErrorReason.INSUFFICIENT_RESOURCES,
                f"its memory slices overlap the existing {other_profile.name} instance at placement "
                f"{format_placement(other_placement)}",
            )
    if sum(other.profile_id == profile.profile_id for other, _ in existing) >= profile.max_instances:
        return MigRejection(
            HardwareErrorReason.INSUFFICIENT_RESOURCES,
            f"the GPU already has the most instances of this profile it allows ({profile.max_instances})",
        )
    if len(existing) >= geometry.max_gpu_instances:
        return MigRejection(
            HardwareErrorReason.INSUFFICIENT_RESOURCES,
            f"the GPU already has the most GPU instances it allows ({geometry.max_gpu_instances})",
        )
    needed = MigResources.total([*(other for other, _ in existing), profile])
    if shortfalls := needed.exceeding(geometry.capacity):
        return MigRejection(
            HardwareErrorReason.INSUFFICIENT_RESOURCES,
            f"together with the existing instances it needs more than the GPU has: {', '.join(shortfalls)}",
        )
    return None
