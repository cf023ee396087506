"""The `dra-driver` command: `node`, `inspect`, `cleanup`, `simulate-fault`, `kubelet-client`,
`demo`, `manifests` and `validate-config`."""

import argparse
import asyncio
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from dra_driver import DEFAULT_DRIVER_NAME, __version__
from dra_driver.settings import (
    SettingsError,
    add_cleanup_options,
    add_inventory_options,
    add_node_options,
    cleanup_settings,
    inventory_settings,
    node_settings,
    parse_hardware,
)

if TYPE_CHECKING:
    from dra_driver.devices.inventory import Inventory
    from dra_driver.hardware.model import Gpu
    from dra_driver.settings import HardwareSpec


def _node(args: argparse.Namespace) -> int:
    from dra_driver.agent.errors import SetupError, StartupError  # noqa: PLC0415
    from dra_driver.logging import configure_logging  # noqa: PLC0415 - keep `--help` fast
    from dra_driver.node import run_node  # noqa: PLC0415

    settings = node_settings(args, stderr_is_terminal=sys.stderr.isatty())
    configure_logging(settings.log_format, settings.verbosity)
    try:
        asyncio.run(run_node(settings))
    except StartupError as error:
        print(f"dra-driver node: {error}", file=sys.stderr)
        return 2 if isinstance(error, SetupError) else 1
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from dra_driver.agent.errors import SetupError, StartupError  # noqa: PLC0415
    from dra_driver.devices.slices import SlicePlanError, layout_for  # noqa: PLC0415
    from dra_driver.inspect import inventory_table, slices_yaml  # noqa: PLC0415
    from dra_driver.node import discover_inventory  # noqa: PLC0415

    settings = inventory_settings(args)

    async def discover() -> tuple[str, "Inventory"]:
        hardware, inventory = await discover_inventory(settings)
        await hardware.close()
        return hardware.description, inventory

    try:
        description, inventory = asyncio.run(discover())
        if args.output == "yaml":
            layout = layout_for(args.kubernetes_version)
            sys.stdout.write(slices_yaml(inventory, layout, settings.driver_name, settings.node_name))
        else:
            sys.stdout.write(inventory_table(inventory, description))
    except (StartupError, SlicePlanError) as error:
        print(f"dra-driver inspect: {error}", file=sys.stderr)
        return 2 if isinstance(error, SetupError) else 1
    return 0


def _cleanup(args: argparse.Namespace) -> int:
    from dra_driver.agent.errors import StartupError  # noqa: PLC0415
    from dra_driver.agent.kube_client import kubernetes_api_client  # noqa: PLC0415
    from dra_driver.kubeconfig import KubeconfigError, read_kubeconfig  # noqa: PLC0415
    from dra_driver.publish.cleanup import every_node_slice_api, refusal, remove_node_slices  # noqa: PLC0415
    from dra_driver.publish.dry_run import print_writes  # noqa: PLC0415
    from dra_driver.publish.slice_api import ApiCallError, SliceApi  # noqa: PLC0415

    settings = cleanup_settings(args)
    where = settings.node_name or "every node"
    if settings.kubeconfig_note:
        print(f"dra-driver cleanup: {settings.kubeconfig_note}", file=sys.stderr)
    if settings.kubeconfig is not None:
        try:
            read_kubeconfig(settings.kubeconfig)
        except KubeconfigError as error:
            raise SettingsError(f"--kubeconfig {settings.kubeconfig}: {error}") from error

    async def cleanup() -> int:
        api_client = await kubernetes_api_client(settings.kubeconfig)
        try:
            refused = (
                "" if args.force else await refusal(api_client, settings.driver_name, settings.node_name)
            )
            if refused:
                print(f"dra-driver cleanup: {refused}", file=sys.stderr)
                return 1
            api = (
                SliceApi(api_client, settings.driver_name, settings.node_name)
                if settings.node_name
                else every_node_slice_api(api_client, settings.driver_name)
            )
            deletes = await remove_node_slices(api, dry_run=args.dry_run)
        finally:
            await api_client.close()
        if args.dry_run:
            print_writes(deletes)
        else:
            for delete in deletes:
                print(f"deleted resourceslice {delete.name}")
            print(f"{len(deletes)} ResourceSlice(s) of {settings.driver_name} on {where} removed")
        return 0

    try:
        return asyncio.run(cleanup())
    except (StartupError, ApiCallError) as error:
        print(f"dra-driver cleanup: {error}", file=sys.stderr)
        return 1


def _simulate_fault(args: argparse.Namespace) -> int:
    from dra_driver.health.simulated_faults import FaultError, SimulatedFault, submit_fault  # noqa: PLC0415

    state_dir = Path(args.state_dir)
    if not state_dir.is_dir():
        raise SettingsError(f"--state-dir: {state_dir} is not a directory")
    fault = SimulatedFault(gpu=args.gpu, kind="lost" if args.lost else "xid", xid=args.xid or 0)
    try:
        path = submit_fault(state_dir, fault)
    except FaultError as error:
        raise SettingsError(str(error)) from error
    except OSError as error:
        print(f"dra-driver simulate-fault: cannot queue the fault: {error}", file=sys.stderr)
        return 1
    print(f"fault queued for the agent: {path}")
    return 0


def _kubernetes_version(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    if not (major.isdigit() and minor.isdigit()) or (int(major), int(minor)) < (1, 34):
        raise argparse.ArgumentTypeError(
            f"expected a Kubernetes version from 1.34 on, such as 1.35; got {text!r}"
        )
    return int(major), int(minor)


def _print_yaml(data: Any) -> None:
    sys.stdout.write(yaml.safe_dump(data, sort_keys=False))


def _kubelet_client(args: argparse.Namespace) -> int:
    from dra_driver import kubelet_client, kubelet_sockets  # noqa: PLC0415
    from dra_driver.k8s_names import driver_name_problem  # noqa: PLC0415

    if problem := driver_name_problem(args.driver_name):
        raise SettingsError(f"--driver-name: {problem}")
    try:
        claims = [kubelet_client.ClaimArg.parse(text) for text in getattr(args, "claim", None) or []]
    except ValueError as error:
        raise SettingsError(f"--claim: {error}") from error
    try:
        if args.action == "register":
            socket_path = _given_socket("--registration-socket", args.registration_socket)
            if socket_path is None:
                socket_path = kubelet_sockets.live_registration_socket(
                    Path(args.registrar_dir), args.driver_name
                )
            if args.notify or args.reject:
                result = asyncio.run(kubelet_client.register(socket_path, args.reject))
                _print_yaml(result)
                return 0 if result["registered"] else 1
            info = asyncio.run(kubelet_client.plugin_info(socket_path))
            _print_yaml(info)
            print(
                "dra-driver kubelet-client: NotifyRegistrationStatus not sent, so the plugin's "
                "registration state is unchanged; --notify sends it as kubelet does (the plugin "
                "then reports itself registered and ready)",
                file=sys.stderr,
            )
            return 0 if info["kubeletWouldRegister"] else 1
        socket_path = _given_socket("--socket", args.socket) or kubelet_sockets.live_dra_socket(
            Path(args.plugins_dir), args.driver_name
        )
        call = kubelet_client.prepare if args.action == "prepare" else kubelet_client.unprepare
        answer = asyncio.run(call(socket_path, args.api, claims))
    except (kubelet_client.KubeletClientError, kubelet_sockets.NoLiveSocketError) as error:
        print(f"dra-driver kubelet-client: {error}", file=sys.stderr)
        return 1
    _print_yaml(answer)
    return 1 if any(entry.get("error") for entry in answer["claims"].values()) else 0


def _given_socket(flag: str, value: str | None) -> Path | None:
    """An explicitly named socket must be one; a missing one is the operator's typo, not a failure."""
    if value is None:
        return None
    path = Path(value)
    if not path.is_socket():
        raise SettingsError(f"{flag}: {value} is not a unix socket")
    return path


def _demo(args: argparse.Namespace) -> int:
    from dra_driver.agent.errors import SetupError, StartupError  # noqa: PLC0415
    from dra_driver.demo import claim_choice, demo_claims, run_demo  # noqa: PLC0415
    from dra_driver.logging import configure_logging  # noqa: PLC0415

    hardware = str(parse_hardware(args.hardware))
    try:
        # Before anything is logged: a claim the node cannot take is the one line printed.
        claims = asyncio.run(demo_claims(claim_choice(args.claim), hardware))
        configure_logging("console", 0)
        failed = asyncio.run(run_demo(claims, hardware, run_container=not args.no_container))
    except StartupError as error:
        print(f"dra-driver demo: {error}", file=sys.stderr)
        return 2 if isinstance(error, SetupError) else 1
    for uid, error_text in failed.items():
        print(f"dra-driver demo: claim {uid} was not prepared: {error_text}", file=sys.stderr)
    return 1 if failed else 0


def _manifests(args: argparse.Namespace) -> int:
    """Bad options raise ManifestError (a SettingsError), which main() prints and exits 2 on."""
    from dra_driver.hardware.simulated_nodes import names_a_file  # noqa: PLC0415
    from dra_driver.manifests import (  # noqa: PLC0415
        ManifestError,
        ManifestOptions,
        parse_node_selector,
        render_yaml,
        split_node_config_argument,
    )

    selector = parse_node_selector(args.node_selector or [])
    hardware = parse_hardware(args.hardware)
    # A simulated node described by a local file travels in a ConfigMap; a profile name does not.
    simulated_node = (
        _manifest_file("--hardware", hardware.source)
        if hardware.kind == "simulated" and names_a_file(hardware.source)
        else None
    )
    node_configs: dict[str, str] = {}
    for argument in args.node_config or []:
        name, path = split_node_config_argument(argument)
        if name in node_configs:
            raise ManifestError(f"--node-config: the config {name!r} is given twice")
        node_configs[name] = _manifest_file(f"--node-config {name}", path)
    options = ManifestOptions(
        name=args.name,
        driver_name=args.driver_name,
        image=args.image,
        namespace=args.namespace,
        hardware=args.hardware,
        node_selector=selector,
        max_surge=args.max_surge,
        node_configs=node_configs,
        simulated_node=simulated_node,
        hami_core_library=args.hami_core_library,
        driver_root=args.driver_root,
        registrar_dir=args.registrar_dir,
        plugins_dir=args.plugins_dir,
        priority_class_name=args.priority_class_name,
        log_verbosity=args.log_verbosity,
        log_format=args.log_format,
        metrics_port=args.metrics_port,
    )
    sys.stdout.write(render_yaml(options))
    return 0


def _manifest_file(flag: str, path: str) -> str:
    from dra_driver.manifests import ManifestError  # noqa: PLC0415

    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ManifestError(f"{flag}: cannot read {path}: {error}") from error


def _add_kubelet_client(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    client = commands.add_parser("kubelet-client", help="talk to a plugin the way kubelet does")
    actions = client.add_subparsers(dest="action", required=True)
    register = actions.add_parser(
        "register", help="GetInfo on the registration socket; --notify completes the handshake"
    )
    register.add_argument(
        "--registration-socket",
        help="default: the newest live <driver>[-<pod uid>]-reg.sock in --registrar-dir",
    )
    register.add_argument(
        "--registrar-dir", default="/var/lib/kubelet/plugins_registry", help="default: %(default)s"
    )
    answer = register.add_mutually_exclusive_group()
    answer.add_argument(
        "--notify",
        action="store_true",
        help="send NotifyRegistrationStatus(registered) as kubelet does: the plugin then reports ready",
    )
    answer.add_argument(
        "--reject",
        default="",
        metavar="REASON",
        help="send a refused registration with this error, as kubelet would",
    )
    register.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME, help="default: %(default)s")
    for name in ("prepare", "unprepare"):
        call = actions.add_parser(name, help=f"Node{name.capitalize()}Resources on a DRA socket")
        call.add_argument(
            "--socket", help="default: the newest live dra[-<pod uid>].sock in <plugins-dir>/<driver-name>"
        )
        call.add_argument("--plugins-dir", default="/var/lib/kubelet/plugins", help="default: %(default)s")
        call.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME, help="default: %(default)s")
        call.add_argument("--api", choices=("v1", "v1beta1"), default="v1", help="DRAPlugin API version")
        call.add_argument(
            "--claim",
            action="append",
            required=True,
            metavar="NAMESPACE/NAME/UID",
            help="a claim to send; repeat for several",
        )
    client.set_defaults(run=_kubelet_client)


def _add_manifests_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    from dra_driver import manifests as m  # noqa: PLC0415

    manifests = commands.add_parser(
        "manifests", help="print the objects that install the driver in a cluster, as a YAML stream"
    )
    add = manifests.add_argument
    add(
        "--name",
        default=m.DEFAULT_NAME,
        help="the installation's name (as a Helm release's): names its namespaced objects; "
        "a second installation needs another name and driver name; default: %(default)s",
    )
    add("--driver-name", default=DEFAULT_DRIVER_NAME, help="default: %(default)s")
    add("--image", default=m.DEFAULT_IMAGE, help="default: %(default)s")
    add("--namespace", default=m.DEFAULT_NAMESPACE, help="default: %(default)s")
    add(
        "--hardware",
        default=m.DEFAULT_HARDWARE,
        help="'nvml', or 'simulated:<profile or local YAML file>'; default: %(default)s",
    )
    add(
        "--node-selector",
        action="append",
        metavar="KEY=VALUE",
        help="nodes to run the agent on; repeat for several; default: nodes labelled "
        "feature.node.kubernetes.io/pci-10de.present=true or nvidia.com/gpu.present=true",
    )
    add(
        "--node-config",
        action="append",
        metavar="[NAME=]FILE",
        help="how GPUs are offered (whole, MIG, vGPU): FILE is the default config, NAME=FILE the "
        "config that nodes labelled dra-driver.dev/config=NAME use; repeat for several",
    )
    add(
        "--driver-root",
        default=m.DEFAULT_DRIVER_ROOT,
        metavar="PATH",
        help="where the NVIDIA driver is on the nodes: / when installed on the host, "
        "/run/nvidia/driver with the GPU Operator; default: %(default)s",
    )
    add("--registrar-dir", default=m.DEFAULT_REGISTRAR_DIR, metavar="PATH", help="default: %(default)s")
    add("--plugins-dir", default=m.DEFAULT_PLUGINS_DIR, metavar="PATH", help="default: %(default)s")
    add(
        "--priority-class-name",
        default=m.DEFAULT_PRIORITY_CLASS,
        help="the agent pods' priority class; '' for none; default: %(default)s",
    )
    add("--log-verbosity", type=int, default=0, metavar="N", help="0 (default) to 10: more log detail")
    add("--log-format", default="json", help="json (default) or console")
    add("--metrics-port", type=int, default=m.DEFAULT_METRICS_PORT, help="default: %(default)s")
    add(
        "--max-surge",
        type=int,
        choices=(0, 1),
        default=1,
        help="1: new agent pods overlap the old (kubelet >= 1.33); 0: one after the other; default: 1",
    )
    add(
        "--hami-core-library",
        metavar="PATH",
        help="HAMi-core's libvgpu.so on the GPU nodes, to enforce vGPU limits (default: advisory only)",
    )
    manifests.set_defaults(run=_manifests)


def _add_demo(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    from dra_driver.demo import DEFAULT_CLAIM, DEFAULT_HARDWARE  # noqa: PLC0415

    demo = commands.add_parser("demo", help="prepare a sample claim on a simulated node, no cluster needed")
    demo.add_argument(
        "--claim",
        "--claim-file",
        default=DEFAULT_CLAIM,
        metavar="gpu|mig|vgpu|FILE",
        help="a sample claim for a device of that kind on the node, or allocated ResourceClaim(s) "
        "as YAML; default: %(default)s",
    )
    demo.add_argument("--hardware", default=DEFAULT_HARDWARE, help="simulated node to run on")
    demo.add_argument(
        "--no-container", action="store_true", help="do not run a container even if podman works"
    )
    demo.set_defaults(run=_demo)


# -- validate-config ---------------------------------------------------------------------------------


def _validate_config(args: argparse.Namespace) -> int:
    """Exit 2 for configs the agent would refuse (and an unknown simulated node), 1 when the
    hardware cannot be read."""
    from dra_driver.hardware.model import HardwareError  # noqa: PLC0415
    from dra_driver.validate_config import validate  # noqa: PLC0415

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
    verdict = validate(target, gpus)
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

    return asyncio.run(discover())


def _add_validate_config(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    validate = commands.add_parser(
        "validate-config",
        help="check a node config file (or a directory of named configs) as the agent would",
    )
    validate.add_argument("target", metavar="FILE", help="a node config, or a directory of <name>.yaml")
    validate.add_argument(
        "--hardware",
        metavar="nvml|simulated:<profile or file>",
        help="also plan the config against this node's GPUs; a GPU it would leave out is an error",
    )
    validate.add_argument(
        "--node-name",
        default=socket.gethostname().lower(),
        help="the node the simulated GPUs' UUIDs are derived from; default: this host's name",
    )
    validate.add_argument(
        "--driver-root",
        default=os.environ.get("DRA_DRIVER_ROOT", "/"),
        help="with --hardware nvml: where libnvidia-ml.so.1 is looked for first "
        "[env DRA_DRIVER_ROOT; default /]",
    )
    validate.set_defaults(run=_validate_config)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dra-driver", description="Kubernetes DRA driver for NVIDIA GPUs")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    node = commands.add_parser("node", help="run the node agent (kubelet plugin)")
    add_node_options(node)
    node.set_defaults(run=_node)

    inspect = commands.add_parser(
        "inspect", help="show the devices and ResourceSlices this node would publish; no cluster needed"
    )
    add_inventory_options(inspect, default_node_name=socket.gethostname().lower())
    inspect.add_argument(
        "-o",
        "--output",
        choices=("table", "yaml"),
        default="table",
        help="a table, or the ResourceSlices as YAML",
    )
    inspect.add_argument(
        "--kubernetes-version",
        type=_kubernetes_version,
        default=(1, 35),
        metavar="MAJOR.MINOR",
        help="the cluster's version, which decides the slice layout (1.34, or 1.35 and later); default 1.35",
    )
    inspect.set_defaults(run=_inspect)

    cleanup = commands.add_parser(
        "cleanup", help="delete this node's ResourceSlices (uninstall); the agent itself never does"
    )
    add_cleanup_options(cleanup)
    cleanup.add_argument("--dry-run", action="store_true", help="print the deletes instead of making them")
    cleanup.add_argument(
        "--force", action="store_true", help="delete even while an agent pod still runs on the node"
    )
    cleanup.set_defaults(run=_cleanup)

    fault = commands.add_parser(
        "simulate-fault", help="make a running agent's simulated GPU report an XID or fall off the bus"
    )
    fault.add_argument("--state-dir", required=True, help="the agent's --state-dir")
    fault.add_argument("--gpu", required=True, help="GPU index or UUID")
    kind = fault.add_mutually_exclusive_group(required=True)
    kind.add_argument("--xid", type=int, help="the XID to report")
    kind.add_argument("--lost", action="store_true", help="the GPU falls off the bus (XID 79)")
    fault.set_defaults(run=_simulate_fault)

    _add_kubelet_client(commands)
    _add_demo(commands)
    _add_manifests_parser(commands)
    _add_validate_config(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except SettingsError as error:
        print(f"dra-driver {args.command}: {error}", file=sys.stderr)
        return 2
    return code
