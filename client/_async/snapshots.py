"""The fleet's snapshots: `Snapshots`, the part of `AsyncFleet` that lists and deletes
this owner's snapshots and reads their sealed records (a workspace's `snapshot=` and
`AsyncWorkspace.snapshot`/`restore` use them); moving a snapshot's layers to another
host goes through the fleet's registry.

Written for asyncio; `client/_sync/snapshots.py` is generated from it by
`scripts/unasync.py`.
"""

from __future__ import annotations

import re

from bashfleet.client._async import records
from bashfleet.client._async.base import FleetBase
from bashfleet.client._core.constants import CTL_TIMEOUT_S, PULL_POLL_S
from bashfleet.client._core.messages import control_request
from bashfleet.client._core.workspaces import open_snapshot
from bashfleet.client.errors import UnknownSnapshot, snapshot_error_for
from bashfleet.worker.wire.control import (
    SnapshotDeleted,
    SnapshotDeleteRequest,
    SnapshotFetch,
    SnapshotFetchRequest,
)
from bashfleet.worker.wire.models import SNAPSHOT_ID_PATTERN, Snapshot, SnapshotRecord


class Snapshots(FleetBase):
    """`AsyncFleet`'s snapshots: `snapshots`, `delete_snapshot`."""

    async def snapshots(self) -> list[Snapshot]:
        """This owner's snapshots across the fleet, oldest first (from the records their
        hosts sealed in Redis: one that does not verify is left out)."""
        ids = await self._on_redis(records.owner_snapshots, self._identity.space)
        sealed = await self._on_redis(records.snapshot_records, ids)
        opened = [open_snapshot(self._record_keys, snap_id, value)
                  for snap_id, value in zip(ids, sealed, strict=True)]
        return sorted((record.as_snapshot() for record in opened if record is not None
                       and record.owner == self.owner and not record.hidden
                       and not record.deleted), key=lambda snap: snap.created_at)

    async def delete_snapshot(self, snapshot: Snapshot | str) -> bool:
        """Delete a snapshot of this owner's: unlisted and unusable at once, its layer
        removed once no workspace (nor later snapshot) stands on it. False when it was
        gone already."""
        try:
            record = await self._snapshot_record(snapshot)
        except UnknownSnapshot:
            return False
        done = await self._control(record.host, control_request(
            SnapshotDeleteRequest, id=record.id), SnapshotDeleted)
        return done.deleted

    async def _snapshot_record(self, snapshot: Snapshot | str) -> SnapshotRecord:
        """A snapshot's record as its host sealed it; UnknownSnapshot when this owner
        has none by that id."""
        snap_id = snapshot.id if isinstance(snapshot, Snapshot) else str(snapshot)
        if re.fullmatch(SNAPSHOT_ID_PATTERN, snap_id) is None:
            raise UnknownSnapshot(f"no such snapshot: {snap_id!r}")
        sealed = (await self._on_redis(records.snapshot_records, [snap_id]))[0]
        record = open_snapshot(self._record_keys, snap_id, sealed)
        if record is None or record.deleted or record.hidden or (
                record.owner != self.owner and not self.admin):
            raise UnknownSnapshot(f"no such snapshot: {snap_id} (deleted, expired, or "
                                  "another owner's)")
        return record

    async def _move_snapshot(self, record: SnapshotRecord, where: str) -> None:
        """Bring a snapshot's layers to host `where`: its host pushes them to the fleet's
        registry (once), `where` fetches them (once); each on a thread of its own there,
        asked again every few seconds until done."""
        for host in (record.host, where):
            request = control_request(SnapshotFetchRequest, id=record.id, wait_s=PULL_POLL_S)
            while True:
                sent = await self._send_control(host, request, CTL_TIMEOUT_S + PULL_POLL_S)
                state = await self._await_control(sent, SnapshotFetch,
                                                  errors=snapshot_error_for)
                if state.done:
                    break
