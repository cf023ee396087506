"""`dra-driver inspect`: the devices and ResourceSlices a node would publish, with no cluster."""

import argparse
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dra_driver.base.errors import OperatorFault, exit_code
from dra_driver.base.kubernetes_versions import (
    DEFAULT_KUBERNETES,
    SUPPORTED_RANGE,
    kubernetes_version_problem,
    minor_of,
)
from dra_driver.commands.event_loop import run_coroutine
from dra_driver.config.option_table import INVENTORY_OPTIONS, NODE_NAME, add_options
from dra_driver.config.settings import SettingsError, inventory_settings

if TYPE_CHECKING:
    from dra_driver.devices.inventory import Inventory


def run(args: argparse.Namespace) -> int:
    from dra_driver.agent.errors import SetupError, StartupError  # noqa: PLC0415
    from dra_driver.agent.node import discover_inventory  # noqa: PLC0415
    from dra_driver.devices.slices import SlicePlanError, layout_for  # noqa: PLC0415
    from dra_driver.kube.errors import ApiError  # noqa: PLC0415
    from dra_driver.packing.published import PublishedSliceError  # noqa: PLC0415
    from dra_driver.publish.capabilities import PARTITION_TYPE_SINCE  # noqa: PLC0415
    from dra_driver.tools.inspection import inventory_table, slices_yaml  # noqa: PLC0415

    settings = inventory_settings(args)
    # Invalid input, so refused (2) before any hardware is opened: a version outside the range
    # the driver publishes for, and a kubeconfig named on the command line that is no file (the
    # same rule as plan, cleanup and node: a file the user names and that is absent is theirs
    # to fix; a cluster that cannot be reached is a run-time failure, 1).
    kubernetes_version = _kubernetes_version(args.kubernetes_version)
    if args.kubeconfig is not None:
        _check_kubeconfig(Path(args.kubeconfig))

    async def discover() -> tuple[str, "Inventory"]:
        hardware, inventory = await discover_inventory(settings)
        await hardware.close()
        return hardware.description, inventory

    try:
        description, inventory = run_coroutine(discover())
        if args.output == "layout":
            text = _layout(inventory, args.kubeconfig, settings.driver_name, settings.node_name, description)
            sys.stdout.write(text)
        elif args.output == "yaml":
            layout = layout_for(kubernetes_version)
            partition_types = kubernetes_version >= PARTITION_TYPE_SINCE
            sys.stdout.write(
                slices_yaml(inventory, layout, settings.driver_name, settings.node_name, partition_types)
            )
        else:
            sys.stdout.write(inventory_table(inventory, description))
    except (StartupError, SetupError, SlicePlanError, ApiError, PublishedSliceError) as error:
        # The hint is for a run-time failure (no GPU to read), not for input that is wrong.
        hint = (
            _simulated_hint()
            if settings.hardware.kind == "nvml" and not isinstance(error, OperatorFault)
            else ""
        )
        print(f"dra-driver inspect: {error}{hint}", file=sys.stderr)
        return exit_code(error)
    return 0


def _layout(inventory: "Inventory", kubeconfig: str | None, driver: str, node: str, description: str) -> str:
    """The devices per GPU, as `plan -o layout` draws them; with --kubeconfig, those the
    cluster's allocated claims hold on this node are marked with their claim."""
    from dra_driver.packing.allocator import Pool  # noqa: PLC0415
    from dra_driver.packing.planner import plan_pool  # noqa: PLC0415
    from dra_driver.tools.cluster_reads import Held, read_node  # noqa: PLC0415
    from dra_driver.tools.layout_text import layout_text  # noqa: PLC0415

    pool = Pool.from_inventory(inventory, driver)
    held: Held = []
    if kubeconfig:
        _, held = run_coroutine(read_node(Path(kubeconfig), driver, node, slices=False))
    plan = plan_pool(pool, (), "published", allocated=held)
    return f"hardware: {description}\n" + layout_text([gpu.layout for gpu in plan.gpus])


def _check_kubeconfig(path: Path) -> None:
    from dra_driver.kube.kubeconfig import KubeconfigError, read_kubeconfig  # noqa: PLC0415

    if not path.is_file():
        raise SettingsError(f"--kubeconfig: {path} is not a file")
    try:
        read_kubeconfig(path)
    except KubeconfigError as error:
        raise SettingsError(f"--kubeconfig {path}: {error}") from error


def _simulated_hint() -> str:
    """Most who run a bare `inspect` on a machine without a GPU want to see a node's devices."""
    from dra_driver.hardware.simulated_nodes import node_profiles  # noqa: PLC0415

    return (
        "; without a GPU here, pass --hardware simulated:<profile> to inspect a simulated node "
        f"(profiles: {', '.join(sorted(node_profiles()))})"
    )


def _kubernetes_version(text: str) -> tuple[int, int]:
    if problem := kubernetes_version_problem(text):
        raise SettingsError(f"--kubernetes-version: {problem}")
    return minor_of(text)


def add_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    inspect = commands.add_parser(
        "inspect", help="show the devices and ResourceSlices this node would publish; no cluster needed"
    )
    # Run on the node itself, it needs no name: the host's is the Node's unless kubelet overrides it.
    this_host = NODE_NAME.but(
        default=socket.gethostname().lower(), help="name of the Kubernetes node; also the pool name"
    )
    add_options(inspect, [this_host if option is NODE_NAME else option for option in INVENTORY_OPTIONS])
    inspect.add_argument(
        "-o",
        "--output",
        choices=("table", "yaml", "layout"),
        default="table",
        help="a table, the ResourceSlices as YAML, or the layout (each GPU's MIG slices or memory as text)",
    )
    inspect.add_argument(
        "--kubernetes-version",
        default=DEFAULT_KUBERNETES,
        metavar="1.N",
        help=f"the cluster's version ({SUPPORTED_RANGE}), which decides the slice layout (1.34, or 1.35 "
        "and later) and, from 1.37, whether slices name their partition-type attribute; "
        "default: %(default)s",
    )
    inspect.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="with -o layout: mark the devices that the cluster's allocated claims hold on this node",
    )
    inspect.set_defaults(run=run)
