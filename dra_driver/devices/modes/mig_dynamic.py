"""Mode mig-dynamic: every placement of every MIG profile (or of those listed), drawing from the
GPU's counter set; prepare creates the instance and unprepare destroys it (devices.mig). Foreign
instances already on the GPU are offered as they are, as in mig-static."""

from collections.abc import Sequence

from dra_driver.base.strict_decode import quoted
from dra_driver.devices.gpu_settings import GpuSettings, describe_gpu
from dra_driver.devices.mig import dynamic_mig_device, dynamic_mig_origins, mig_counter_set
from dra_driver.devices.model import CounterSet
from dra_driver.devices.modes import mig_static
from dra_driver.devices.modes.contract import (
    DeviceMode,
    Fallback,
    Offer,
    PlanAsks,
    Unfit,
    settings_as_given,
)
from dra_driver.hardware.model import Gpu

NAME = "mig-dynamic"


def _fits(gpu: Gpu, settings: GpuSettings, where: str) -> Unfit | None:
    known = {profile.name for profile in gpu.mig_profiles}
    if unknown := sorted(set(settings.mig_profiles) - known):
        return Unfit(
            f"{where}.mig.profiles",
            f"[{', '.join(quoted(name) for name in unknown)}] not offered by {describe_gpu(gpu)}; "
            f"its profiles: {', '.join(sorted(known))}",
        )
    return None


def _offers(gpu: Gpu, settings: GpuSettings, notes: list[str]) -> tuple[list[Offer], list[CounterSet]]:
    origins = dynamic_mig_origins(gpu, settings.mig_profiles)
    dynamic = [(dynamic_mig_device(origin), origin) for origin in origins]
    return [*mig_static.existing_instances(gpu, notes), *dynamic], [mig_counter_set(gpu)]


def _planned(gpu: Gpu, asks: PlanAsks) -> GpuSettings:
    return GpuSettings(mode=NAME)


def _serves(gpus: Sequence[Gpu], asks: PlanAsks) -> bool:
    return any(gpu.mig_profiles for gpu in gpus)


MODE = DeviceMode(
    name=NAME,
    description="every placement of every MIG profile, created at prepare (MIG on, no instances)",
    in_mig_mode=True,
    auto=False,
    blocks=frozenset({"mig"}),
    partitions=False,
    no_spread="",
    fits=_fits,
    offers=_offers,
    fallback=Fallback(mig_static.NAME, "DRAPartitionableDevices"),
    entered=settings_as_given,
    planned=_planned,
    serves=_serves,
    not_planned=f"cannot be offered as {NAME}",
    layout_kind=mig_static.LAYOUT_KIND,
    shown_by=mig_static.shows_mig,
    own_attributes=frozenset(),
    unshipped_types=frozenset(),
)
