"""Changing a running agent's node config: named configs followed through the Node's label and
the config directory, and the re-plan that a change leads to.

A change is applied in-process (no restart): prepared claims keep their records and are
unprepared from them as always. One case is not safe to apply at once: a GPU whose plan changes
while claims use it. Its new devices would not collide with the old ones by name (a whole
`gpu-3` and a share of `gpu-3` are different devices to the scheduler and to the engine's
exclusivity check), so a new claim could be handed the GPU under the new mode while a claim of
the old mode still runs on it. Such a GPU offers nothing ("waiting") until its last claim is
unprepared, then the new plan applies. The agent's start is not covered: it cannot know the plan
its predecessor published, so a config changed while the agent was down applies as it starts.
"""

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import msgspec
import structlog
from msgspec.structs import replace

from dra_driver.agent.node_watch import NodeFacts
from dra_driver.claims.effect_entries import MigInstanceEntry, TimeSliceEntry
from dra_driver.claims.records import ClaimRecord
from dra_driver.config.node_config_files import config_names, read_config_text
from dra_driver.devices.config_files import (
    ConfigChoice,
    choose_config,
    config_path,
    label_problem,
    unreadable,
)
from dra_driver.devices.naming import parse_device_name
from dra_driver.devices.node_config import ConfigProblem, GpuPlan, plan_node
from dra_driver.hardware.model import Gpu
from dra_driver.publish.capabilities import fall_back
from dra_driver.publish.desired import ApiCapabilities

log = structlog.get_logger("dra_driver.node_configs")

# How often the chosen file is read again. kubelet takes up to a minute or so to update a
# mounted ConfigMap; a few seconds more do not matter, and reading one small file costs nothing.
CONFIG_POLL_SECONDS = 3.0


def gpus_in_use(records: Iterable[ClaimRecord], gpus: Sequence[Gpu]) -> frozenset[str]:
    """UUIDs of the GPUs that prepared claims use. Device names encode the GPU's minor number,
    so this holds for devices of any config, the current one or an earlier one."""
    uuid_of_minor = {gpu.minor: gpu.uuid for gpu in gpus}
    used: set[str] = set()
    for record in records:
        for device in record.devices:
            parsed = parse_device_name(device.device)
            if parsed is not None and parsed.minor in uuid_of_minor:
                used.add(uuid_of_minor[parsed.minor])
        used.update(entry.gpu_uuid for entry in record.entries(MigInstanceEntry))
        used.update(entry.gpu_uuid for entry in record.entries(TimeSliceEntry))
    return frozenset(used)


def unclaimed_mig(gpus: Sequence[Gpu], records: Iterable[ClaimRecord]) -> tuple[Gpu, ...]:
    """The GPUs with only the MIG instances no claim record names, as dynamic MIG needs them
    (devices.mig): an instance a record names is the claim's, whose placement device it holds,
    so its placement stays offered; any other was made by hand, and its slices and engines are
    not free. Records in any state count: a half-prepared claim's instance is rolled back by
    start-up recovery, not handed out. Read once at start, so an instance made by hand while the
    agent runs is not seen until it restarts."""
    claimed = {
        (entry.gpu_uuid, entry.profile_id, entry.placement)
        for record in records
        for entry in record.entries(MigInstanceEntry)
    }
    return tuple(
        replace(
            gpu,
            mig_instances=tuple(
                instance
                for instance in gpu.mig_instances
                if (gpu.uuid, instance.profile_id, instance.placement) not in claimed
            ),
        )
        for gpu in gpus
    )


class Replan(msgspec.Struct, frozen=True):
    plans: tuple[GpuPlan, ...]
    problems: tuple[ConfigProblem, ...]
    # GPUs left out until the claims that use them are unprepared.
    waiting: tuple[Gpu, ...] = ()
    # Why GPUs are offered in another mode than the config asks (fall_back's notes).
    notes: tuple[str, ...] = ()


def replan(
    choice: ConfigChoice,
    gpus: Sequence[Gpu],
    offered: Mapping[str, GpuPlan] | None,
    in_use: frozenset[str],
    capabilities: ApiCapabilities,
    *,
    hami_core: bool,
) -> Replan:
    """The plans under `choice`, in modes the cluster can use (`capabilities`), on a node with
    HAMi-core or without (`hami_core`: a GPU whose shares need it is then a problem, and offers
    nothing under the config, like any GPU the config does not fit). A GPU that
    claims use (`in_use`) and whose plan differs from the one it was last offered under
    (`offered`, by GPU UUID) waits. `offered` None: this process has offered nothing yet, so
    there is nothing to wait for. A GPU left out meanwhile (a broken config) keeps its last
    offered plan: when the config is mended its claims' plan comes back without waiting."""
    node_plan = plan_node(choice.config, gpus, hami_core=hami_core) if choice.config is not None else None
    wanted = node_plan.plans if node_plan is not None else ()
    wanted, notes = fall_back(wanted, capabilities.unsupported, capabilities.kubernetes_version)
    problems = choice.problems + (node_plan.problems if node_plan is not None else ())
    if offered is None:
        return Replan(wanted, problems, notes=notes)
    waiting = tuple(
        plan.gpu for plan in wanted if plan.gpu.uuid in in_use and offered.get(plan.gpu.uuid) != plan
    )
    held = {gpu.uuid for gpu in waiting}
    return Replan(tuple(plan for plan in wanted if plan.gpu.uuid not in held), problems, waiting, notes)


_UNREAD = object()


class NamedConfigs:
    """Follows which named config applies (the Node's label) and what its file says (read every
    few seconds: kubelet swaps a mounted ConfigMap's files behind a symlink), and hands every
    change to `apply`. `apply` answers whether GPUs wait for their claims: then it is called
    again on each poll until none do."""

    def __init__(self, directory: Path, label_key: str, apply: Callable[[ConfigChoice], bool]) -> None:
        self.directory = directory
        self.label_key = label_key
        self._apply = apply
        self._label: str | None = None
        # False until the Node was read once: until then the label, so the config, is unknown.
        self.known = False
        self._text: object = _UNREAD
        self._again = False

    def node_changed(self, facts: NodeFacts) -> None:
        label = facts.labels.get(self.label_key)
        if self.known and label == self._label:
            return  # most Node updates are status heartbeats
        if self.known:
            log.info("node config label changed", label=self.label_key, old=self._label, new=label)
        self.known, self._label = True, label
        self._refresh(changed=True)

    def without_node(self) -> None:
        """No cluster (the demo): the node has no labels, so `default.yaml` applies."""
        self.node_changed(NodeFacts(exists=False))

    def poll(self) -> None:
        if self.known:
            self._refresh(changed=self._again)

    async def poll_forever(self, seconds: float = CONFIG_POLL_SECONDS) -> None:
        while True:
            await asyncio.sleep(seconds)
            self.poll()

    def _refresh(self, changed: bool) -> None:
        choice: ConfigChoice | None = None
        text: object = None
        if self._label and label_problem(self._label):
            text = None  # choose_config reports it; no file is read
        else:
            path = config_path(self.directory, self._label)
            try:
                text = read_config_text(path)
            except OSError as error:
                text = ("unreadable", error.strerror)
                choice = unreadable(path, error, self._label or "")
        if not changed and text == self._text:
            return
        if self._text is not _UNREAD and text != self._text:
            log.info("node config file changed", path=str(config_path(self.directory, self._label)))
        self._text = text
        if choice is None:
            raw = text if isinstance(text, bytes) else None
            present = config_names(self.directory)
            choice = choose_config(self.directory, self.label_key, self._label, raw, present)
        self._again = self._apply(choice)
