"""The ValidatingAdmissionPolicy on users' ResourceClaims and ResourceClaimTemplates: claim
shapes that the scheduler would allocate and prepare would then refuse are refused when the
claim is created, so the user hears it from kubectl instead of finding a pod stuck in
ContainerCreating (docs/preparable.md lists every such rule and where it lives).

The rules read the claim's spec only, never a node: they hold on every node this installation
serves. Three of prepare's rules are here:

- A claim that asks for a vGPU share asks for no other device of this driver, and for one
  share (admin access aside). Under `vgpu.enforcement: mps`, the default, a process reaches one
  MPS server and sees only its GPU (claims/vgpu_grant.py); a claim cannot see a node's
  enforcement, so on clusters whose every vGPU GPU runs `hami-core` or `none` the operator may
  turn the policy off (chart value `claimPolicy.enabled`).
- An opaque config of this driver names our API version and one of our kinds, and a kind that
  fits the class of every request it applies to (GpuConfig: whole GPUs, MigDeviceConfig: MIG,
  VgpuConfig: vGPUs; claims/opaque_config.py).
- A claim that gives one request of whole GPUs or MIG devices sharing strategy MPS gives it to
  every such request (claims/sharing/sharing.py: one MPS daemon serves the claim, and a process
  that reaches it sees only its devices). Only `exactly` requests are read: which alternative of
  a `firstAvailable` request the scheduler picks is not known here, so prepare keeps that case.

Requests are read through API version v1 (requests to other versions are converted, the
default `matchPolicy: Equivalent`).
"""

from typing import Any

from dra_driver.claims.opaque_config import API_VERSION
from dra_driver.devices.classes import SHARING_CLASSES, class_name, sharing_class_name
from dra_driver.devices.model import DeviceType
from dra_driver.tools.manifests.access import deny_binding
from dra_driver.tools.manifests.options import ManifestOptions, object_metadata

# An opaque config kind -> the device type of the class it belongs to.
KIND_TYPES: dict[str, DeviceType] = {"GpuConfig": "gpu", "MigDeviceConfig": "mig", "VgpuConfig": "vgpu"}
TYPES: tuple[DeviceType, ...] = ("gpu", "mig", "vgpu")


def claim_policy_name(options: ManifestOptions) -> str:
    return f"{options.driver_name}-claim-shapes"


def _classes_of_type(device_type: DeviceType, options: ManifestOptions) -> list[str]:
    """The shipped classes of one device type: the type's, and for whole GPUs the sharing ones."""
    sharing = [sharing_class_name(prefix, options.driver_name) for prefix in SHARING_CLASSES]
    return [class_name(device_type, options.driver_name), *(sharing if device_type == "gpu" else [])]


def _cel_list(names: list[str]) -> str:
    return "[" + ", ".join(f'"{name}"' for name in names) + "]"


def _our_classes(options: ManifestOptions) -> str:
    """The shipped classes, as a CEL list."""
    return _cel_list([name for device_type in TYPES for name in _classes_of_type(device_type, options)])


def _classes_of_kind(options: ManifestOptions) -> str:
    """Config kind -> the classes it fits, as a CEL map of lists."""
    pairs = (
        f'"{kind}": {_cel_list(_classes_of_type(device_type, options))}'
        for kind, device_type in KIND_TYPES.items()
    )
    return "{" + ", ".join(pairs) + "}"


def _class_strategies(options: ManifestOptions) -> str:
    """The sharing classes' own strategies, as a CEL map: what a request of one has when no
    config of the claim applies to it."""
    pairs = (
        f'"{sharing_class_name(prefix, options.driver_name)}": "{sharing["strategy"]}"'
        for prefix, sharing in SHARING_CLASSES.items()
    )
    return "{" + ", ".join(pairs) + "}"


def _variables(options: ManifestOptions) -> list[dict[str, str]]:
    ours = _our_classes(options)
    vgpu = class_name("vgpu", options.driver_name)
    whole_or_mig = _cel_list([*_classes_of_type("gpu", options), class_name("mig", options.driver_name)])
    not_admin = "!(has(r.exactly) && has(r.exactly.adminAccess) && r.exactly.adminAccess)"
    return [
        {
            "name": "spec",
            "expression": 'object.kind == "ResourceClaimTemplate" ? object.spec.spec : object.spec',
        },
        {
            "name": "requests",
            "expression": "has(variables.spec.devices) && has(variables.spec.devices.requests)"
            " ? variables.spec.devices.requests : []",
        },
        {
            "name": "configs",
            "expression": "has(variables.spec.devices) && has(variables.spec.devices.config)"
            " ? variables.spec.devices.config.filter(c, has(c.opaque) && "
            f'c.opaque.driver == "{options.driver_name}") : []',
        },
        {
            "name": "ours",
            "expression": f"variables.requests.filter(r, {not_admin} && ("
            f"(has(r.exactly) && r.exactly.deviceClassName in {ours}) || "
            f"(has(r.firstAvailable) && r.firstAvailable.exists(s, s.deviceClassName in {ours}))))",
        },
        {
            "name": "strategies",
            "expression": "variables.ours.filter(r, has(r.exactly) && "
            f"r.exactly.deviceClassName in {whole_or_mig}).map(r, {_strategy_of('r', options)})",
        },
        {
            "name": "asksForAShare",
            "expression": "variables.ours.exists(r, "
            f'(has(r.exactly) && r.exactly.deviceClassName == "{vgpu}") || '
            f'(has(r.firstAvailable) && r.firstAvailable.exists(s, s.deviceClassName == "{vgpu}")))',
        },
    ]


def _one_device(request: str) -> str:
    return (
        f'(!has({request}.allocationMode) || {request}.allocationMode == "ExactCount")'
        f" && (!has({request}.count) || {request}.count == 1)"
    )


def _share_alone() -> str:
    """No request of ours but the share's, and that one for one device."""
    return (
        "!variables.asksForAShare || (size(variables.ours) == 1 && variables.ours.all(r, "
        f"(!has(r.exactly) || ({_one_device('r.exactly')})) && "
        f"(!has(r.firstAvailable) || r.firstAvailable.all(s, {_one_device('s')}))))"
    )


def _strategy_of(request: str, options: ManifestOptions) -> str:
    """The sharing strategy in force for `request` ("" for none): the last config entry of the
    claim that applies to it wins outright (claims/opaque_config.py effective_config); without
    one, its class's (the sharing classes carry a config, the others none)."""
    applying = (
        "variables.configs.filter(c, !has(c.requests) || size(c.requests) == 0 || "
        f"{request}.name in c.requests)"
    )
    strategy = (
        "has(c.opaque.parameters) && has(c.opaque.parameters.sharing) && "
        'has(c.opaque.parameters.sharing.strategy) ? string(c.opaque.parameters.sharing.strategy) : ""'
    )
    defaults = _class_strategies(options)
    named = f"{request}.exactly.deviceClassName"
    of_class = f'({named} in {defaults} ? {defaults}[{named}] : "")'
    return f"size({applying}) == 0 ? {of_class} : {applying}.map(c, {strategy})[size({applying}) - 1]"


def _mps_all_or_none() -> str:
    return '!("MPS" in variables.strategies) || variables.strategies.all(s, s == "MPS")'


def _config_fits(options: ManifestOptions) -> str:
    """Every config entry of ours: our API version, one of our kinds, and a kind whose class is
    that of every request of ours it applies to (all requests when it names none)."""
    classes, ours = _classes_of_kind(options), _our_classes(options)
    applies = (
        "(has(c.requests) && size(c.requests) > 0"
        " ? variables.requests.filter(r, r.name in c.requests) : variables.requests)"
    )
    fits = f"{classes}[c.opaque.parameters.kind]"
    return (
        "variables.configs.all(c, has(c.opaque.parameters) && "
        f'has(c.opaque.parameters.apiVersion) && c.opaque.parameters.apiVersion == "{API_VERSION}" && '
        f"has(c.opaque.parameters.kind) && c.opaque.parameters.kind in {classes} && "
        f"{applies}.all(r, (!has(r.exactly) || !(r.exactly.deviceClassName in {ours}) || "
        f"r.exactly.deviceClassName in {fits}) && "
        f"(!has(r.firstAvailable) || r.firstAvailable.all(s, !(s.deviceClassName in {ours}) || "
        f"s.deviceClassName in {fits}))))"
    )


def claim_policy(options: ManifestOptions) -> dict[str, Any]:
    driver, vgpu = options.driver_name, class_name("vgpu", options.driver_name)
    kinds = "; ".join(
        f"{kind} for {', '.join(_classes_of_type(t, options))}" for kind, t in KIND_TYPES.items()
    )
    rule = {
        "apiGroups": ["resource.k8s.io"],
        "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["resourceclaims", "resourceclaimtemplates"],
    }
    share_alone = (
        f"a claim that asks for a vGPU share (class {vgpu}) may ask for no other device of {driver} and "
        "for one share only: under vgpu.enforcement mps a process reaches one GPU's MPS server; put "
        "the other devices in a claim of their own"
    )
    config_fits = (
        f"an opaque config of {driver} needs apiVersion {API_VERSION} and the kind of the class of "
        f"every request it applies to ({kinds})"
    )
    mps_all_or_none = (
        f"a claim whose config or class gives a request of whole GPUs or MIG devices of {driver} "
        "sharing strategy MPS must give it to all of them: a process that reaches an MPS server sees "
        "only that server's devices; give every request the same strategy"
    )
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": object_metadata(options, claim_policy_name(options)),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [rule]},
            "variables": _variables(options),
            "validations": [
                {"expression": _share_alone(), "message": share_alone, "reason": "Invalid"},
                {"expression": _config_fits(options), "message": config_fits, "reason": "Invalid"},
                {"expression": _mps_all_or_none(), "message": mps_all_or_none, "reason": "Invalid"},
            ],
        },
    }


def claim_policy_binding(options: ManifestOptions) -> dict[str, Any]:
    return deny_binding(options, claim_policy_name(options))
