"""A snapshot's layers between hosts, through the fleet's OCI registry.

Its host pushes each layer of its chain (itself, then those it stands on) that is not
in the registry yet, and records where (`SnapshotRecord.pushed`, sealed in Redis). Another
host trusts only those sealed records: it pulls each layer it does not hold by digest
(`bashfleet.worker.engine.snapshots.snapshot_registry`: skopeo checks the digest), and keeps a copy
of the record, so that workspaces made there stand on the very same layers.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from bashfleet.worker.engine import workspaces
from bashfleet.worker.engine.snapshots import snapshot_registry, snapshot_store
from bashfleet.worker.fleet.control import Runtime
from bashfleet.worker.wire.errors import ToolError
from bashfleet.worker.wire.models import SnapshotRecord


def push_chain(rt: Runtime, record: SnapshotRecord) -> tuple[str, ...]:
    """Push every layer of `record`'s chain the registry has not got; where each is."""
    from bashfleet.worker.fleet import snapshot_calls  # noqa: PLC0415 - it imports us lazily too

    pushed = []
    for snap_id in record.layers:
        local = snapshot_store.load(snap_id, rt.settings)
        if local.pushed is None:
            ref = snapshot_registry.snapshot_ref(rt.settings, snap_id)
            if ref is None:
                raise ToolError("unavailable", (
                    f"snapshot {record.id} is on host {rt.settings.host}; to use it on "
                    "another host the fleet needs a registry for snapshots "
                    "(BASHFLEET_SNAPSHOT_REGISTRY on every worker)"))
            digest = snapshot_registry.push(
                snapshot_store.layer_path(rt.settings, snap_id), ref, rt.settings,
                annotations={"org.bashfleet.snapshot": snap_id,
                             "org.bashfleet.base": local.base()})
            # By digest alone (a reference with a tag and a digest is not one skopeo takes).
            repository = ref.rsplit(":", 1)[0]
            local = local.model_copy(update={"pushed": f"{repository}@{digest}"})
            snapshot_store.save(local, rt.settings)
            snapshot_calls.publish(rt, local)
        pushed.append(str(local.pushed))
    return tuple(pushed)


def fetch_chain(rt: Runtime, record: SnapshotRecord) -> tuple[str, ...]:
    """Fetch every layer of `record`'s chain this host does not hold, from where its
    host's sealed records say they are."""
    from bashfleet.worker.fleet import snapshot_calls  # noqa: PLC0415 - it imports us lazily too

    pushed = []
    for snap_id in record.layers:
        trusted = record if snap_id == record.id else snapshot_calls.trusted_record(
            rt.redis, rt.keys, snap_id)
        if trusted is None:
            raise ToolError("not_found", f"snapshot {snap_id}, which {record.id} stands on, "
                            "is gone from the fleet")
        if trusted.pushed is None:
            raise ToolError("unavailable", (
                f"snapshot {snap_id} is not in the fleet's registry yet: ask its host "
                f"{trusted.host} to push it first"))
        pushed.append(trusted.pushed)
        layer = snapshot_store.layer_path(rt.settings, snap_id)
        # One fetch of a layer at a time on this host (another worker process of it may
        # be fetching the same): the second finds it there.
        with _locked(snapshot_store.snapshots_dir(rt.settings) / f".{snap_id}.lock"):
            if layer.is_dir() and snapshot_store.record_path(rt.settings, snap_id).exists():
                continue
            workspaces.remove_tree(layer.parent)  # what a crash left half-made
            layer.parent.mkdir(mode=0o700, parents=True)
            snapshot_registry.pull(trusted.pushed, layer, rt.settings)
            snapshot_store.save(trusted, rt.settings)
    return tuple(pushed)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
