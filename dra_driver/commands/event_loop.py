"""The event loop every command runs its coroutines on: uvloop's.

The node agent's work is many small socket exchanges (kubelet's gRPC calls, the claim GET, the
API watches), and the standard loop does the bookkeeping of each in Python: its scheduling,
selector and stream transports. uvloop does the same in C; under it a 1-claim prepare and
unprepare costs the whole agent 2.5 M instead of 3.1 M instructions, an 8-claim call 14.4 M
instead of 15.5 M (docs/benchmarks-history.md, issue 31's eighth round). The other commands run on it
too, so that the demo, which assembles the agent as a node does, and the test suite
(tests/conftest.py) see the loop the agent runs on.

Two things differ from the standard loop, and the agent avoids both: libuv starts child
processes with fork(), which runs gRPC's fork handlers in the child (children of a process with
busy gRPC threads crashed), so the agent starts its programs from worker threads through
`subprocess` (hardware/time_slicing.py, claims/sharing/mps.py); and a write to a transport that
is already closed raises RuntimeError, so a pooled connection is checked before it is used
(kube/kube_http.py).
"""

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

_Result = TypeVar("_Result")


def run_coroutine(main: Coroutine[Any, Any, _Result]) -> _Result:
    """`asyncio.run` on a fresh uvloop loop: the same cancellation of what is left and the same
    shutdown of async generators and the default executor when `main` ends. uvloop is imported
    here, not with the module: a command's parser, `--help` included, does without it."""
    from uvloop import new_event_loop  # noqa: PLC0415

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
