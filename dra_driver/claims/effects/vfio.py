"""A GPU given to a VM: unbound from its kernel driver and bound to vfio-pci while the claim
holds it (mode vfio), then given back to the driver it had.

The entry names the PCI address and that driver, read before the entry is written, so the undo
after a crash at any step gives the GPU back whether or not the bind finished. Tested on a
simulated sysfs (hardware/simulated_pci.py); it has not run on real hardware.
"""

import asyncio
from collections.abc import Sequence

from dra_driver.claims.effect_entries import EffectEntry, VfioEntry
from dra_driver.claims.effects.contract import Made, SideEffect
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.records import ClaimRecord
from dra_driver.hardware.model import HardwareError
from dra_driver.hardware.pci_binding import VFIO_DRIVER, PciBinding


class VfioBindings(SideEffect[VfioEntry]):
    action_type = VfioEntry
    doing = f"bind its GPU to {VFIO_DRIVER}"

    def __init__(self, pci: PciBinding) -> None:
        self._pci = pci

    async def actions(self, ref: ClaimRef, addresses: Sequence[str]) -> tuple[VfioEntry, ...]:
        """The GPUs' drivers now, to record before the GPUs leave them. A GPU bound to no driver,
        or to vfio-pci already (a VM's, or a claim no record names), is refused: nothing would
        say where to give it back to."""
        entries = []
        for address in addresses:
            try:
                driver = await asyncio.to_thread(self._pci.driver, address)
            except HardwareError as error:
                raise ClaimRejected(f"claim {ref}: cannot read the driver of its GPU: {error}") from error
            if driver is None or driver == VFIO_DRIVER:
                raise ClaimRejected(
                    f"claim {ref}: PCI device {address} is bound to {driver or 'no driver'}, not to a GPU "
                    f"driver; it is not ours to give to a VM"
                )
            entries.append(VfioEntry(address, driver))
        return tuple(entries)

    def entry(self, action: VfioEntry) -> EffectEntry:
        return action

    async def apply(self, ref: ClaimRef, actions: Sequence[VfioEntry]) -> Made:
        for action in actions:
            await asyncio.to_thread(self._pci.bind_vfio, action.pci_address)
        return {}

    async def undo(self, record: ClaimRecord) -> ClaimRecord:
        for entry in record.entries(VfioEntry):
            await asyncio.to_thread(self._pci.give_back, entry.pci_address, entry.restore_driver)
        return record
