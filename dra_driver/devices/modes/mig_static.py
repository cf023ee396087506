"""Mode mig-static: the MIG instances that exist (made by nvidia-smi mig or mig-parted), each a
device that prepare uses and never creates; what mode auto makes of a GPU in MIG mode."""

from collections import Counter
from collections.abc import Iterator, Sequence

from dra_driver.devices import attributes as names
from dra_driver.devices.gpu_settings import GpuSettings
from dra_driver.devices.mig import has_instances, static_mig_device, usable_static_instance
from dra_driver.devices.model import CounterSet, Device
from dra_driver.devices.modes.contract import (
    DeviceMode,
    Offer,
    PlanAsks,
    no_misfit,
    settings_as_given,
)
from dra_driver.devices.origins import StaticMig
from dra_driver.hardware.model import Gpu

NAME = "mig-static"
LAYOUT_KIND = "mig"


def existing_instances(gpu: Gpu, notes: list[str]) -> Iterator[Offer]:
    """The GPU's existing instances: in mode mig-static all of them, in mig-dynamic the foreign
    ones (devices.mig), whose slices no placement is offered on even where they are unusable."""
    compute_instances_per_gpu_instance = Counter(instance.gpu_instance_id for instance in gpu.mig_instances)
    for instance in gpu.mig_instances:
        where = f"{gpu.label} MIG GPU instance {instance.gpu_instance_id}"
        profile = gpu.mig_profile(instance.profile_id)
        if not usable_static_instance(instance):
            notes.append(f"{where} has no compute instance; not published")
        elif compute_instances_per_gpu_instance[instance.gpu_instance_id] > 1:
            notes.append(f"{where} is split into several compute instances; not published")
        elif profile is None:
            notes.append(
                f"{where} has profile id {instance.profile_id}, which the GPU does not list; not published"
            )
        else:
            origin = StaticMig(gpu, profile, instance)
            yield static_mig_device(origin), origin


def _offers(gpu: Gpu, settings: GpuSettings, notes: list[str]) -> tuple[list[Offer], list[CounterSet]]:
    if not gpu.mig_instances:
        notes.append(
            f"{gpu.label} is in MIG mode without MIG instances, so it offers nothing; "
            "create instances (nvidia-smi mig, mig-parted) or give it mode mig-dynamic"
        )
    return list(existing_instances(gpu, notes)), []


def _planned(gpu: Gpu, asks: PlanAsks) -> None:
    """A plan never makes instances: a GPU is planned as its instances only where it has them,
    which `plan` does in every mode (devices.mig.has_instances)."""
    return None


def _serves(gpus: Sequence[Gpu], asks: PlanAsks) -> bool:
    return any(has_instances(gpu) for gpu in gpus)


def shows_mig(devices: Sequence[Device]) -> bool:
    return any(device.attributes.get(names.TYPE) == "mig" for device in devices)


MODE = DeviceMode(
    name=NAME,
    description="the MIG instances that exist, made by nvidia-smi mig or mig-parted (MIG on)",
    in_mig_mode=True,
    auto=True,
    blocks=frozenset(),
    partitions=False,
    no_spread="",
    fits=no_misfit,
    offers=_offers,
    fallback=None,
    entered=settings_as_given,
    planned=_planned,
    serves=_serves,
    not_planned="has no MIG instances",
    layout_kind=LAYOUT_KIND,
    shown_by=shows_mig,
    own_attributes=frozenset(),
    unshipped_types=frozenset(),
)
