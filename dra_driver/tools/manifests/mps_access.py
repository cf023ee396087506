"""What the agent may do with pods, for the MPS control daemon of each claim (issue 26): a Role
in its own namespace, and an admission policy that lets its token create and delete only daemon
pods on its own node, made the way `claims/sharing/mps_pod_spec.py` makes them.

RBAC alone cannot say which pods: whoever may create pods in a namespace may create any pod
there, and the agent's namespace admits privileged pods. The policy closes that: for the agent's
service account, a pod must be bound to the node the token names, carry the daemon's labels and
name (from a well-formed claim UID), run the agent's image with the daemon's command only, mount
the driver root read-only and the claim's MPS directory and nothing else, get no service account
token, and use none of the host's namespaces. `privileged` is allowed only with the real control
program (its MPS server opens the claim's GPU device nodes); the simulated daemon of a simulated
install (`python -m dra_driver.hardware.simulated_mps_control -f`, that module and no other
Python) must run unprivileged.
"""

from typing import Any

from dra_driver.claims.sharing.mps_pod_spec import (
    CLAIM_UID_LABEL,
    COMPONENT,
    COMPONENT_LABEL,
    POD_NAME_PREFIX,
)
from dra_driver.hardware import simulated_mps_control
from dra_driver.tools.manifests.access import agent_policy, deny_binding, service_account_name
from dra_driver.tools.manifests.options import (
    CONTAINER_DRIVER_ROOT,
    ManifestOptions,
    object_metadata,
)

_UID_PATTERN = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"


def _role_name(options: ManifestOptions) -> str:
    return f"{options.name}-mps-daemons"


def mps_role(options: ManifestOptions) -> dict[str, Any]:
    """Pods in the agent's own namespace only: create and delete its daemons, get/list/watch to
    find them again after a restart."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": object_metadata(options, _role_name(options), options.namespace),
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete"]}
        ],
    }


def mps_role_binding(options: ManifestOptions) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": object_metadata(options, _role_name(options), options.namespace),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": _role_name(options)},
        "subjects": [
            {"kind": "ServiceAccount", "name": service_account_name(options), "namespace": options.namespace}
        ],
    }


def _policy_name(options: ManifestOptions) -> str:
    return f"{options.driver_name}-mps-daemon-pods"


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _variables(options: ManifestOptions) -> list[dict[str, str]]:
    claim_uid = f'request.operation == "DELETE" ? {_claim_uid("oldObject")} : {_claim_uid("object")}'
    return [
        {"name": "image", "expression": _quoted(options.image)},
        {"name": "driverRoot", "expression": _quoted(CONTAINER_DRIVER_ROOT)},
        {"name": "hostDriverRoot", "expression": _quoted(options.driver_root)},
        {"name": "claimUID", "expression": claim_uid},
        {
            "name": "claimDirectory",
            "expression": f"{_quoted(f'/run/{options.name}/mps/')} + variables.claimUID",
        },
    ]


def _claim_uid(pod: str) -> str:
    return (
        f'(has({pod}.metadata.labels) && "{CLAIM_UID_LABEL}" in {pod}.metadata.labels'
        f' ? {pod}.metadata.labels["{CLAIM_UID_LABEL}"] : "")'
    )


def _is_daemon(pod: str) -> str:
    """The pod (`object`, or `oldObject` on DELETE) is a daemon pod of a claim, on the agent's node.
    Written out for each: a variable cannot hold either object."""
    return (
        f"(has({pod}.spec.nodeName) && {pod}.spec.nodeName == variables.nodeName"
        f' && has({pod}.metadata.labels) && "{COMPONENT_LABEL}" in {pod}.metadata.labels'
        f' && {pod}.metadata.labels["{COMPONENT_LABEL}"] == "{COMPONENT}"'
        f" && variables.claimUID.matches({_quoted(_UID_PATTERN)})"
        f' && {pod}.metadata.name == "{POD_NAME_PREFIX}" + variables.claimUID)'
    )


# Each (rule, message) holds for CREATE and UPDATE; on DELETE only the pod's identity counts.
_REAL_COMMAND = (
    'size(c.command) == 2 && c.command[1] == "-f" && c.command[0].startsWith(variables.driverRoot + "/")'
    ' && c.command[0].endsWith("/nvidia-cuda-mps-control") && !c.command[0].contains("/..")'
)
_PRIVILEGED = "has(c.securityContext) && has(c.securityContext.privileged) && c.securityContext.privileged"
_SIMULATED_COMMAND = (
    'size(c.command) == 4 && c.command[0].matches("^/[^ ]*/python3(\\\\.[0-9]+)?$")'
    f' && c.command[1] == "-m" && c.command[2] == "{simulated_mps_control.MODULE}"'
    f' && c.command[3] == "-f" && !({_PRIVILEGED})'
)
_CREATE_RULES = (
    (
        "size(object.spec.containers) == 1 && !has(object.spec.initContainers)"
        " && !has(object.spec.ephemeralContainers)",
        "one container, no init or ephemeral containers",
    ),
    ("object.spec.containers.all(c, c.image == variables.image)", "the agent's own image"),
    (
        "object.spec.containers.all(c, !has(c.args) && has(c.command)"
        f" && (({_REAL_COMMAND}) || ({_SIMULATED_COMMAND})))",
        "the daemon's command (the driver root's nvidia-cuda-mps-control -f) and no args",
    ),
    (
        "object.spec.containers.all(c, !has(c.securityContext) || !has(c.securityContext.capabilities))"
        " && !(has(object.spec.securityContext) && has(object.spec.securityContext.sysctls))",
        "no added capabilities or sysctls",
    ),
    (
        "!(has(object.spec.hostNetwork) && object.spec.hostNetwork)"
        " && !(has(object.spec.hostPID) && object.spec.hostPID)"
        " && !(has(object.spec.hostIPC) && object.spec.hostIPC)",
        "none of the host's network, PID or IPC namespaces",
    ),
    (
        "has(object.spec.volumes) && size(object.spec.volumes) == 3 && object.spec.volumes.all(v,"
        " has(v.hostPath) && (v.hostPath.path == variables.hostDriverRoot"
        " || v.hostPath.path == variables.claimDirectory"
        ' || v.hostPath.path == variables.claimDirectory + "/shm"))',
        "only the driver root and the claim's MPS directory (pipes, logs, shm) from the host",
    ),
    (
        "object.spec.volumes.all(v, v.hostPath.path != variables.hostDriverRoot"
        " || object.spec.containers.all(c, !has(c.volumeMounts)"
        " || c.volumeMounts.all(m, m.name != v.name || (has(m.readOnly) && m.readOnly))))",
        "the driver root mounted read-only",
    ),
    (
        "has(object.spec.automountServiceAccountToken) && !object.spec.automountServiceAccountToken",
        "no service account token",
    ),
)


def mps_admission_policy(options: ManifestOptions) -> dict[str, Any]:
    pods = {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE", "DELETE"],
        "resources": ["pods"],
    }
    validations: list[dict[str, str]] = [
        {
            "expression": (
                f'request.operation == "DELETE" ? {_is_daemon("oldObject")} : {_is_daemon("object")}'
            ),
            "messageExpression": (
                '"the node agent on " + variables.nodeName + " may only create and delete MPS daemon pods'
                " (label "
                + f"{COMPONENT_LABEL}={COMPONENT}"
                + ', name mps-<claim UID>) bound to its own node"'
            ),
            "reason": "Forbidden",
        },
    ]
    validations += [
        {
            "expression": f'request.operation == "DELETE" || ({rule})',
            "message": f"an MPS daemon pod of the node agent must have {what}",
            "reason": "Forbidden",
        }
        for rule, what in _CREATE_RULES
    ]
    return agent_policy(options, _policy_name(options), pods, _variables(options), validations)


def mps_admission_policy_binding(options: ManifestOptions) -> dict[str, Any]:
    return deny_binding(options, _policy_name(options))
