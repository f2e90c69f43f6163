"""Snapshot records and where each snapshot's layers are on this host: what a workspace
made from a snapshot reads (`load`, `layer_path`, `chain_paths`), apart from taking and
collecting them (`snapshots`), which stand on workspaces.

    snapshots/<id>.json        its record (`SnapshotRecord`): what it stands on
    snapshots/<id>/layer/      root/ home/ tmp/ vartmp/ work/
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from pathlib import Path

from bashfleet.worker.engine import layout
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.errors import ToolError
from bashfleet.worker.wire.models import SNAPSHOT_ID_PATTERN, SnapshotRecord, WorkspaceRecord

#: Seconds a snapshot lives unless told (a day: an eval's or a training step's span).
DEFAULT_TTL_S = 24 * 3600.0


class SnapshotError(ToolError):
    """A snapshot that cannot be taken, found or used."""


def new_id() -> str:
    """A snapshot id unique across hosts and time."""
    return f"s{uuid.uuid4().hex[:15]}"


def valid_id(snap_id: str) -> bool:
    return re.fullmatch(SNAPSHOT_ID_PATTERN, snap_id) is not None


def snapshots_dir(settings: Settings) -> Path:
    """Where this host keeps its snapshots (root's, 0700)."""
    return settings.state_dir / "snapshots"


def record_path(settings: Settings, snap_id: str) -> Path:
    return snapshots_dir(settings) / f"{snap_id}.json"


def layer_path(settings: Settings, snap_id: str) -> Path:
    """The snapshot's layers (`LAYER_NAMES`)."""
    return snapshots_dir(settings) / snap_id / "layer"


#: Every layer a snapshot holds: `/`'s and its own directories'.
LAYER_NAMES = ("root", *layout.OWN_LAYERS)


def save(record: SnapshotRecord, settings: Settings) -> None:
    path = record_path(settings, record.id)
    tmp = path.with_name(f".{record.id}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(record.model_dump_json())
    os.replace(tmp, path)


def load(snap_id: str, settings: Settings) -> SnapshotRecord:
    """The record of snapshot `snap_id` on this host; SnapshotError `not_found`."""
    if not valid_id(snap_id):
        raise SnapshotError("not_found", f"no such snapshot: {snap_id!r}")
    try:
        text = record_path(settings, snap_id).read_text("utf-8")
    except FileNotFoundError:
        raise SnapshotError("not_found", f"no such snapshot on host {settings.host}: "
                            f"{snap_id}") from None
    return SnapshotRecord.model_validate_json(text)


def local_records(settings: Settings) -> list[SnapshotRecord]:
    """Every snapshot this host holds (deleted and hidden ones too), oldest first."""
    found = []
    with contextlib.suppress(FileNotFoundError), os.scandir(snapshots_dir(settings)) as listing:
        for entry in listing:
            if entry.name.endswith(".json") and not entry.name.startswith("."):
                with contextlib.suppress(OSError, ValueError):
                    found.append(SnapshotRecord.model_validate_json(
                        Path(entry.path).read_text("utf-8")))
    return sorted(found, key=lambda r: r.created_at)


def chain_paths(record: WorkspaceRecord, settings: Settings) -> tuple[str, ...]:
    """The layer directories of the snapshots a workspace stands on, newest first;
    SnapshotError `not_found` when one is gone from this host."""
    paths = []
    for snap_id in record.lowers:
        path = layer_path(settings, snap_id)
        if not path.is_dir():
            raise SnapshotError("not_found", f"snapshot {snap_id}, which workspace "
                                f"{record.id} stands on, is gone from host {settings.host}")
        paths.append(str(path))
    return tuple(paths)
