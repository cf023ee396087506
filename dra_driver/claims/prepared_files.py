"""Writing a prepared claim's files in the record protocol's order (engine.py): the device
metadata files first, so no spec ever mounts a file that is not there yet, then the CDI spec, then
the "prepared" record, after which kubelet may hear of the claim."""

from dra_driver.claims.edits.cdi import CdiSpec
from dra_driver.claims.edits.cdi_files import CdiSpecDirectory
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.record_store import ClaimRecordStore
from dra_driver.claims.records import ClaimRecord
from dra_driver.claims.status.device_metadata import RequestMetadata
from dra_driver.claims.status.metadata_files import DeviceMetadataDirectory
from dra_driver.state import failpoints


class PreparedFiles:
    def __init__(
        self, records: ClaimRecordStore, cdi_specs: CdiSpecDirectory, metadata: DeviceMetadataDirectory
    ) -> None:
        self._records = records
        self._cdi_specs = cdi_specs
        self._metadata = metadata

    async def write_prepared(
        self,
        ref: ClaimRef,
        spec: CdiSpec,
        record: ClaimRecord,
        metadata: tuple[RequestMetadata, ...],
        *,
        first_record: bool,
    ) -> None:
        """`first_record`: no "preparing" record was written (nothing had side effects), so the
        claim has no record file yet: the one written now is created, not replaced."""
        self._metadata.write(ref.uid, metadata)
        failpoints.reached("prepare.metadata-written")
        self._cdi_specs.write(ref.uid, spec)
        failpoints.reached("prepare.cdi-written")
        if first_record:
            await self._records.create(record)
        else:
            await self._records.write(record)
        failpoints.reached("prepare.prepared-recorded")
