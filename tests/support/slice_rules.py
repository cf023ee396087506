"""The API server's ResourceSlice rules (CONTRACTS.md §4), written out independently of the
planner, so tests catch a plan the server would reject. Works on the rendered objects."""

import re
from collections import Counter
from typing import Any

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _qualified_name_problem(name: str) -> str | None:
    domain, slash, identifier = name.rpartition("/")
    if not C_IDENTIFIER.fullmatch(identifier):
        return f"{identifier!r} is not a C identifier of at most 32 characters"
    if slash and (len(domain) > 63 or not DNS_SUBDOMAIN.fullmatch(domain)):
        return f"domain {domain!r} is not a DNS subdomain of at most 63 characters"
    return None


def _device_problems(device: dict[str, Any], layout: str) -> list[str]:
    name = device["name"]
    problems = []
    if not DNS_LABEL.fullmatch(name):
        problems.append(f"device name {name!r} is not a DNS label")
    attributes, capacity = device.get("attributes", {}), device.get("capacity", {})
    if len(attributes) + len(capacity) > 32:
        problems.append(f"{name}: more than 32 attributes and capacities")
    for key in [*attributes, *capacity]:
        if problem := _qualified_name_problem(key):
            problems.append(f"{name}: {problem}")
    for key, value in attributes.items():
        if len(value) != 1:
            problems.append(f"{name}: attribute {key} must have exactly one value field")
        text = value.get("string", value.get("version", ""))
        if len(text) > 64:
            problems.append(f"{name}: attribute {key} is longer than 64 characters")
    if "requestPolicy" in str(capacity) and not device.get("allowMultipleAllocations"):
        problems.append(f"{name}: requestPolicy without allowMultipleAllocations")
    consumptions = device.get("consumesCounters", [])
    if layout == "1.35" and len(consumptions) > 2:
        problems.append(f"{name}: more than 2 counter consumptions")
    if layout == "1.34" and sum(len(c["counters"]) for c in consumptions) > 32:
        problems.append(f"{name}: consumes more than 32 counters")
    for consumption in consumptions:
        for counter in consumption["counters"]:
            if not DNS_LABEL.fullmatch(counter):
                problems.append(f"{name}: counter name {counter!r} is not a DNS label")
    return problems


def _slice_problems(spec: dict[str, Any], layout: str) -> list[str]:
    devices, sets = spec.get("devices", []), spec.get("sharedCounters", [])
    problems = []
    small = any(d.get("consumesCounters") or d.get("taints") for d in devices)
    if len(devices) > (64 if small else 128):
        problems.append(f"{len(devices)} devices in one slice (small={small})")
    if layout == "1.35":
        if devices and sets:
            problems.append("a slice has both devices and sharedCounters")
        if len(sets) > 8:
            problems.append("more than 8 counter sets in one slice")
    else:
        if sum(len(s["counters"]) for s in sets) > 32:
            problems.append("more than 32 counters in one slice")
        consumed = sum(len(c["counters"]) for d in devices for c in d.get("consumesCounters", []))
        if consumed > 1024:
            problems.append("more than 1024 consumed counters in one slice")
        local = {s["name"] for s in sets}
        for device in devices:
            for consumption in device.get("consumesCounters", []):
                if consumption["counterSet"] not in local:
                    problems.append(f"{device['name']} consumes a counter set of another slice")
    for counter_set in sets:
        if not DNS_LABEL.fullmatch(counter_set["name"]) or len(counter_set["counters"]) > 32:
            problems.append(f"counter set {counter_set['name']} has a bad name or more than 32 counters")
    for device in devices:
        problems += _device_problems(device, layout)
    return problems


def pool_problems(slices: list[dict[str, Any]], layout: str) -> list[str]:
    """Everything in these slices that the API server or the scheduler would refuse."""
    problems = []
    pools = {(s["spec"]["pool"]["name"], s["spec"]["pool"]["generation"]) for s in slices}
    if len(pools) != 1:
        problems.append(f"slices disagree on the pool: {pools}")
    if any(s["spec"]["pool"]["resourceSliceCount"] != len(slices) for s in slices):
        problems.append("resourceSliceCount is not the number of slices")
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    sets = {c["name"]: c for s in slices for c in s["spec"].get("sharedCounters", [])}
    names = Counter(d["name"] for d in devices)
    problems += [f"device {name} appears {count} times" for name, count in names.items() if count > 1]
    set_names = Counter(c["name"] for s in slices for c in s["spec"].get("sharedCounters", []))
    problems += [
        f"counter set {name} appears {count} times" for name, count in set_names.items() if count > 1
    ]
    for device in devices:
        for consumption in device.get("consumesCounters", []):
            counter_set = sets.get(consumption["counterSet"])
            if counter_set is None:
                problems.append(f"{device['name']} consumes unknown counter set {consumption['counterSet']}")
            elif missing := set(consumption["counters"]) - set(counter_set["counters"]):
                problems.append(f"{device['name']} consumes unknown counters {sorted(missing)}")
    for planned in slices:
        problems += _slice_problems(planned["spec"], layout)
    return problems
