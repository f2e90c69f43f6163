"""Background jobs' records and statuses on this host's disk (the fleet mirrors them in
Redis): what check, kill, re-adoption and a workspace's end read and write.

A job's record is a small JSON file (`<jobs dir>/<id>.json`) beside its status file,
which whoever watches the job (its workspace's keeper, an interactive session's
supervisor, the worker for an unsandboxed job) writes when it ends.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from bashfleet.worker.engine.isolate import job_end
from bashfleet.worker.settings import Settings, get_settings
from bashfleet.worker.wire.errors import ToolError
from bashfleet.worker.wire.models import JobRecord, JobStatus


class JobError(ToolError):
    """A job could not be started, found or controlled."""


def record_path(settings: Settings, job_id: str) -> Path:
    """Where the worker keeps a job's record on its own disk (for re-adoption)."""
    return settings.jobs_dir / f"{job_id}.json"


def save_record(record: JobRecord, settings: Settings) -> None:
    """Write the record beside the job's files, atomically."""
    path = record_path(settings, record.id)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(record.model_dump_json(), encoding="utf-8")
    os.replace(tmp, path)


def load_record(job_id: str, settings: Settings | None = None) -> JobRecord:
    """Read a job's record from this host's disk."""
    settings = settings or get_settings()
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", job_id):
        raise JobError("not_found", f"no such job: {job_id!r}")
    try:
        return JobRecord.model_validate_json(record_path(settings, job_id).read_text("utf-8"))
    except FileNotFoundError:
        raise JobError("not_found", f"no such job: {job_id}") from None


def local_records(settings: Settings | None = None) -> list[JobRecord]:
    """Every job record kept on this host."""
    settings = settings or get_settings()
    if not settings.jobs_dir.is_dir():
        return []
    records = []
    for path in sorted(settings.jobs_dir.glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            records.append(JobRecord.model_validate_json(path.read_text("utf-8")))
    return records


def write_status(
    record: JobRecord, returncode: int | None, note: str | None = None, *, replace: bool = False
) -> None:
    """Record how a job ended, atomically, unless its end is already recorded.

    `replace`: overwrite what is recorded (the job's own watcher, which knows the truth).
    Writers race (a check, a kill, the watcher): without `replace` the status is linked
    into place only if none exists yet (`bashfleet.worker.engine.isolate.job_end.write_status`).
    """
    path = Path(record.status_path)
    if not replace and path.exists():
        return
    folder = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        job_end.write_status(path.name, returncode, note, replace=replace, dir_fd=folder)
    finally:
        os.close(folder)


def read_status(record: JobRecord) -> JobStatus | None:
    """How the job ended, or None while its end is not recorded."""
    try:
        return JobStatus.model_validate_json(Path(record.status_path).read_text("utf-8"))
    except (FileNotFoundError, ValueError):
        return None


def running_in(settings: Settings, ws_id: str) -> list[JobRecord]:
    """The jobs of workspace `ws_id` whose end is not recorded."""
    return [r for r in local_records(settings)
            if r.workspace == ws_id and read_status(r) is None]


def end_workspace_jobs(settings: Settings, ws_id: str, note: str) -> None:
    """Record the end of a workspace's jobs once it ended (its keeper killed them all)."""
    for record in running_in(settings, ws_id):
        write_status(record, -9, note=f"killed: {note}")
