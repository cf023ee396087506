"""The packaged GPU catalog agrees with itself, with NVIDIA's naming and with the MIG rules.

The catalog is generated from hand-collected research, so these checks are what stands between
a typo in that research and a simulated GPU that no real GPU resembles.
"""

from collections import Counter
from collections.abc import Iterator

import pytest

from dra_driver.hardware.catalog import GpuModel, MigGeometry, gpu_models
from dra_driver.hardware.mig_names import mig_profile_name
from dra_driver.hardware.model import MigProfile, MigResources, Placement

MIG_MODELS = sorted(key for key, model in gpu_models().items() if model.mig is not None)
# go-nvlib's strings, which selectors written for other NVIDIA drivers match on.
ARCHITECTURES = {"Volta", "Turing", "Ampere", "Ada Lovelace", "Hopper", "Blackwell"}
BRANDS = {"Nvidia", "Tesla", "GeForce"}
# NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 / 2_SLICE_REV1: the "+me" profiles that own media engines.
MEDIA_EXTENSION_ENUMS = {0x7, 0x8}


def mig_geometry(key: str) -> MigGeometry:
    geometry = gpu_models()[key].mig
    assert geometry is not None
    return geometry


def test_the_catalog_holds_every_researched_model_but_the_incomplete_one() -> None:
    assert MIG_MODELS == [
        "A100-SXM4-40GB",
        "A100-SXM4-80GB",
        "A30-24GB",
        "B200-180GB",
        "GB200-186GB",
        "H100-NVL-94GB",
        "H100-SXM5-80GB",
        "H200-SXM-141GB",
    ]
    assert sorted(set(gpu_models()) - set(MIG_MODELS)) == [
        "A10",
        "A10G",
        "L4",
        "L40S",
        "RTX-4090",
        "T4",
        "V100-SXM2-32GB",
    ]


@pytest.mark.parametrize("model", gpu_models().values(), ids=lambda model: model.key)
def test_every_model_has_plausible_device_facts(model: GpuModel) -> None:
    assert model.memory_mib > 0
    assert model.multiprocessors > 0
    assert model.product_name.startswith(("NVIDIA ", "Tesla "))
    assert model.architecture in ARCHITECTURES
    assert model.brand in BRANDS
    major, minor = model.cuda_compute_capability.split(".")
    assert major.isdigit()
    assert minor.isdigit()


def test_the_catalog_keeps_nvml_units_and_both_profile_numbers() -> None:
    """One well-observed row, checked field by field: id and enum differ, memory is MiB."""
    h100 = gpu_models()["H100-SXM5-80GB"]
    first = mig_geometry("H100-SXM5-80GB").profiles[0]
    assert (h100.product_name, h100.memory_bytes, h100.multiprocessors) == (
        "NVIDIA H100 80GB HBM3",
        81559 * 2**20,
        132,
    )
    assert (first.name, first.profile_id, first.nvml_enum, first.memory_bytes) == (
        "1g.10gb",
        19,
        0,
        9984 * 2**20,
    )
    assert first.placements == tuple(Placement(start, 1) for start in range(7))


@pytest.mark.parametrize("key", MIG_MODELS)
def test_profile_names_follow_from_memory_as_go_nvlib_computes_them(key: str) -> None:
    gpu_memory = gpu_models()[key].memory_bytes
    for profile in mig_geometry(key).profiles:
        computed = mig_profile_name(
            profile.nvml_enum, profile.compute_slices, profile.memory_bytes, gpu_memory
        )
        assert computed == profile.name, f"{key} profile id {profile.profile_id}"


@pytest.mark.parametrize("key", MIG_MODELS)
def test_profile_ids_and_names_are_unique_per_model(key: str) -> None:
    profiles = mig_geometry(key).profiles
    assert len({profile.profile_id for profile in profiles}) == len(profiles)
    assert len({profile.name for profile in profiles}) == len(profiles)


@pytest.mark.parametrize("key", MIG_MODELS)
def test_placements_fit_the_memory_slices_and_share_one_size_per_profile(key: str) -> None:
    geometry = mig_geometry(key)
    model = gpu_models()[key]
    for profile in geometry.profiles:
        assert profile.placements, f"{key} {profile.name} has no placements"
        assert len({placement.size for placement in profile.placements}) == 1, f"{key} {profile.name}"
        assert len(set(profile.placements)) == len(profile.placements), f"{key} {profile.name}"
        assert all(p.start >= 0 and p.start + p.size <= geometry.memory_slices for p in profile.placements)
        assert 1 <= profile.max_instances <= len(profile.placements)
        assert 0 < profile.memory_bytes <= model.memory_bytes
        assert 0 < profile.multiprocessors <= model.multiprocessors
    full_gpu = max(geometry.profiles, key=lambda profile: profile.compute_slices)
    assert full_gpu.placements == (Placement(0, geometry.memory_slices),)


def legal_layouts(geometry: MigGeometry) -> Iterator[list[tuple[MigProfile, Placement]]]:
    """Every set of instances that the memory slices, the per-profile limits and the GPU-instance
    limit allow, enumerated by brute force."""
    options = [(profile, placement) for profile in geometry.profiles for placement in profile.placements]

    def extend(
        chosen: list[tuple[MigProfile, Placement]], first: int, used: frozenset[int]
    ) -> Iterator[list[tuple[MigProfile, Placement]]]:
        counts = Counter(profile.profile_id for profile, _ in chosen)
        if any(counts[profile.profile_id] > profile.max_instances for profile, _ in chosen):
            return
        if len(chosen) > geometry.max_gpu_instances:
            return
        yield chosen
        for position in range(first, len(options)):
            slices = options[position][1].memory_slices
            if used.isdisjoint(slices):
                yield from extend([*chosen, options[position]], position + 1, used | set(slices))

    return extend([], 0, frozenset())


@pytest.mark.parametrize("key", MIG_MODELS)
def test_only_a_second_media_extension_instance_can_run_out_of_engines(key: str) -> None:
    """Slice rules alone keep every layout within the GPU's engines, SMs and memory; the engine
    budget only binds for two "+me" instances together (A30 has one JPEG and one OFA for both),
    which NVML refuses for the same reason."""
    geometry = mig_geometry(key)
    layouts = 0
    for layout in legal_layouts(geometry):
        layouts += 1
        over = MigResources.total(profile for profile, _ in layout).exceeding(geometry.capacity)
        media_extension_instances = sum(profile.nvml_enum in MEDIA_EXTENSION_ENUMS for profile, _ in layout)
        if media_extension_instances < 2:
            assert over == [], f"{key}: {[(profile.name, placement.start) for profile, placement in layout]}"
    assert layouts > len(geometry.profiles)


def test_the_a30_engine_budget_is_what_keeps_its_two_media_extension_profiles_apart() -> None:
    geometry = mig_geometry("A30-24GB")
    one_me, two_me = (geometry.profile_named(name) for name in ("1g.6gb+me", "2g.12gb+me"))
    assert one_me is not None
    assert two_me is not None
    over = MigResources.total([one_me, two_me]).exceeding(geometry.capacity)
    assert over == ["jpeg engines 2 > 1", "ofa engines 2 > 1"]
