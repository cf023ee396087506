"""`--mps-daemons pod`: the platform's MPS daemons moved out of the agent into pods of their own.

The platform opens the control program the agent's own process would run daemons with (the
driver root's nvidia-cuda-mps-control, or the simulated one); here the same program becomes the
command of each claim's daemon pod, and the agent keeps using it to talk to the daemons.
"""

from msgspec.structs import replace

from dra_driver.agent.errors import StartupError
from dra_driver.agent.gpu_platform import Platform
from dra_driver.claims.sharing.mps import MpsControlDaemons
from dra_driver.claims.sharing.mps_pod_spec import MpsPodSettings
from dra_driver.claims.sharing.mps_pods import MpsDaemonPods
from dra_driver.claims.side_effects import SharingControls
from dra_driver.config.settings import NodeSettings
from dra_driver.kube.pod_api import PodApi


def with_mps_pods(settings: NodeSettings, platform: Platform, pods: PodApi | None) -> Platform:
    """`platform` as it is with --mps-daemons process; else with daemons in pods created through
    `pods` (None: no API server, as in the demo, which needs --mps-daemons process)."""
    if settings.mps_daemons == "process":
        return platform
    local = platform.sharing.mps
    if pods is None or not isinstance(local, MpsControlDaemons):
        raise StartupError("--mps-daemons pod: needs the API server; use --mps-daemons process without one")
    assert settings.mps_daemon_image is not None and settings.namespace is not None  # node_settings checks
    command, environment = local.foreground_command()
    pod_settings = MpsPodSettings(
        namespace=settings.namespace,
        node_name=settings.node_name,
        image=settings.mps_daemon_image,
        driver_root=settings.driver_root,
        host_driver_root=settings.host_root,
        command=command,
        environment=environment,
        privileged=platform.mps_pods_privileged,
    )
    daemons = MpsDaemonPods(local, pods, pod_settings, start_timeout_s=settings.mps_start_timeout)
    return replace(platform, sharing=SharingControls(platform.sharing.time_slicer, daemons))
