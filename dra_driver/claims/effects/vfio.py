"""A GPU given to a VM: unbound from its kernel driver and bound to vfio-pci while the claim
holds it (mode vfio), then given back to the driver it had.

The entry names the PCI address and that driver, read before the entry is written, so the undo
after a crash at any step gives the GPU back whether or not the bind finished. The effect also
hands the device over: its container (the VM's monitor) gets the VFIO nodes instead of the
nvidia ones. Tested on a simulated sysfs (hardware/simulated_pci.py); it has not run on real
hardware.
"""

import asyncio
from collections.abc import Sequence

from dra_driver.claims.claim_plan import PlannedDevice
from dra_driver.claims.edits.cdi import ContainerEdits
from dra_driver.claims.effect_entries import EffectEntry, VfioEntry
from dra_driver.claims.effects.contract import Made, SideEffect
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.records import ClaimRecord
from dra_driver.devices.modes.vfio import VfioGpu
from dra_driver.hardware.model import HardwareError
from dra_driver.hardware.pci_binding import VFIO_DRIVER, PciBinding


class VfioBindings(SideEffect[VfioEntry]):
    action_type = VfioEntry
    doing = f"bind its GPU to {VFIO_DRIVER}"

    def __init__(self, pci: PciBinding | None) -> None:
        """`pci`: None on a node that cannot bind GPUs (its claims for VMs are refused)."""
        self._pci = pci

    async def claim_actions(self, ref: ClaimRef, planned: Sequence[PlannedDevice]) -> tuple[VfioEntry, ...]:
        """The drivers of the GPUs the claim gives to a VM (admin access only watches), read now
        to record before the GPUs leave them. A GPU bound to no driver, or to vfio-pci already (a
        VM's, or a claim no record names), is refused: nothing would say where to give it back to."""
        addresses = [
            device.gpu.pci_bus_id
            for device in planned
            if isinstance(device.origin, VfioGpu) and not device.result.admin_access
        ]
        if not addresses:
            return ()
        pci = self._binding(ref)
        entries = []
        for address in addresses:
            try:
                driver = await asyncio.to_thread(pci.driver, address)
            except HardwareError as error:
                raise ClaimRejected(f"claim {ref}: cannot read the driver of its GPU: {error}") from error
            if driver is None or driver == VFIO_DRIVER:
                raise ClaimRejected(
                    f"claim {ref}: PCI device {address} is bound to {driver or 'no driver'}, not to a GPU "
                    f"driver; it is not ours to give to a VM"
                )
            entries.append(VfioEntry(address, driver))
        return tuple(entries)

    def _binding(self, ref: ClaimRef) -> PciBinding:
        """Where the claim's GPUs are bound; a node without one refuses the claim (claim_actions
        asks first, so apply never meets it with actions of this node's own making)."""
        if self._pci is None:
            raise ClaimRejected(f"claim {ref}: this node cannot bind GPUs to {VFIO_DRIVER}")
        return self._pci

    def container_edits(self, device: PlannedDevice) -> ContainerEdits | None:
        """The VFIO container and the GPU's IOMMU group, which the VM's monitor (QEMU in a
        KubeVirt virt-launcher) opens; none of the nvidia device nodes, since the host driver no
        longer holds the GPU."""
        if not isinstance(device.origin, VfioGpu):
            return None
        return ContainerEdits(device_nodes=("/dev/vfio/vfio", f"/dev/vfio/{device.origin.iommu_group}"))

    def entry(self, action: VfioEntry) -> EffectEntry:
        return action

    async def apply(self, ref: ClaimRef, actions: Sequence[VfioEntry]) -> Made:
        pci = self._binding(ref)
        for action in actions:
            await asyncio.to_thread(pci.bind_vfio, action.pci_address)
        return {}

    async def undo(self, record: ClaimRecord) -> ClaimRecord:
        entries = record.entries(VfioEntry)
        if not entries:
            return record
        pci = self._pci
        if pci is None:  # the record stays, for an agent that can give the GPUs back
            raise HardwareError(f"its GPUs are bound to {VFIO_DRIVER}, and this node cannot give them back")
        for entry in entries:
            await asyncio.to_thread(pci.give_back, entry.pci_address, entry.restore_driver)
        return record
