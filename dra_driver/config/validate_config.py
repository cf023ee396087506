"""`dra-driver validate-config`: checks node configs before they reach a node.

It refuses what the agent would refuse, with the agent's own lines: a malformed file (YAML,
fields, modes, sizes, profiles), and a model entry that no GPU of that model could take (MIG
modes on a GPU without MIG, partitions bigger than its memory, profiles it lacks). Given a node's
hardware it also plans the config against that node's GPUs, and each GPU the agent would leave
out is an error. Pure apart from reading the files: the caller brings the GPUs, and says whether
the nodes' agents have HAMi-core (`hami_core`), as the agent's own planning is told.
"""

from collections.abc import Iterator, Sequence
from pathlib import Path

import msgspec

from dra_driver.config.node_config_files import config_file_names, config_names
from dra_driver.devices.config_files import CONFIG_SUFFIX, config_file_problems, parse_config_text
from dra_driver.devices.gpu_selection import catalog_model
from dra_driver.devices.inventory import build_inventory
from dra_driver.devices.modes.registry import AUTO, mode_named
from dra_driver.devices.node_config import GpuEntry, NodeConfig, NodeConfigError, describe_gpu, plan_node
from dra_driver.devices.node_config_checks import offline_problems
from dra_driver.hardware.catalog import GpuModel, gpu_models
from dra_driver.hardware.model import Gpu, MigMode
from dra_driver.hardware.simulated_nodes import GpuGroupSpec, SimulatedNodeSpec, simulated_gpus


class Verdict(msgspec.Struct):
    errors: list[str] = msgspec.field(default_factory=list)
    summary: list[str] = msgspec.field(default_factory=list)


def config_files(target: Path) -> list[Path]:
    """A file, or every `<name>.yaml` of a config directory whose name a label can carry."""
    if target.is_dir():
        return [
            target / f"{name}{CONFIG_SUFFIX}"
            for name in config_names(target)
            if not config_file_problems([f"{name}{CONFIG_SUFFIX}"])
        ]
    return [target]


def _model_of_entry(entry: GpuEntry) -> GpuModel | None:
    models = gpu_models()
    if entry.model is not None:
        return models[entry.model]
    if entry.product_name is not None:
        return next((m for m in models.values() if m.product_name == entry.product_name), None)
    return None


def _sample_gpu(model: GpuModel, mode: str) -> Gpu:
    """A GPU of the model as the entry needs it: MIG on for MIG modes, off otherwise (an operator
    sets the MIG mode per GPU, so only what the model cannot do at all is a mistake here)."""
    if model.mig is None:
        mig_mode = MigMode.UNSUPPORTED
    else:
        mig_mode = MigMode.ENABLED if mode_named(mode).in_mig_mode else MigMode.DISABLED
    spec = SimulatedNodeSpec(f"catalog model {model.key}", (GpuGroupSpec(model, 1, mig_mode),))
    return simulated_gpus("validate-config", spec)[0]


def catalog_problems(config: NodeConfig, hami_core: bool = True) -> Iterator[str]:
    """Model and productName entries that no GPU of their model could take."""
    for entry in config.gpus:
        model = _model_of_entry(entry)
        if model is None or entry.settings.mode == AUTO:
            continue
        gpu = _sample_gpu(model, entry.settings.mode)
        for problem in plan_node(NodeConfig(gpus=(entry,)), (gpu,), hami_core=hami_core).problems:
            yield problem.message.replace(describe_gpu(gpu), f"any {model.key} ({model.product_name})")


def _entries_text(config: NodeConfig) -> str:
    entries = [f"{entry.selector}: {entry.settings.mode}" for entry in config.gpus]
    return f"default: {config.default.mode}" + "".join(f"; {text}" for text in entries)


def validate_file(path: Path, gpus: Sequence[Gpu] | None, verdict: Verdict, hami_core: bool = True) -> None:
    origin = f"node config {path}"
    try:
        config = parse_config_text(path.read_bytes(), origin)
    except OSError as error:
        verdict.errors.append(f"{origin}: cannot read it: {error.strerror or error}")
        return
    except NodeConfigError as error:
        verdict.errors.extend(error.problems)
        return
    by_model = list(catalog_problems(config, hami_core))
    static = [f"{origin}: {line}" for line in by_model]
    if gpus is None:
        # An entry its model already refused is not refused again for the whole catalog.
        refused = {line.split(".", 1)[0] for line in by_model}
        static.extend(
            f"{origin}: {line}" for line in offline_problems(config) if line.split(".", 1)[0] not in refused
        )
    verdict.errors.extend(static)
    if gpus is None:
        if not static:
            verdict.summary.append(f"{path}: valid ({_entries_text(config)})")
        return
    node_plan = plan_node(config, gpus, hami_core=hami_core)
    verdict.errors.extend(
        f"{origin}: {problem.message}" + ("" if problem.gpu is None else "; this GPU would be left out")
        for problem in node_plan.problems
    )
    if node_plan.problems or static:
        return
    inventory = build_inventory(node_plan.plans)
    # Not an error: the agent offers such a GPU's nothing too, and says so in a log line; but a
    # "valid" alone would read as "every GPU is offered".
    offering = {gpu.uuid for gpu in inventory.gpu_of_device.values()}
    idle = [gpu for gpu in gpus if gpu.uuid not in offering]
    verdict.summary.append(
        f"{path}: valid" + (f"; {len(idle)} of {len(gpus)} GPUs offer nothing (notes below)" if idle else "")
    )
    modes = {plan.gpu.uuid: plan.mode for plan in node_plan.plans}
    for gpu in gpus:
        model = catalog_model(gpu) or "not in the catalog"
        verdict.summary.append(f"  GPU {gpu.index} ({gpu.product_name}, model {model}): {modes[gpu.uuid]}")
    verdict.summary.extend(f"  note: {note}" for note in inventory.notes)


def validate(target: Path, gpus: Sequence[Gpu] | None, hami_core: bool = True) -> Verdict:
    verdict = Verdict()
    files = config_files(target)
    if target.is_dir():
        verdict.errors.extend(f"{target}: {line}" for line in config_file_problems(config_file_names(target)))
    if not files and not verdict.errors:
        verdict.errors.append(f"{target}: no <name>{CONFIG_SUFFIX} files in this directory")
    for path in files:
        validate_file(path, gpus, verdict, hami_core)
    return verdict
