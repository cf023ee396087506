"""Telling the operator about node config problems: a log line, a Warning Event on the Node
(where `kubectl describe node` shows it) and the `dra_driver_node_config_problems` metric.

Each problem is logged and posted once while it lasts, not on every re-plan; one that goes away
and comes back is reported again.
"""

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import structlog

from dra_driver.devices.config_files import ConfigChoice
from dra_driver.devices.node_config import ConfigProblem
from dra_driver.hardware.model import Gpu
from dra_driver.observability.metrics import AgentMetrics

log = structlog.get_logger("dra_driver.node_config")

# Event reasons: a config that cannot be applied to a GPU, and one that cannot be used at all.
REASON_DOES_NOT_FIT = "NodeConfigDoesNotFit"
REASON_INVALID = "NodeConfigInvalid"

# Posts a Warning Event on the Node: (reason, message).
PostEvent = Callable[[str, str], Coroutine[Any, Any, None]]


def problem_text(node_name: str, choice: ConfigChoice, problem: ConfigProblem) -> str:
    """One line naming the node, the config, the setting and (for a misfit) the GPU left out."""
    if problem.gpu is None:
        return f"node {node_name}: {problem.message}"
    return (
        f"node {node_name}: {choice.origin}: {problem.message}; GPU {problem.gpu.index} is left out "
        "(offers no devices) until its config fits"
    )


class ProblemReporter:
    def __init__(self, node_name: str, metrics: AgentMetrics, post_event: PostEvent | None) -> None:
        self._node_name = node_name
        self._metrics = metrics
        self._post_event = post_event
        self._reported: frozenset[str] = frozenset()
        self._waiting: frozenset[str] = frozenset()
        self._background: set[asyncio.Task[None]] = set()

    def report(self, choice: ConfigChoice, problems: Sequence[ConfigProblem], waiting: Sequence[Gpu]) -> None:
        self._metrics.set_node_config(choice.name, problems)
        texts = {problem.message: problem_text(self._node_name, choice, problem) for problem in problems}
        for problem in problems:
            if problem.message in self._reported:
                continue
            text = texts[problem.message]
            log.error(
                "node config problem; nothing is offered from what it covers",
                problem=text,
                setting=problem.setting,
                gpu_index=None if problem.gpu is None else problem.gpu.index,
                gpu_uuid=None if problem.gpu is None else problem.gpu.uuid,
            )
            self._post(REASON_INVALID if problem.gpu is None else REASON_DOES_NOT_FIT, text)
        if self._reported and not problems:
            log.info("node config problems resolved", config=choice.origin)
        self._reported = frozenset(texts)
        self._report_waiting(waiting)

    def _report_waiting(self, waiting: Sequence[Gpu]) -> None:
        now = frozenset(gpu.uuid for gpu in waiting)
        for gpu in waiting:
            if gpu.uuid not in self._waiting:
                log.warning(
                    "GPU offers nothing until the claims that use it are unprepared; then its new "
                    "config applies",
                    gpu=gpu.label,
                )
        for uuid in self._waiting - now:
            log.info("GPU no longer waits for its claims", gpu_uuid=uuid)
        self._waiting = now

    def _post(self, reason: str, message: str) -> None:
        if self._post_event is None:
            return
        task = asyncio.get_running_loop().create_task(self._post_event(reason, message))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self) -> None:
        """Waits for Events still being posted (tests; a stopping agent)."""
        await asyncio.gather(*self._background, return_exceptions=True)
