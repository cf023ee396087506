"""Trace files for `dra-driver plan --trace`: pods arriving and leaving over time, decoded and
checked here (pure: the command reads the YAML/JSON file, this module judges its content).

    arrivals:                 # required, 1..MAX_ARRIVALS entries
      - at: 0                 # seconds from the start, >= 0
        pod: 1g.10gb          # one pod, spelled as a --pods kind (no count); gpu:8: 8 GPUs
        duration: 3600        # seconds it holds its device, > 0; or:
      - at: 30
        pod: 3g.40gb
        name: train-a         # a name, and the departure below says when it leaves
    departures:               # optional
      - at: 900               # seconds from the start, > the arrival's `at`
        name: train-a

Each arrival has `duration` or `name` (not both); a named arrival without a departure stays
until the end. Departures come before arrivals at the same second, so a pod leaving at t frees
its device for a pod arriving at t. Every problem names its field (`arrivals[3].pod`).
"""

import math
from collections.abc import Mapping

import msgspec

from dra_driver.base.errors import OperatorFault
from dra_driver.packing.shapes import PodShape, ShapeError, parse_shape

MAX_ARRIVALS = 100_000
_ARRIVAL_KEYS = ("at", "pod", "duration", "name")


class TraceError(OperatorFault, ValueError):
    """The trace cannot be replayed: the message names the file and the field."""


class TraceEvent(msgspec.Struct, frozen=True):
    """An arrival of pod `pod` (its shape in `shape`) or its departure (`shape` None)."""

    seconds: float
    pod: int
    shape: PodShape | None


class Trace(msgspec.Struct, frozen=True):
    events: tuple[TraceEvent, ...]
    arrivals: int


def _seconds(value: object, where: str, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TraceError(f"{where}: expected a number of seconds, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise TraceError(
            f"{where}: expected a number of seconds {'> 0' if positive else '>= 0'}, got {value!r}"
        )
    return float(value)


def _mapping(value: object, where: str, keys: tuple[str, ...]) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise TraceError(f"{where}: expected a mapping with {', '.join(keys)}, got {type(value).__name__}")
    for key in value:
        if key not in keys:
            raise TraceError(f"{where}.{key}: unknown field; expected one of {', '.join(keys)}")
    return value


def _list(value: object, where: str) -> list[object]:
    if not isinstance(value, list):
        raise TraceError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _name(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise TraceError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def parse_trace(raw: object, source: str) -> Trace:
    """The trace in `raw` (the decoded file), or TraceError naming `source` and the field."""
    top = _mapping(raw, source, ("arrivals", "departures"))
    if "arrivals" not in top:
        raise TraceError(f"{source}: arrivals: required (a list of pods arriving)")
    arrivals = _list(top["arrivals"], f"{source}: arrivals")
    if not 1 <= len(arrivals) <= MAX_ARRIVALS:
        raise TraceError(f"{source}: arrivals: expected 1 to {MAX_ARRIVALS} entries, got {len(arrivals)}")
    events: list[TraceEvent] = []
    named: dict[str, tuple[int, float]] = {}
    for number, item in enumerate(arrivals):
        where = f"{source}: arrivals[{number}]"
        entry = _mapping(item, where, _ARRIVAL_KEYS)
        for required in ("at", "pod"):
            if required not in entry:
                raise TraceError(f"{where}.{required}: required")
        at = _seconds(entry["at"], f"{where}.at")
        pod = entry["pod"]
        if not isinstance(pod, str):
            raise TraceError(f"{where}.pod: expected a pod kind such as 1g.10gb, got {pod!r}")
        try:
            shape = parse_shape(pod.strip(), f"{where}.pod")
        except ShapeError as error:
            raise TraceError(str(error)) from error
        if ("duration" in entry) == ("name" in entry):
            raise TraceError(f"{where}: expected exactly one of duration (seconds) or name (and a departure)")
        events.append(TraceEvent(at, number, shape))
        if "duration" in entry:
            events.append(
                TraceEvent(at + _seconds(entry["duration"], f"{where}.duration", True), number, None)
            )
        else:
            name = _name(entry["name"], f"{where}.name")
            if name in named:
                raise TraceError(f"{where}.name: {name!r} already names arrivals[{named[name][0]}]")
            named[name] = (number, at)
    left: set[str] = set()
    for number, item in enumerate(_list(top.get("departures", []), f"{source}: departures")):
        where = f"{source}: departures[{number}]"
        entry = _mapping(item, where, ("at", "name"))
        for required in ("at", "name"):
            if required not in entry:
                raise TraceError(f"{where}.{required}: required")
        name = _name(entry["name"], f"{where}.name")
        if name not in named:
            raise TraceError(f"{where}.name: {name!r} names no arrival")
        if name in left:
            raise TraceError(f"{where}.name: {name!r} departs twice")
        left.add(name)
        pod, arrived = named[name]
        at = _seconds(entry["at"], f"{where}.at")
        if at <= arrived:
            raise TraceError(f"{where}.at: expected a time after {name!r} arrives ({arrived:g}), got {at:g}")
        events.append(TraceEvent(at, pod, None))
    events.sort(key=lambda event: (event.seconds, event.shape is not None, event.pod))
    return Trace(tuple(events), len(arrivals))
