"""Who the agent is and what it may do: its namespace, service account, RBAC, and the admission
policies that confine its ResourceSlice and ResourceClaim status writes to its own node (the
package docstring says why)."""

from typing import Any

from dra_driver.tools.manifests.options import DEFAULT_NAME, NODE_NAME_EXTRA, ManifestOptions, object_metadata


def namespace_object(options: ManifestOptions) -> dict[str, Any]:
    """Pod Security admission must let the privileged agent in, whatever the cluster's default."""
    metadata = object_metadata(options, options.namespace)
    metadata["labels"]["pod-security.kubernetes.io/enforce"] = "privileged"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}


def service_account_name(options: ManifestOptions) -> str:
    return options.name


def service_account(options: ManifestOptions) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": object_metadata(options, service_account_name(options), options.namespace),
    }


def _cluster_role_name(options: ManifestOptions) -> str:
    """Named after the driver, so that two installations under different names keep their own."""
    return f"{options.driver_name}-node-agent"


def cluster_role(options: ManifestOptions) -> dict[str, Any]:
    """Exactly what the agent calls: GET of a claim it prepares, its own Node (read and watched
    for the label that names its node config), its slices' sync (list/watch, get, create, update,
    delete) and events (in the core group, which it posts and, repeated, patches).

    Plus the claim status it writes after prepare (claims/status/status_writer.py: PUT of the status
    subresource, so `update` only). Since 1.36 (DRAResourceClaimGranularStatusAuthorization, beta
    and on) the API server also authorizes a change of status.devices against the synthetic
    subresource `resourceclaims/driver`, named by the driver, with the verb prefixed
    `associated-node:` when the writer's service-account token is bound to the node the claim
    is allocated on: granted for our driver's name only. Older servers ignore that rule."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": object_metadata(options, _cluster_role_name(options)),
        "rules": [
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["resourceslices"],
                "verbs": ["get", "list", "watch", "create", "update", "delete"],
            },
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"], "verbs": ["update"]},
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["resourceclaims/driver"],
                "resourceNames": [options.driver_name],
                "verbs": ["associated-node:update"],
            },
        ],
    }


def cluster_role_binding(options: ManifestOptions) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": object_metadata(options, _cluster_role_name(options)),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": _cluster_role_name(options),
        },
        "subjects": [
            {
                "kind": "ServiceAccount",
                "name": service_account_name(options),
                "namespace": options.namespace,
            }
        ],
    }


def service_account_username(namespace: str, name: str = DEFAULT_NAME) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def _policy_name(options: ManifestOptions) -> str:
    return f"{options.driver_name}-node-slices"


def _slice_on_the_agents_node(slice_variable: str) -> str:
    return f"has({slice_variable}.spec.nodeName) && {slice_variable}.spec.nodeName == variables.nodeName"


def node_name_variable() -> dict[str, str]:
    """The node the agent's pod-bound service-account token names; empty for any other token."""
    return {
        "name": "nodeName",
        "expression": (
            f'has(request.userInfo.extra) && "{NODE_NAME_EXTRA}" in request.userInfo.extra'
            f' && size(request.userInfo.extra["{NODE_NAME_EXTRA}"]) > 0'
            f' ? request.userInfo.extra["{NODE_NAME_EXTRA}"][0] : ""'
        ),
    }


# What every policy on the agent's token checks first: a token with no node names no node.
_BOUND_TO_A_NODE = {
    "expression": 'variables.nodeName != ""',
    "message": "the node agent's service-account token must be bound to a pod on a node",
    "reason": "Forbidden",
}


def agent_policy(
    options: ManifestOptions,
    name: str,
    resource_rule: dict[str, list[str]],
    variables: list[dict[str, str]],
    validations: list[dict[str, str]],
) -> dict[str, Any]:
    """A ValidatingAdmissionPolicy on the node agent's own token only (the match condition keeps
    it off everyone else, the scheduler and admins included), failing closed. Every such policy
    needs the node the token names, so `variables.nodeName` comes first and the token must name
    one before `validations` run."""
    username = service_account_username(options.namespace, service_account_name(options))
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": object_metadata(options, name),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [resource_rule]},
            "matchConditions": [
                {"name": "is-the-node-agent", "expression": f'request.userInfo.username == "{username}"'}
            ],
            "variables": [node_name_variable(), *variables],
            "validations": [dict(_BOUND_TO_A_NODE), *validations],
        },
    }


def deny_binding(options: ManifestOptions, name: str) -> dict[str, Any]:
    """Deny is the only action: a policy that merely warned would confine nothing."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": object_metadata(options, name),
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }


def admission_policy(options: ManifestOptions) -> dict[str, Any]:
    """Only the agent's own node's slices, checked on the new object (CREATE, UPDATE) and the old
    one (UPDATE, DELETE), so that the agent can neither write a slice onto another node nor move
    or delete one that is there. A token without the node claim (not pod-bound) writes nothing."""
    rule = {
        "apiGroups": ["resource.k8s.io"],
        "apiVersions": ["*"],
        "operations": ["CREATE", "UPDATE", "DELETE"],
        "resources": ["resourceslices"],
    }
    validations = [
        {
            "expression": f'request.operation == "DELETE" || ({_slice_on_the_agents_node("object")})',
            "messageExpression": (
                '"the node agent on " + variables.nodeName + " may only write ResourceSlices of its own node"'
            ),
            "reason": "Forbidden",
        },
        {
            "expression": f'request.operation == "CREATE" || ({_slice_on_the_agents_node("oldObject")})',
            "messageExpression": (
                '"the node agent on " + variables.nodeName'
                ' + " may only change or delete ResourceSlices of its own node"'
            ),
            "reason": "Forbidden",
        },
    ]
    return agent_policy(options, _policy_name(options), rule, [], validations)


def admission_policy_binding(options: ManifestOptions) -> dict[str, Any]:
    return deny_binding(options, _policy_name(options))


def _claim_status_policy_name(options: ManifestOptions) -> str:
    return f"{options.driver_name}-node-claim-status"


# The allocation pins the claim to the agent's node: every term of its node selector requires
# metadata.name In [that node], as the scheduler writes it for devices of a node-local slice.
_ALLOCATED_ON_THE_AGENTS_NODE = (
    "has(oldObject.status) && has(oldObject.status.allocation)"
    " && has(oldObject.status.allocation.nodeSelector)"
    " && size(oldObject.status.allocation.nodeSelector.nodeSelectorTerms) > 0"
    " && oldObject.status.allocation.nodeSelector.nodeSelectorTerms.all(term,"
    " has(term.matchFields) && term.matchFields.exists(field,"
    ' field.key == "metadata.name" && field.operator == "In" && field.values == [variables.nodeName]))'
)
_BINDING_UNCHANGED = (
    "has(object.status.allocation) && object.status.allocation == oldObject.status.allocation"
    " && (has(object.status.reservedFor) ? object.status.reservedFor : [])"
    " == (has(oldObject.status.reservedFor) ? oldObject.status.reservedFor : [])"
)


def claim_status_policy(options: ManifestOptions) -> dict[str, Any]:
    """The agent may write status only of claims allocated on its own node, and there only the
    status.devices entries of its own driver: the allocation, the consumers and every other
    driver's entries stay as they were. Kubernetes 1.36 checks the node itself (RBAC above),
    but 1.34 and 1.35 grant `resourceclaims/status` for every claim and every field, so this is
    what keeps a compromised agent from rewriting other nodes' claims there."""
    driver = options.driver_name
    others = 'has({0}.status.devices) ? {0}.status.devices.filter(d, d.driver != "' + driver + '") : []'
    rule = {
        "apiGroups": ["resource.k8s.io"],
        "apiVersions": ["*"],
        "operations": ["UPDATE"],
        "resources": ["resourceclaims/status"],
    }
    variables = [
        {"name": "otherDevices", "expression": others.format("object")},
        {"name": "otherDevicesBefore", "expression": others.format("oldObject")},
    ]
    validations = [
        {
            "expression": _ALLOCATED_ON_THE_AGENTS_NODE,
            "messageExpression": (
                '"the node agent on " + variables.nodeName'
                ' + " may only write the status of claims allocated on its own node"'
            ),
            "reason": "Forbidden",
        },
        {
            "expression": _BINDING_UNCHANGED,
            "message": "the node agent may not change a claim's allocation or reservedFor",
            "reason": "Forbidden",
        },
        {
            "expression": "variables.otherDevices == variables.otherDevicesBefore",
            "message": f"the node agent may only change the status.devices entries of {driver}",
            "reason": "Forbidden",
        },
    ]
    return agent_policy(options, _claim_status_policy_name(options), rule, variables, validations)


def claim_status_policy_binding(options: ManifestOptions) -> dict[str, Any]:
    return deny_binding(options, _claim_status_policy_name(options))
