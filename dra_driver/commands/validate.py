"""`dra-driver validate-config`: check node configs as the agent would, before they ship."""

import argparse
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dra_driver.commands.event_loop import run_coroutine
from dra_driver.config.option_table import DRIVER_ROOT, HARDWARE, NODE_NAME, add_options
from dra_driver.config.settings import parse_hardware

if TYPE_CHECKING:
    from dra_driver.config.settings import HardwareSpec
    from dra_driver.hardware.model import Gpu


def run(args: argparse.Namespace) -> int:
    """Exit 2 for configs the agent would refuse (and an unknown simulated node), 1 when the
    hardware cannot be read."""
    from dra_driver.config.validate_config import validate  # noqa: PLC0415
    from dra_driver.hardware.model import HardwareError  # noqa: PLC0415

    if not Path(args.driver_root).is_absolute():
        print(
            f"dra-driver validate-config: --driver-root {args.driver_root!r} must be an absolute path",
            file=sys.stderr,
        )
        return 2
    target = Path(args.target)
    if not target.exists():
        print(f"dra-driver validate-config: {target}: no such file or directory", file=sys.stderr)
        return 2
    try:
        gpus = None if args.hardware is None else _validation_gpus(parse_hardware(args.hardware), args)
    except HardwareError as error:
        print(f"dra-driver validate-config: --hardware {args.hardware}: {error}", file=sys.stderr)
        return 1 if args.hardware == "nvml" else 2
    verdict = validate(target, gpus, hami_core=not args.without_hami_core)
    for line in verdict.errors:
        print(f"dra-driver validate-config: {line}", file=sys.stderr)
    if verdict.errors:
        return 2
    sys.stdout.write("".join(f"{line}\n" for line in verdict.summary))
    return 0


def _validation_gpus(hardware: "HardwareSpec", args: argparse.Namespace) -> "tuple[Gpu, ...]":
    from dra_driver.hardware.simulated_nodes import resolve_node_spec, simulated_gpus  # noqa: PLC0415

    if hardware.kind == "simulated":
        return simulated_gpus(args.node_name, resolve_node_spec(hardware.source))

    async def discover() -> "tuple[Gpu, ...]":
        from dra_driver.hardware.nvml import NvmlBackend  # noqa: PLC0415 - pynvml only where asked for

        backend = NvmlBackend(driver_root=Path(args.driver_root))
        try:
            return tuple(await backend.discover())
        finally:
            await backend.close()

    return run_coroutine(discover())


def add_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    validate = commands.add_parser(
        "validate-config",
        help="check a node config file (or a directory of named configs) as the agent would",
    )
    validate.add_argument("target", metavar="FILE", help="a node config, or a directory of <name>.yaml")
    hardware = HARDWARE.but(
        default=None,
        metavar="nvml|simulated:<profile or file>",
        help="also plan the config against this node's GPUs; a GPU the config does not fit (the agent "
        "leaves it out) is an error, one that fits but offers nothing (MIG on, no instances) a note",
    )
    node_name = NODE_NAME.but(
        default=socket.gethostname().lower(),
        help="the node the simulated GPUs' UUIDs are derived from",
    )
    add_options(validate, [hardware, node_name], env=False)
    # The one agent variable it reads: run on a GPU node, it finds the driver where the agent does.
    driver_root = DRIVER_ROOT.but(
        default=DRIVER_ROOT.default, help="with --hardware nvml: where libnvidia-ml.so.1 is looked for first"
    )
    add_options(validate, [driver_root])
    validate.add_argument(
        "--without-hami-core",
        action="store_true",
        help="plan as on nodes whose agent has no --hami-core-library: a GPU with vgpu.enforcement "
        "hami-core is an error, as the agent leaves it out",
    )
    validate.set_defaults(run=run)
