"""`dra-driver plan`: how many pods of given shapes a node takes, where, and what is stranded.

The node is a simulated profile or node file (`--node simulated:dgx-h100`), planned in every way
its GPUs can be offered (a GPU with MIG instances always as its instances) or as a node config
file offers them (`--node-config`); or a live node (`--kubeconfig`, `--node-name`), planned as
it publishes its devices now (the config its agent chose, named by the Node's label), around the
devices its allocated claims hold. With `--trace FILE` instead of `--pods`, a simulated node
replays pods arriving and leaving (`packing.trace_file`) with the static and the live device
order side by side (`packing.trace_plan`). Exit 2 for input that cannot work (a bad shape, an
unknown profile, a malformed node config or trace), 1 when the cluster cannot be read or the
drawing cannot be written.
"""

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.base.errors import OperatorFault
from dra_driver.commands.event_loop import run_coroutine
from dra_driver.devices.config_files import DEFAULT_NODE_CONFIG_LABEL
from dra_driver.devices.modes.registry import MODE_NAMES, MODES

if TYPE_CHECKING:
    from dra_driver.devices.inventory import Inventory
    from dra_driver.devices.node_config import NodeConfig
    from dra_driver.packing.planner import ModePlan, PlanMode
    from dra_driver.packing.shapes import PodGroup
    from dra_driver.packing.trace_plan import OrderReplay

OUTPUTS = ("table", "json", "layout", "svg", "png")
SIMULATED = "simulated:"


class _Invalid(OperatorFault):
    """Input that cannot work: exit 2 with this line."""


def _simulated_plans(
    args: argparse.Namespace, groups: "tuple[PodGroup, ...]"
) -> "tuple[str, tuple[ModePlan, ...]]":
    from dra_driver.hardware.model import HardwareError  # noqa: PLC0415
    from dra_driver.hardware.simulated_nodes import describe_node, resolve_node_spec, simulated_gpus  # noqa: PLC0415
    from dra_driver.packing.planner import plan_node_config, plan_node_modes  # noqa: PLC0415

    if not args.node.startswith(SIMULATED):
        raise _Invalid(f"--node {args.node!r}: expected simulated:<profile name or node YAML file>")
    try:
        spec = resolve_node_spec(args.node.removeprefix(SIMULATED))
    except HardwareError as error:
        raise _Invalid(f"--node {args.node}: {error}") from error
    gpus = simulated_gpus(args.node_name or "node", spec)
    if args.node_config:
        config, origin = _node_config(args)
        return f"{describe_node(spec)}; {origin}", (plan_node_config(gpus, groups, args.driver_name, config),)
    return describe_node(spec), plan_node_modes(gpus, groups, args.driver_name, tuple(args.mode or ()))


def _trace_replays(
    args: argparse.Namespace,
) -> "tuple[str, str, tuple[tuple[OrderReplay, OrderReplay], ...]]":
    """(node, trace line, (static, live) per mode) for --trace, or _Invalid / TraceError."""
    from dra_driver.base.yaml_files import YamlFileError, read_yaml_file  # noqa: PLC0415
    from dra_driver.hardware.model import HardwareError  # noqa: PLC0415
    from dra_driver.hardware.simulated_nodes import describe_node, resolve_node_spec, simulated_gpus  # noqa: PLC0415
    from dra_driver.packing.planner import (  # noqa: PLC0415
        config_inventory,
        gpu_profiles,
        mode_inventory,
        modes_for,
    )
    from dra_driver.packing.trace_file import parse_trace  # noqa: PLC0415
    from dra_driver.packing.trace_plan import check_trace_profiles, replay_trace, trace_groups  # noqa: PLC0415

    if args.kubeconfig or not args.node.startswith(SIMULATED):
        raise _Invalid(
            "--trace: only with --node simulated:<profile or file>; a live node's claims are its own"
        )
    if args.output == "layout":
        raise _Invalid("--output layout: not with --trace; use table, json, svg or png")
    try:
        spec = resolve_node_spec(args.node.removeprefix(SIMULATED))
    except HardwareError as error:
        raise _Invalid(f"--node {args.node}: {error}") from error
    try:
        raw = read_yaml_file(Path(args.trace))
    except YamlFileError as error:
        raise _Invalid(f"--trace {args.trace}: {error}") from error
    source = f"--trace {args.trace}"
    trace = parse_trace(raw, source)
    gpus = simulated_gpus(args.node_name or "node", spec)
    check_trace_profiles(trace, source, sorted({p for names in gpu_profiles(gpus).values() for p in names}))
    groups = trace_groups(trace)
    if args.node_config:
        config, origin = _node_config(args)
        node = f"{describe_node(spec)}; {origin}"
        published: list[tuple[PlanMode, tuple[Inventory, tuple[str, ...]]]] = [
            ("node-config", config_inventory(gpus, config, args.driver_name))
        ]
    else:
        node = describe_node(spec)
        modes: tuple[PlanMode, ...] = tuple(args.mode or ()) or modes_for(gpus, groups)
        published = [(mode, mode_inventory(gpus, mode, groups, args.driver_name)) for mode in modes]
    replays = tuple(
        replay_trace(inventory, args.driver_name, trace, mode, notes)
        for mode, (inventory, notes) in published
    )
    kinds = ", ".join(f"{group.count}x{group.shape.text}" for group in groups)
    return node, f"{args.trace}: {trace.arrivals} pods ({kinds})", replays


def _run_trace(args: argparse.Namespace) -> int:
    from dra_driver.packing.trace_file import TraceError  # noqa: PLC0415
    from dra_driver.tools.trace_report import trace_json, trace_table  # noqa: PLC0415

    try:
        node, trace_line, replays = _trace_replays(args)
    except (_Invalid, TraceError) as error:
        print(f"dra-driver plan: {error}", file=sys.stderr)
        return 2
    if args.output in ("svg", "png"):
        plans = tuple(replay.plan for pair in replays for replay in pair)
        return _draw(f"{node}\n{trace_line}", plans, Path(args.output_file), args.output)
    text = (trace_json if args.output == "json" else trace_table)(node, trace_line, replays)
    return _emit(args, text)


def _node_config(args: argparse.Namespace) -> "tuple[NodeConfig, str]":
    """The config as the agent reads it, or _Invalid naming the flag and every problem."""
    from dra_driver.config.node_config_files import load_node_config  # noqa: PLC0415
    from dra_driver.devices.node_config import NodeConfigError  # noqa: PLC0415

    if args.mode:
        raise _Invalid("--mode: not with --node-config, which says each GPU's mode")
    try:
        return load_node_config(Path(args.node_config)), f"node config {args.node_config}"
    except NodeConfigError as error:
        raise _Invalid("--node-config: " + "\n  ".join(error.problems)) from error


def _live_plans(
    args: argparse.Namespace, groups: "tuple[PodGroup, ...]"
) -> "tuple[str, tuple[ModePlan, ...]]":
    from dra_driver.config.option_values import OptionProblem, label_key  # noqa: PLC0415
    from dra_driver.devices.attributes import PRODUCT_NAME  # noqa: PLC0415
    from dra_driver.kube.k8s_names import dns_subdomain_problem, driver_name_problem  # noqa: PLC0415
    from dra_driver.kube.kubeconfig import KubeconfigError, read_kubeconfig  # noqa: PLC0415
    from dra_driver.kube.kubeconfig_choice import KubeconfigUnusable, choose_kubeconfig  # noqa: PLC0415
    from dra_driver.packing.planner import check_profiles, offered_profiles, plan_pool  # noqa: PLC0415
    from dra_driver.tools.cluster_reads import read_config_choice, read_node  # noqa: PLC0415

    if not args.node_name:
        raise _Invalid("--node-name: required with --kubeconfig: which node's published devices to plan on")
    if problem := dns_subdomain_problem(args.node_name):
        raise _Invalid(f"--node-name: {problem}")
    if problem := driver_name_problem(args.driver_name):
        raise _Invalid(f"--driver-name: {problem}")
    if args.mode or args.node_config:
        flag = "--mode" if args.mode else "--node-config"
        raise _Invalid(
            f"{flag}: only with --node simulated:...; a live node is planned as it publishes, "
            "which is as the config its agent chose offers its GPUs"
        )
    try:
        choice = choose_kubeconfig(args.kubeconfig, os.environ, Path.home())
    except KubeconfigUnusable as error:
        raise _Invalid(str(error)) from error
    if choice.path is not None:
        try:
            read_kubeconfig(choice.path)
        except KubeconfigError as error:
            raise _Invalid(f"--kubeconfig {choice.path}: {error}") from error
    try:
        label_key(args.node_config_label)
    except OptionProblem as error:
        raise _Invalid(f"--node-config-label: {error}") from error
    chosen = run_coroutine(read_config_choice(choice.path, args.node_name, args.node_config_label))
    pool, allocated = run_coroutine(read_node(choice.path, args.driver_name, args.node_name))
    if not pool.devices:
        raise LookupError(f"node {args.node_name} publishes no devices of {args.driver_name}")
    products = {str(d.attributes.get(PRODUCT_NAME, "")) for d in pool.devices}
    check_profiles(
        groups, {", ".join(sorted(products)): offered_profiles(pool)} if offered_profiles(pool) else {}
    )
    return f"node {args.node_name} (published ResourceSlices; {chosen})", (
        plan_pool(pool, groups, "published", allocated=allocated),
    )


def _emit(args: argparse.Namespace, text: str) -> int:
    """Writes the answer; a file that cannot be written is a run-time failure, 1."""
    try:
        if args.output_file:
            Path(args.output_file).write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)
    except OSError as error:
        print(f"dra-driver plan: --output-file {args.output_file}: {error}", file=sys.stderr)
        return 1
    return 0


def run(args: argparse.Namespace) -> int:
    from dra_driver.agent.errors import StartupError  # noqa: PLC0415
    from dra_driver.kube.errors import ApiError  # noqa: PLC0415
    from dra_driver.packing.published import PublishedSliceError  # noqa: PLC0415
    from dra_driver.packing.shapes import ShapeError, parse_pods  # noqa: PLC0415
    from dra_driver.tools.plan_report import plan_json, plan_table  # noqa: PLC0415

    try:
        if bool(args.pods) == bool(args.trace):
            raise _Invalid(
                "--pods: give the pods to plan (--pods) or a trace of pods arriving and leaving "
                "(--trace FILE); exactly one of the two"
            )
        if args.output in ("svg", "png") and not args.output_file:
            raise _Invalid(f"--output-file: required with -o {args.output}: where to write the drawing")
        if args.trace:
            if not args.node:
                raise _Invalid("--node: required with --trace: the simulated node to replay it on")
            return _run_trace(args)
        groups = parse_pods(args.pods)
        if args.output in ("svg", "png") and not args.output_file:
            raise _Invalid(f"--output-file: required with -o {args.output}: where to write the drawing")
        if bool(args.node) == bool(args.kubeconfig):
            raise _Invalid(
                "--node: give a node (simulated:<profile or file>), or --kubeconfig with --node-name "
                "for a live node; exactly one of the two"
            )
        node, plans = _simulated_plans(args, groups) if args.node else _live_plans(args, groups)
    except (_Invalid, ShapeError) as error:
        print(f"dra-driver plan: {error}", file=sys.stderr)
        return 2
    except (StartupError, ApiError, PublishedSliceError, LookupError) as error:
        print(f"dra-driver plan: {error}", file=sys.stderr)
        return 1
    if args.output in ("svg", "png"):
        return _draw(node, plans, Path(args.output_file), args.output)
    text = (
        plan_json(node, groups, plans)
        if args.output == "json"
        else plan_table(node, groups, plans, layout=args.output == "layout")
    )
    return _emit(args, text)


def _draw(node: str, plans: "tuple[ModePlan, ...]", path: Path, output: str) -> int:
    try:
        from dra_driver.tools.layout_drawing import layout_figure, save_layout  # noqa: PLC0415
    except ImportError as error:
        print(
            f"dra-driver plan: -o {output} needs matplotlib ({error}): pipx inject dra-driver matplotlib, "
            "or pip install 'dra-driver[plot]'",
            file=sys.stderr,
        )
        return 1
    try:
        save_layout(layout_figure(node, plans), path, output)
    except OSError as error:
        print(f"dra-driver plan: --output-file {path}: {error}", file=sys.stderr)
        return 1
    return 0


def add_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    plan = commands.add_parser(
        "plan",
        help="how many pods of given shapes fit a node, where, and what is stranded; no cluster needed",
    )
    plan.add_argument(
        "--pods",
        metavar="SHAPES",
        help="pod shapes, comma-separated [<count>x]<kind>: gpu, gpu:<N> (N whole GPUs, 1 to 8), a MIG "
        "profile (1g.10gb) or vgpu:<memory>[/<cores>%%], e.g. 10x1g.10gb,4xvgpu:10Gi/30%%,2xgpu,3xgpu:8",
    )
    plan.add_argument(
        "--trace",
        metavar="FILE",
        help="instead of --pods: a YAML or JSON file of pods arriving and leaving (arrivals: at, pod, "
        "duration or name; departures: at, name), replayed with the static and the live device order "
        "side by side",
    )
    plan.add_argument(
        "--node",
        metavar="simulated:<profile or file>",
        help="the node: a simulated profile or node YAML file",
    )
    plan.add_argument(
        "--mode",
        action="append",
        choices=MODE_NAMES,
        help="plan only this way of offering the GPUs (repeatable); default: every way they allow. "
        "A GPU with MIG instances is planned as its instances in every mode. "
        + "; ".join(f"{mode.name}: {mode.description}" for mode in MODES).replace("%", "%%"),
    )
    plan.add_argument(
        "--node-config",
        metavar="FILE",
        help="with --node: plan the GPUs as this node config file offers them (as the agent reads "
        "it), instead of each --mode",
    )
    plan.add_argument("--kubeconfig", metavar="FILE", help="plan on a live node's published devices instead")
    plan.add_argument(
        "--node-name", help="with --kubeconfig: the node; with --node: the name simulated UUIDs derive from"
    )
    plan.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME, help="default: %(default)s")
    plan.add_argument(
        "--node-config-label",
        default=DEFAULT_NODE_CONFIG_LABEL,
        metavar="KEY",
        help="with --kubeconfig: the Node label that names the config the agent chose, shown with the "
        "plan (default: %(default)s)",
    )
    plan.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default="table",
        help="table (default), json, layout (table and "
        "the GPUs drawn as text), svg or png (the GPUs drawn; needs --output-file)",
    )
    plan.add_argument("--output-file", metavar="FILE", help="write the answer here instead of to stdout")
    plan.set_defaults(run=run)
