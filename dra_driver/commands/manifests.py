"""`dra-driver manifests`: print the objects that install the driver, as a YAML stream.

Its flags describe the DaemonSet for every GPU node, not the machine it runs on, so it reads none
of the agent's variables; where a flag means what the agent's does, it is the agent's row.
"""

import argparse
import sys
from pathlib import Path

from dra_driver.config import option_table as o
from dra_driver.config.settings import parse_hardware


def run(args: argparse.Namespace) -> int:
    """Bad options raise ManifestError (a SettingsError), which main() prints and exits 2 on."""
    from dra_driver.hardware.simulated_nodes import names_a_file  # noqa: PLC0415
    from dra_driver.tools.manifests import (  # noqa: PLC0415
        ManifestError,
        ManifestOptions,
        parse_env,
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
        extra_env=parse_env(args.env or []),
        kubernetes_version=args.kubernetes_version,
        extended_resources=args.extended_resources,
        extended_mig_profiles=tuple(args.extended_mig_profile or ()),
        usage_interval=args.usage_interval,
        usage_processes=args.usage_processes,
        flush_records=args.flush_records,
        claim_policy=args.claim_policy,
    )
    sys.stdout.write(render_yaml(options))
    return 0


def _manifest_file(flag: str, path: str) -> str:
    from dra_driver.base.bounded_yaml import MAX_BYTES  # noqa: PLC0415
    from dra_driver.tools.manifests import ManifestError  # noqa: PLC0415

    try:
        with Path(path).open("rb") as file:
            data = file.read(MAX_BYTES + 1)
    except OSError as error:
        raise ManifestError(f"{flag}: cannot read {path}: {error.strerror or error}") from error
    if len(data) > MAX_BYTES:
        raise ManifestError(f"{flag}: {path} is larger than {MAX_BYTES >> 20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ManifestError(f"{flag}: {path}: not UTF-8 text: byte {error.start} cannot be decoded") from None


def add_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    from dra_driver.tools import manifests as m  # noqa: PLC0415

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
    o.add_options(manifests, [o.DRIVER_NAME], env=False)
    add("--image", default=m.DEFAULT_IMAGE, help="default: %(default)s")
    add("--namespace", default=m.DEFAULT_NAMESPACE, help="default: %(default)s")
    hardware = o.HARDWARE.but(
        default=m.DEFAULT_HARDWARE, help="'nvml', or 'simulated:<profile or local YAML file>'"
    )
    o.add_options(manifests, [hardware], env=False)
    add(
        "--node-selector",
        action="append",
        metavar="KEY=VALUE",
        help="nodes to run the agent on; repeat for several; default: nodes labelled "
        "feature.node.kubernetes.io/pci-10de.present=true or nvidia.com/gpu.present=true",
    )
    # Not the agent's --node-config: several files, each a named config in a ConfigMap.
    add(
        "--node-config",
        action="append",
        metavar="[NAME=]FILE",
        help="how GPUs are offered (whole, MIG, vGPU): FILE is the default config, NAME=FILE the "
        "config that nodes labelled dra-driver.dev/config=NAME use; repeat for several",
    )
    driver_root = o.DRIVER_ROOT.but(
        default=m.DEFAULT_DRIVER_ROOT,
        metavar="PATH",
        help="where the NVIDIA driver is on the nodes: / when installed on the host, "
        "/run/nvidia/driver with the GPU Operator",
    )
    on_the_hosts = [
        option.but(default=default, metavar="PATH", help=option.help)
        for option, default in (
            (o.REGISTRAR_DIR, m.DEFAULT_REGISTRAR_DIR),
            (o.PLUGINS_DIR, m.DEFAULT_PLUGINS_DIR),
        )
    ]
    o.add_options(manifests, [driver_root, *on_the_hosts], env=False)
    add(
        "--priority-class-name",
        default=m.DEFAULT_PRIORITY_CLASS,
        help="the agent pods' priority class; '' for none; default: %(default)s",
    )
    add("--log-verbosity", type=int, default=0, metavar="N", help="0 (default) to 10: more log detail")
    o.add_options(manifests, [o.LOG_FORMAT.but(default="json", help="json or console")], env=False)
    add("--metrics-port", type=int, default=m.DEFAULT_METRICS_PORT, help="default: %(default)s")
    add(
        "--max-surge",
        type=int,
        choices=(0, 1),
        default=1,
        help="1: new agent pods overlap the old (kubelet >= 1.33); 0: one after the other; default: 1",
    )
    library = o.HAMI_CORE_LIBRARY.but(
        default=None,
        metavar="PATH",
        help="HAMi-core's libvgpu.so on the GPU nodes, to enforce vGPU limits (default: advisory only)",
    )
    o.add_options(manifests, [library], env=False)
    add(
        "--usage-interval",
        type=int,
        default=m.DEFAULT_USAGE_INTERVAL,
        metavar="SECONDS",
        help="seconds between GPU usage samples; 0: no usage metrics and no mount of kubelet's "
        "PodResources socket; default: %(default)s",
    )
    add(
        "--flush-records",
        action="store_true",
        help="flush each claim record to disk before kubelet's answer (the agent's --flush-records)",
    )
    add(
        "--no-claim-policy",
        dest="claim_policy",
        action="store_false",
        help="leave out the admission policy that refuses claims prepare would refuse (a vGPU share "
        "with other devices, an opaque config of the wrong kind); for clusters whose every vGPU GPU "
        "runs vgpu.enforcement hami-core or none",
    )
    add(
        "--usage-processes",
        action="store_true",
        help="attribute GPU processes to pods by cgroup: runs the agent in the host PID namespace "
        "and mounts /var/log/pods read-only",
    )
    add(
        "--env",
        action="append",
        metavar="NAME=VALUE",
        help="more environment for the agent's container (e.g. a test library's settings); repeat for more",
    )
    _add_extended_resource_flags(manifests)
    manifests.set_defaults(run=run)


def _add_extended_resource_flags(manifests: argparse.ArgumentParser) -> None:
    """Checked with the other options (check_options), where the version gate lives."""
    from dra_driver.base.kubernetes_versions import DEFAULT_KUBERNETES, SUPPORTED_RANGE  # noqa: PLC0415

    add = manifests.add_argument
    add(
        "--kubernetes-version",
        default=DEFAULT_KUBERNETES,
        metavar="1.N",
        help=f"the oldest Kubernetes the objects must work on ({SUPPORTED_RANGE}); default: %(default)s",
    )
    add(
        "--extended-resources",
        action="store_true",
        help="serve the NVIDIA device plugin's resource names (nvidia.com/gpu, nvidia.com/mig-<profile>, "
        "nvidia.com/vgpu-<size> for the node configs' partitions) from DeviceClasses, so pod specs "
        "written for the device plugin run on DRA; needs --kubernetes-version 1.36 or later; never "
        "on nodes where the device plugin runs",
    )
    add(
        "--extended-mig-profile",
        action="append",
        metavar="PROFILE",
        help="with --extended-resources: a MIG profile (e.g. 1g.10gb) to serve as nvidia.com/mig-<profile>; "
        "repeat for more; default: every MIG profile of the GPU catalog",
    )
