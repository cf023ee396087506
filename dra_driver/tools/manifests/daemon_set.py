"""The agent's DaemonSet and the ConfigMaps it mounts (node configs, a simulated node)."""

from typing import Any

from dra_driver.tools.manifests.access import service_account_name
from dra_driver.tools.manifests.options import (
    CONTAINER_DRIVER_ROOT,
    DEFAULT_TOLERATIONS,
    GPU_NODE_LABELS,
    NODE_CONFIGS_DIR,
    POD_LOGS_DIR,
    POD_RESOURCES_DIR,
    SIMULATED_NODE_DIR,
    SIMULATED_NODE_KEY,
    ManifestOptions,
    object_metadata,
    selector_labels,
)


def _host_path(name: str, path: str, path_type: str) -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path, "type": path_type}}


def config_maps(options: ManifestOptions) -> list[dict[str, Any]]:
    """The node configs and the simulated node, which the same DaemonSet gives to every node."""
    maps = []
    if options.node_configs:
        data = {f"{name}.yaml": text for name, text in sorted(options.node_configs.items())}
        maps.append((f"{options.name}-node-configs", data))
    if options.simulated_node is not None:
        maps.append((f"{options.name}-simulated-node", {SIMULATED_NODE_KEY: options.simulated_node}))
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": object_metadata(options, name, options.namespace),
            "data": data,
        }
        for name, data in maps
    ]


def _optional_parts(
    options: ManifestOptions,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Environment, mounts and volumes of what is switched on: node files, HAMi-core, flushed
    claim records."""
    env: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    if options.node_configs:
        env.append({"name": "DRA_DRIVER_NODE_CONFIGS", "value": NODE_CONFIGS_DIR})
        mounts.append({"name": "node-configs", "mountPath": NODE_CONFIGS_DIR, "readOnly": True})
        volumes.append({"name": "node-configs", "configMap": {"name": f"{options.name}-node-configs"}})
    if options.simulated_node is not None:
        mounts.append({"name": "simulated-node", "mountPath": SIMULATED_NODE_DIR, "readOnly": True})
        volumes.append({"name": "simulated-node", "configMap": {"name": f"{options.name}-simulated-node"}})
    if options.hami_core_library is not None:
        # Both at their host paths: the CDI mounts that put them into workloads name host paths.
        library = options.hami_core_library
        hami_core_dir = f"/var/lib/{options.name}/vgpu"
        env.append({"name": "DRA_DRIVER_HAMI_CORE_LIBRARY", "value": library})
        env.append({"name": "DRA_DRIVER_HAMI_CORE_DIR", "value": hami_core_dir})
        mounts.append({"name": "hami-core-library", "mountPath": library, "readOnly": True})
        mounts.append({"name": "hami-core-dir", "mountPath": hami_core_dir})
        volumes.append(_host_path("hami-core-library", library, "File"))
        volumes.append(_host_path("hami-core-dir", hami_core_dir, "DirectoryOrCreate"))
    if options.flush_records:
        env.append({"name": "DRA_DRIVER_FLUSH_RECORDS", "value": "true"})
    return env, mounts, volumes


def _usage_parts(
    options: ManifestOptions,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Environment, mounts and volumes of GPU usage metrics: kubelet's PodResources socket, read
    only; with process attribution also the pods' log directories (pod names by UID)."""
    env: list[dict[str, Any]] = [{"name": "DRA_DRIVER_USAGE_INTERVAL", "value": str(options.usage_interval)}]
    if not options.usage_interval:
        return env, [], []
    env.append({"name": "DRA_DRIVER_POD_RESOURCES_SOCKET", "value": f"{POD_RESOURCES_DIR}/kubelet.sock"})
    mounts = [{"name": "pod-resources", "mountPath": POD_RESOURCES_DIR, "readOnly": True}]
    volumes = [_host_path("pod-resources", POD_RESOURCES_DIR, "DirectoryOrCreate")]
    if options.usage_processes:
        env.append({"name": "DRA_DRIVER_USAGE_PROCESSES", "value": "true"})
        mounts.append({"name": "pod-logs", "mountPath": POD_LOGS_DIR, "readOnly": True})
        volumes.append(_host_path("pod-logs", POD_LOGS_DIR, "DirectoryOrCreate"))
    return env, mounts, volumes


def _hardware_value(options: ManifestOptions) -> str:
    if options.simulated_node is not None:
        return f"simulated:{SIMULATED_NODE_DIR}/{SIMULATED_NODE_KEY}"
    return options.hardware


def _placement(options: ManifestOptions) -> dict[str, Any]:
    """A node selector when one is given; else the GPU nodes, found by either label (ORed terms)."""
    if options.node_selector:
        return {"nodeSelector": dict(options.node_selector)}
    terms = [
        {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}
        for key, value in GPU_NODE_LABELS
    ]
    return {
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    }


def agent_env(options: ManifestOptions, run_dir: str) -> list[dict[str, Any]]:
    """The agent container's own environment. It reads the driver root at CONTAINER_DRIVER_ROOT
    and names it in CDI specs as the host has it: the container runtime resolves them on the host."""
    env: list[dict[str, Any]] = [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "DRA_DRIVER_NAME", "value": options.driver_name},
        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "DRA_DRIVER_HARDWARE", "value": _hardware_value(options)},
        {"name": "DRA_DRIVER_ROOT", "value": CONTAINER_DRIVER_ROOT},
        {"name": "DRA_DRIVER_HOST_ROOT", "value": options.driver_root},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        {"name": "DRA_DRIVER_REGISTRAR_DIR", "value": options.registrar_dir},
        {"name": "DRA_DRIVER_PLUGINS_DIR", "value": options.plugins_dir},
        {"name": "DRA_DRIVER_MPS_DIR", "value": f"{run_dir}/mps"},
        {"name": "DRA_DRIVER_METRICS_ADDRESS", "value": f":{options.metrics_port}"},
        {"name": "DRA_DRIVER_LOG_FORMAT", "value": options.log_format},
        {"name": "DRA_DRIVER_VERBOSITY", "value": str(options.log_verbosity)},
        # MPS control daemons in pods of their own, from this image, in this namespace (issue 26).
        {"name": "DRA_DRIVER_MPS_DAEMONS", "value": "pod"},
        {"name": "DRA_DRIVER_MPS_DAEMON_IMAGE", "value": options.image},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    return env + _optional_parts(options)[0] + _usage_parts(options)[0]


def daemon_set(options: ManifestOptions) -> dict[str, Any]:
    run_dir = f"/run/{options.name}"
    mounts: list[dict[str, Any]] = [
        {"name": "plugins-registry", "mountPath": options.registrar_dir},
        {"name": "plugins", "mountPath": options.plugins_dir},
        {"name": "cdi", "mountPath": "/var/run/cdi"},
        {"name": "dev", "mountPath": "/dev"},
        # The GPU operator's driver container may mount the driver after the agent has started.
        {
            "name": "driver-root",
            "mountPath": CONTAINER_DRIVER_ROOT,
            "readOnly": True,
            "mountPropagation": "HostToContainer",
        },
        {"name": "run", "mountPath": run_dir},
    ]
    volumes = [
        _host_path("plugins-registry", options.registrar_dir, "Directory"),
        _host_path("plugins", options.plugins_dir, "DirectoryOrCreate"),
        _host_path("cdi", "/var/run/cdi", "DirectoryOrCreate"),
        _host_path("dev", "/dev", "Directory"),
        _host_path("driver-root", options.driver_root, "DirectoryOrCreate"),
        _host_path("run", run_dir, "DirectoryOrCreate"),
    ]
    env = agent_env(options, run_dir)
    _, optional_mounts, optional_volumes = _optional_parts(options)
    env += [{"name": name, "value": value} for name, value in options.extra_env.items()]
    _, usage_mounts, usage_volumes = _usage_parts(options)
    mounts += optional_mounts + usage_mounts
    volumes += optional_volumes + usage_volumes
    container = {
        "name": "node-agent",
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["node"],
        "env": env,
        "ports": [{"name": "metrics", "containerPort": options.metrics_port, "protocol": "TCP"}],
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 5},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": {"privileged": True},
        "volumeMounts": mounts,
    }
    pod: dict[str, Any] = {"serviceAccountName": service_account_name(options)}
    if options.priority_class_name:
        pod["priorityClassName"] = options.priority_class_name
    pod.update(_placement(options))
    pod["tolerations"] = [dict(toleration) for toleration in DEFAULT_TOLERATIONS]
    if options.usage_interval and options.usage_processes:
        # Processes' cgroups are read under /proc, which shows other pods' processes only here.
        pod["hostPID"] = True
    pod["containers"] = [container]
    pod["volumes"] = volumes
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": object_metadata(options, options.name, options.namespace),
        "spec": {
            "selector": {"matchLabels": selector_labels(options)},
            "updateStrategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": options.max_surge, "maxUnavailable": 1 - options.max_surge},
            },
            "template": {"metadata": {"labels": selector_labels(options)}, "spec": pod},
        },
    }
