"""How much of a device's capacity one allocation consumes (KEP-5075 consumable capacity).

The rules the scheduler applies (dynamic-resource-allocation `structured/`, consumable
capacity), written down so the allocator model charges exactly what the scheduler charges:
- Every capacity the device publishes is charged, not only the requested ones: a capacity the
  claim does not name costs the policy's `default`, or the whole value without a policy. That
  is why a shared GPU publishes its SM count as an attribute, not as a capacity.
- A requested amount without a policy is charged as requested.
- With `validRange`: below `min` rounds up to `min`; with a `step`, up to `min + k * step`.
- With `validValues` (ascending): up to the first value >= the request; above the last one the
  request stays as it is, and is then refused as a policy violation.
- After rounding the amount must obey the policy (equal to `default`, or within `max` and on
  the step grid, or one of the valid values), else the device does not fit the request.
- A request naming a capacity the device lacks never fits that device.
"""

from collections.abc import Mapping

import msgspec

from dra_driver.devices.model import Capacity


class Policy(msgspec.Struct, frozen=True):
    """A request policy in the API's full form; our devices only publish `validRange`."""

    default: int | None = None
    minimum: int | None = None
    maximum: int | None = None
    step: int | None = None
    valid_values: tuple[int, ...] = ()


class ModelCapacity(msgspec.Struct, frozen=True):
    value: int
    policy: Policy | None = None


def model_capacity(capacity: Capacity) -> ModelCapacity:
    policy = capacity.request_policy
    if policy is None:
        return ModelCapacity(capacity.value)
    valid = policy.valid_range
    return ModelCapacity(capacity.value, Policy(policy.default, valid.minimum, valid.maximum, valid.step))


def _rounded(requested: int, policy: Policy) -> int:
    if policy.minimum is not None:
        if requested < policy.minimum:
            return policy.minimum
        if policy.step is None:
            return requested
        steps = -(-(requested - policy.minimum) // policy.step)
        return policy.minimum + steps * policy.step
    if policy.valid_values:
        return next((value for value in policy.valid_values if value >= requested), requested)
    return requested


def charged_amount(requested: int | None, capacity: ModelCapacity) -> int:
    """What one allocation is charged for this capacity, before the policy check."""
    policy = capacity.policy
    if requested is None:
        return policy.default if policy is not None and policy.default is not None else capacity.value
    return requested if policy is None else _rounded(requested, policy)


def violates(amount: int, policy: Policy | None) -> bool:
    if policy is None or amount == policy.default:
        return False
    if policy.minimum is not None:
        if policy.maximum is not None and amount > policy.maximum:
            return True
        return policy.step is not None and (amount - policy.minimum) % policy.step != 0
    if policy.valid_values:
        return amount not in policy.valid_values
    return False


def charges(requests: Mapping[str, int], capacities: Mapping[str, ModelCapacity]) -> dict[str, int] | None:
    """What an allocation is charged per capacity; None when the device cannot serve the request
    (it lacks a requested capacity, or an amount breaks the policy)."""
    if any(name not in capacities for name in requests):
        return None
    charged = {}
    for name, capacity in capacities.items():
        amount = charged_amount(requests.get(name), capacity)
        if violates(amount, capacity.policy):
            return None
        charged[name] = amount
    return charged
