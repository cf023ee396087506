"""Trace files for `dra-driver plan --trace`: what they decode to, and the field each mistake names."""

import pytest

from dra_driver.packing.shapes import PodShape
from dra_driver.packing.trace_file import MAX_ARRIVALS, Trace, TraceError, parse_trace

SOURCE = "--trace t.yaml"


def test_durations_and_named_departures_become_ordered_events() -> None:
    trace = parse_trace(
        {
            "arrivals": [
                {"at": 10, "pod": "1g.10gb", "duration": 5},
                {"at": 0, "pod": "vgpu:10Gi/30%", "name": "a"},
                {"at": 15, "pod": "gpu", "name": "stays"},
            ],
            "departures": [{"at": 15, "name": "a"}],
        },
        SOURCE,
    )
    assert isinstance(trace, Trace) and trace.arrivals == 3
    assert [(event.seconds, event.pod, event.shape and event.shape.text) for event in trace.events] == [
        (0.0, 1, "vgpu:10Gi/30%"),
        (10.0, 0, "1g.10gb"),
        # Departures before arrivals at the same second: the device is free for the newcomer.
        (15.0, 0, None),
        (15.0, 1, None),
        (15.0, 2, "gpu"),
    ]
    assert trace.events[1].shape == PodShape("mig", "1g.10gb", profile="1g.10gb")


def test_an_arrival_may_ask_for_several_whole_gpus() -> None:
    trace = parse_trace(
        {"arrivals": [{"at": 0, "pod": "gpu:8", "duration": 60}, {"at": 1, "pod": " gpu:2 ", "name": "b"}]},
        SOURCE,
    )

    assert [event.shape for event in trace.events] == [
        PodShape("gpu", "gpu:8", devices=8),
        PodShape("gpu", "gpu:2", devices=2),
        None,
    ]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "--trace t.yaml: expected a mapping with arrivals, departures, got list"),
        ({"pods": []}, "--trace t.yaml.pods: unknown field; expected one of arrivals, departures"),
        ({}, "--trace t.yaml: arrivals: required"),
        ({"arrivals": {}}, "--trace t.yaml: arrivals: expected a list, got dict"),
        ({"arrivals": []}, f"--trace t.yaml: arrivals: expected 1 to {MAX_ARRIVALS} entries, got 0"),
        ({"arrivals": ["1g.10gb"]}, "--trace t.yaml: arrivals[0]: expected a mapping with at, pod"),
        ({"arrivals": [{"pod": "gpu", "duration": 1}]}, "arrivals[0].at: required"),
        ({"arrivals": [{"at": 0, "duration": 1}]}, "arrivals[0].pod: required"),
        (
            {"arrivals": [{"at": -1, "pod": "gpu", "duration": 1}]},
            "arrivals[0].at: expected a number of seconds >= 0, got -1",
        ),
        (
            {"arrivals": [{"at": True, "pod": "gpu", "duration": 1}]},
            "arrivals[0].at: expected a number of seconds, got True",
        ),
        (
            {"arrivals": [{"at": "0", "pod": "gpu", "duration": 1}]},
            "arrivals[0].at: expected a number of seconds, got '0'",
        ),
        (
            {"arrivals": [{"at": 0, "pod": "gpu", "duration": 0}]},
            "arrivals[0].duration: expected a number of seconds > 0, got 0",
        ),
        (
            {"arrivals": [{"at": 0, "pod": "gpu", "duration": float("inf")}]},
            "arrivals[0].duration: expected a number of seconds, got inf",
        ),
        (
            {"arrivals": [{"at": 0, "pod": 7, "duration": 1}]},
            "arrivals[0].pod: expected a pod kind such as 1g.10gb, got 7",
        ),
        (
            {"arrivals": [{"at": 0, "pod": "2x1g.10gb", "duration": 1}]},
            'arrivals[0].pod: kind "2x1g.10gb": expected gpu',
        ),
        ({"arrivals": [{"at": 0, "pod": "vgpu:10Gi/300%", "duration": 1}]}, "arrivals[0].pod"),
        (
            {"arrivals": [{"at": 0, "pod": "gpu", "duration": 1}, {"at": 0, "pod": "gpu:9", "duration": 1}]},
            'arrivals[1].pod: gpus "9": expected a whole number of GPUs from 1 to 8',
        ),
        (
            {"arrivals": [{"at": 0, "pod": "gpu:0", "duration": 1}]},
            'arrivals[0].pod: gpus "0": expected a whole number of GPUs from 1 to 8',
        ),
        (
            {"arrivals": [{"at": 0, "pod": "gpu"}]},
            "arrivals[0]: expected exactly one of duration (seconds) or name",
        ),
        (
            {"arrivals": [{"at": 0, "pod": "gpu", "duration": 1, "name": "a"}]},
            "arrivals[0]: expected exactly one of",
        ),
        (
            {"arrivals": [{"at": 0, "pod": "gpu", "size": 1}]},
            "arrivals[0].size: unknown field; expected one of at, pod, duration, name",
        ),
        (
            {"arrivals": [{"at": 0, "pod": "gpu", "name": ""}]},
            "arrivals[0].name: expected a non-empty string, got ''",
        ),
        (
            {"arrivals": [{"at": 0, "pod": "gpu", "name": "a"}, {"at": 1, "pod": "gpu", "name": "a"}]},
            "arrivals[1].name: 'a' already names arrivals[0]",
        ),
        (
            {"arrivals": [{"at": 0, "pod": "gpu", "name": "a"}], "departures": [{"at": 1, "name": "b"}]},
            "departures[0].name: 'b' names no arrival",
        ),
        (
            {
                "arrivals": [{"at": 0, "pod": "gpu", "name": "a"}],
                "departures": [{"at": 1, "name": "a"}, {"at": 2, "name": "a"}],
            },
            "departures[1].name: 'a' departs twice",
        ),
        (
            {"arrivals": [{"at": 5, "pod": "gpu", "name": "a"}], "departures": [{"at": 5, "name": "a"}]},
            "departures[0].at: expected a time after 'a' arrives (5), got 5",
        ),
        (
            {"arrivals": [{"at": 5, "pod": "gpu", "name": "a"}], "departures": [{"name": "a"}]},
            "departures[0].at: required",
        ),
        (
            {"arrivals": [{"at": 5, "pod": "gpu", "name": "a"}], "departures": [{"at": 6}]},
            "departures[0].name: required",
        ),
    ],
)
def test_a_bad_trace_names_the_field(raw: object, message: str) -> None:
    with pytest.raises(TraceError) as raised:
        parse_trace(raw, SOURCE)
    assert message in str(raised.value)
    assert str(raised.value).startswith(SOURCE)
