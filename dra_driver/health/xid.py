"""What an XID says about the GPU that reported it, and what a device taint should do about it.

The NVIDIA driver reports every fault it sees as an XID number, and many of them are the fault of
one application (a bad pointer, a killed kernel), not of the GPU. Tainting a device for those
would evict healthy workloads, so each XID gets a class, from harmless to fatal, and the class
decides the taint effect:

- ignored: application errors; the GPU is fine and nothing is published.
- informational: the GPU fixed or fenced the problem itself; a taint with effect None tells
  operators and tolerating claims without keeping anything off the device.
- degraded: the GPU may be failing; NoSchedule keeps new work off it and running work on it.
- fatal: the GPU cannot be trusted until it is reset; NoExecute evicts what runs on it too.

The defaults follow NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors) and its GPU memory
error management guide (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt); operators move XIDs
between classes in their configuration (`parse_xid_policy`).
"""

import enum
from collections.abc import Mapping
from itertools import combinations
from typing import Annotated

import msgspec

from dra_driver.base.errors import OperatorFault
from dra_driver.base.strict_decode import DecodeError
from dra_driver.base.typed_decode import typed
from dra_driver.devices.model import TaintEffect
from dra_driver.devices.slices import SliceLayout


class XidClass(enum.IntEnum):
    """How bad an XID is for its GPU, least severe first, so that max() picks the worst."""

    IGNORED = 0
    INFORMATIONAL = 1
    DEGRADED = 2
    FATAL = 3

    @property
    def label(self) -> str:
        """The name operators write in the policy and read in health messages."""
        return self.name.lower()


# (XID, NVIDIA's description, default class), in XID order.
_CATALOGUE: tuple[tuple[int, str, XidClass], ...] = (
    # Application errors, as NVIDIA's own device plugin skips them: the GPU stays usable.
    (13, "graphics engine exception", XidClass.IGNORED),
    (31, "GPU memory page fault", XidClass.IGNORED),
    (43, "GPU stopped processing", XidClass.IGNORED),
    (45, "preemptive cleanup, due to previous errors", XidClass.IGNORED),
    # NVIDIA's GPU health checks drain a GPU on 46 and have it reset.
    (46, "GPU stopped processing", XidClass.FATAL),
    (48, "double-bit ECC error", XidClass.FATAL),
    (62, "internal micro-controller halt", XidClass.FATAL),
    # A pending row remap takes effect at the next reset; until then NVIDIA says unaffected
    # applications keep running and new work can start.
    (63, "ECC page retirement or row remapping recorded", XidClass.INFORMATIONAL),
    # The remapper could not fence off a bad row: memory errors are no longer contained.
    (64, "ECC page retirement or row remapping failed", XidClass.DEGRADED),
    (68, "NVDEC0 exception", XidClass.IGNORED),
    (74, "NVLink error", XidClass.DEGRADED),
    (79, "GPU has fallen off the bus", XidClass.FATAL),
    (92, "high single-bit ECC error rate", XidClass.DEGRADED),
    # Error containment ended only the application that touched the bad memory.
    (94, "contained ECC error", XidClass.INFORMATIONAL),
    (95, "uncontained ECC error", XidClass.FATAL),
    (119, "GSP RPC timeout", XidClass.FATAL),
    (120, "GSP error", XidClass.FATAL),
    (140, "unrecovered ECC error", XidClass.FATAL),
)

XID_DESCRIPTIONS: Mapping[int, str] = {xid: description for xid, description, _ in _CATALOGUE}

_EFFECTS: Mapping[XidClass, TaintEffect] = {
    XidClass.INFORMATIONAL: "None",
    XidClass.DEGRADED: "NoSchedule",
    XidClass.FATAL: "NoExecute",
}


class XidPolicyError(OperatorFault, ValueError):
    """The operator's XID policy is malformed."""


class XidPolicy(msgspec.Struct, frozen=True):
    """Which XIDs fall into which class; an XID in none of the sets is degraded.

    Unknown XIDs are degraded because the catalogue grows with every driver and GPU generation:
    a new XID may well be a hardware fault, and NoSchedule keeps new work off the GPU without
    evicting anything over a false alarm; the taint goes once the GPU has been quiet long enough.
    """

    ignored: frozenset[int] = frozenset()
    informational: frozenset[int] = frozenset()
    degraded: frozenset[int] = frozenset()
    fatal: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        for (first, first_xids), (second, second_xids) in combinations(self._sets().items(), 2):
            if shared := first_xids & second_xids:
                raise ValueError(
                    f"XIDs {sorted(shared)} are both {first.label} and {second.label}; each XID has one class"
                )

    def _sets(self) -> dict[XidClass, frozenset[int]]:
        return {
            XidClass.IGNORED: self.ignored,
            XidClass.INFORMATIONAL: self.informational,
            XidClass.DEGRADED: self.degraded,
            XidClass.FATAL: self.fatal,
        }

    def classify(self, xid: int) -> XidClass:
        return next((xid_class for xid_class, xids in self._sets().items() if xid in xids), XidClass.DEGRADED)


def _policy(classes: Mapping[int, XidClass]) -> XidPolicy:
    def members(wanted: XidClass) -> frozenset[int]:
        return frozenset(xid for xid, xid_class in classes.items() if xid_class is wanted)

    return XidPolicy(
        ignored=members(XidClass.IGNORED),
        informational=members(XidClass.INFORMATIONAL),
        degraded=members(XidClass.DEGRADED),
        fatal=members(XidClass.FATAL),
    )


_DEFAULT_CLASSES: Mapping[int, XidClass] = {xid: xid_class for xid, _, xid_class in _CATALOGUE}
DEFAULT_XID_POLICY = _policy(_DEFAULT_CLASSES)


# An XID as the operator lists it; the description is the wording of any error about one.
_Xid = Annotated[int, msgspec.Meta(ge=1, description="an XID number (an integer ≥ 1)")]
_Xids = Annotated[tuple[_Xid, ...], msgspec.Meta(description="a list of XID numbers such as [48, 79]")]


class _PolicyFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The policy as the operator writes it: the XIDs that move to each class. Lists, not sets,
    so that an XID listed twice is reported rather than quietly merged."""

    ignored: _Xids = ()
    informational: _Xids = ()
    degraded: _Xids = ()
    fatal: _Xids = ()


def parse_xid_policy(raw: object, origin: str = "XID policy") -> XidPolicy:
    """The default policy with the operator's changes: an XID listed under a class moves there from
    wherever the defaults had it, and every XID not listed keeps its default class.

    `raw` is the decoded YAML mapping `{ignored: [...], informational: [...], degraded: [...],
    fatal: [...]}` (every field optional; None means no changes); `origin` names it in errors.
    """
    if raw is None:
        return DEFAULT_XID_POLICY
    try:
        changes = typed(raw, _PolicyFile, origin)
    except DecodeError as error:
        raise XidPolicyError(str(error)) from error
    classes = dict(_DEFAULT_CLASSES)
    listed_in: dict[int, str] = {}
    for xid_class in XidClass:
        for xid in getattr(changes, xid_class.label):
            if xid in listed_in:
                raise XidPolicyError(
                    f"{origin}.{xid_class.label}: XID {xid} is already listed under {listed_in[xid]}; "
                    "each XID has one class"
                )
            listed_in[xid] = xid_class.label
            classes[xid] = xid_class
    return _policy(classes)


def taint_effect(xid_class: XidClass, layout: SliceLayout) -> TaintEffect | None:
    """The effect of a taint for an XID of this class, or None where no taint is published: for
    ignored XIDs, and for informational ones on Kubernetes 1.34, whose API has no effect None."""
    effect = _EFFECTS.get(xid_class)
    if effect == "None" and layout == "1.34":
        return None
    return effect
