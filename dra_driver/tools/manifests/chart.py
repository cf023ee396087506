"""The same installation as values of the Helm chart deploy/helm/dra-driver."""

from typing import Any

import yaml

from dra_driver.config.option_table import DEFAULT_HARDWARE
from dra_driver.tools.manifests.extended import mig_profiles
from dra_driver.tools.manifests.options import POD_RESOURCES_DIR, ManifestOptions
from dra_driver.tools.manifests.validation import check_options


def chart_values(options: ManifestOptions) -> dict[str, Any]:
    """The values of deploy/helm/dra-driver that install what `render(options)` renders (less the
    Namespace, which the chart leaves to `--create-namespace` or the operator), as the release
    `options.name` in the namespace `options.namespace`. tests/api/test_helm_chart.py proves the
    two agree; the e2e setup installs the chart with them."""
    check_options(options)
    repository, _, tag = options.image.rpartition(":")
    if not repository or "/" in tag:
        repository, tag = options.image, "latest"
    values: dict[str, Any] = {
        "driverName": options.driver_name,
        "image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
        "hardware": options.hardware if options.simulated_node is None else DEFAULT_HARDWARE,
        "driverRoot": options.driver_root,
        "kubeletRegistrarDir": options.registrar_dir,
        "kubeletPluginsDir": options.plugins_dir,
        "priorityClassName": options.priority_class_name,
        "updateStrategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": options.max_surge, "maxUnavailable": 1 - options.max_surge},
        },
        "logVerbosity": options.log_verbosity,
        "logFormat": options.log_format,
        "nodeConfigs": {name: yaml.safe_load(text) or {} for name, text in options.node_configs.items()},
        "hamiCore": {"library": options.hami_core_library or ""},
        "flushRecords": options.flush_records,
        "claimPolicy": {"enabled": options.claim_policy},
        "metrics": {"port": options.metrics_port},
        "extraEnv": [{"name": name, "value": value} for name, value in options.extra_env.items()],
        "usage": {
            "interval": options.usage_interval,
            "podResourcesDir": POD_RESOURCES_DIR,
            "processes": options.usage_processes,
        },
    }
    values["extendedResources"] = {
        "enabled": options.extended_resources,
        "migProfiles": list(mig_profiles(options)),
    }
    if options.simulated_node is not None:
        values["simulatedNode"] = yaml.safe_load(options.simulated_node)
    if options.node_selector:
        values["nodeSelector"] = dict(options.node_selector)
        values["affinity"] = None  # Helm merges maps into the defaults; null removes one
    return values
