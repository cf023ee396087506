"""What the node keeps of its claims between calls, as one value: the records, the files a
prepared claim is served with (CDI specs, device metadata), the claim locks shared with a peer
agent, the view of who owns which device, and the claims' side effects.

Two parts of the engine undo claims from it alone, with no claim fetched: unprepare (one claim
kubelet names) and start-up recovery (what a crash or a reboot left). They hold the same six
things, made once by the engine (engine.py), so they are handed over as this one struct rather
than as six arguments repeated in both constructors.
"""

import msgspec

from dra_driver.claims.edits.cdi_files import CdiSpecDirectory
from dra_driver.claims.ownership import DeviceOwnership
from dra_driver.claims.record_store import ClaimRecordStore
from dra_driver.claims.side_effects import ClaimSideEffects
from dra_driver.claims.status.metadata_files import DeviceMetadataDirectory
from dra_driver.state.shared_locks import ClaimLocks


class ClaimState(msgspec.Struct, frozen=True):
    records: ClaimRecordStore
    cdi_specs: CdiSpecDirectory
    metadata: DeviceMetadataDirectory
    claim_locks: ClaimLocks
    ownership: DeviceOwnership
    effects: ClaimSideEffects
