"""A ValidatingAdmissionPolicy run the way the API server runs it, its CEL evaluated by the real
CEL engine (cel-expr-python): match constraints, match conditions, the variables in order (each
may read the ones before), then the validations. The policy tests share it so that each tests
its own policy's rules, not its own reading of how a policy is evaluated."""

from collections.abc import Mapping
from functools import cache
from typing import Any

from cel_expr_python import cel

from dra_driver.tools.manifests import NODE_NAME_EXTRA

# Set beside NODE_NAME_EXTRA on a pod-bound service-account token.
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
_MAP = cel.Type.Map(cel.Type.STRING, cel.Type.DYN)


@cache
def _environment() -> cel.Env:
    """`request`, `object`, `oldObject` and `variables` as maps, as the API server binds them
    (with typed objects there; the expressions read the same fields)."""
    return cel.NewEnv(
        variables={"request": _MAP, "object": cel.Type.DYN, "oldObject": cel.Type.DYN, "variables": _MAP}
    )


def evaluate(expression: str, data: Mapping[str, Any]) -> Any:
    """Plain Python values, so that a variable's value can feed the next expression."""
    result = _environment().compile(expression).eval(data=dict(data))
    assert result.type() != cel.Type.ERROR, f"{expression!r} failed: {result.value()}"
    return result.plain_value()


def user_info(username: str, node: str | None, pod: str | None = None) -> dict[str, Any]:
    """A token's user as the API server hands it to CEL; `node` and `pod`: what a pod-bound
    service-account token names (node None: a token bound to no pod, so it names neither)."""
    extra: dict[str, list[str]] = {}
    if node:
        extra[NODE_NAME_EXTRA] = [node]
        if pod:
            extra[POD_NAME_EXTRA] = [pod]
    return {"username": username, "extra": extra}


def denials(
    policy: Mapping[str, Any],
    resource: str,
    request: Mapping[str, Any],
    new: Any,
    old: Any,
) -> list[str] | None:
    """The messages the API server denies `request` (operation and userInfo) on `resource` with,
    `new` and `old` being `object` and `oldObject` (None where the operation has none); an empty
    list admits it, None says the policy does not apply to it at all."""
    spec = policy["spec"]
    operation = request["operation"]
    if not any(
        operation in rule["operations"] and resource in rule["resources"]
        for rule in spec["matchConstraints"]["resourceRules"]
    ):
        return None
    data: dict[str, Any] = {"request": request, "object": new, "oldObject": old, "variables": {}}
    if not all(evaluate(condition["expression"], data) for condition in spec.get("matchConditions", [])):
        return None
    for variable in spec.get("variables", []):
        data["variables"] = {**data["variables"], variable["name"]: evaluate(variable["expression"], data)}
    return [
        evaluate(validation["messageExpression"], data)
        if "messageExpression" in validation
        else validation["message"]
        for validation in spec["validations"]
        if evaluate(validation["expression"], data) is not True
    ]
