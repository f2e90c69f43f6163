"""How the registry's Redis hashes read as wire models: pure functions, no Redis.

Both sides read the same hashes (a worker lists its jobs, a client falls back on what
Redis knows when a host is down), so both parse them here, and both verify them here.

What a worker publishes is sealed (`bashfleet.worker.wire.auth.mark`, with every key it holds,
and one owner's records with that owner's key too; a job's record is also locked, so
that only its owner, the workers and the admin read it: `bashfleet.worker.wire.owner_keys`):
a job's hash (its record and state, `JOB_SEALED`, in the field `seal`; where the last
check stopped, in `offsets_seal`), a host's record (`HOST_SEALED`, in `seal`) and the
readiness of each of its consumers (`<role>_ready_seal`). A Redis writer without the
key (`HSET bashfleet:job:J state ended exit_code 0`) can delete or garble them, never
forge them: `open_job_view` and `open_host_info` leave out what does not verify, with
a warning, and never believe it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence

from bashfleet.worker.wire import auth
from bashfleet.worker.wire.models import HostInfo, JobRecord, JobView, SandboxProbe
from bashfleet.worker.wire.names import JobState
from bashfleet.worker.wire.owner_keys import for_readers

log = logging.getLogger("bashfleet")

#: The field of a job's hash, or of a host record, that holds its seal.
SEAL = "seal"
#: The fields of a job's hash its seal covers (what `registry.save_job` writes at once).
JOB_SEALED = ("record", "host", "state", "exit_code", "signal", "ended_at", "note")
#: The field that holds the seal of where the last check of a job stopped.
OFFSETS_SEAL = "offsets_seal"
#: The fields of a host record its seal covers (what each heartbeat writes at once).
HOST_SEALED = (
    "host", "instance", "pid", "pid_start", "machine", "machine_id", "version",
    "concurrency", "labels", "started_at", "state_dir", "sandbox", "heartbeat_at",
)


def text(mapping: Mapping[str, str], name: str) -> str | None:
    """A hash field; None for a missing or empty one (None is stored as "")."""
    value = mapping.get(name)
    return value if value not in (None, "") else None


def integer(mapping: Mapping[str, str], name: str) -> int | None:
    """A hash field as an int, or None."""
    value = text(mapping, name)
    return int(value) if value is not None else None


def number(mapping: Mapping[str, str], name: str) -> float | None:
    """A hash field as a float, or None."""
    value = text(mapping, name)
    return float(value) if value is not None else None


def _canonical(fields: Mapping[str, str], covered: Sequence[str]) -> str:
    """The covered fields' values as one text (a missing field counts as "")."""
    return json.dumps([fields.get(name, "") for name in covered], ensure_ascii=False)


# ------------------------------------------------------------------------------- jobs


def job_seal(keys: Sequence[str], job_id: str, fields: Mapping[str, str]) -> str:
    """The seal of a job's hash fields (`JOB_SEALED`, as stored: text)."""
    return auth.mark(keys, auth.JOB, job_id, _canonical(fields, JOB_SEALED))


def lock_record(keys: Sequence[str], record: JobRecord) -> str:
    """A job's record as its hash holds it: locked for `keys` (the worker's and its
    owner's: `owner_keys.SealingKeys.for_owner`), so that no other owner reads its
    command, cwd or paths."""
    return auth.lock(keys, auth.JOB, record.id, record.model_dump_json())


def open_job(keys: Mapping[str, str], job_id: str, fields: Mapping[str, str]) -> JobRecord:
    """The record of job `job_id` from its hash, its seal checked with `keys`; AuthError
    when it does not verify (forged, garbled, another job's hash copied here) or is
    another owner's (`unknown_key`)."""
    auth.check_mark(keys, auth.JOB, job_id, _canonical(fields, JOB_SEALED),
                    fields.get(SEAL, ""))
    try:
        text = auth.unlock(keys, auth.JOB, job_id, fields.get("record") or "")
        record = JobRecord.model_validate_json(text)
    except ValueError:
        raise auth.AuthError("malformed", f"job {job_id}: unreadable record") from None
    if record.id != job_id:
        raise auth.AuthError("bad_signature", f"job {job_id}: the hash holds job {record.id}")
    return record


def open_job_view(
    keys: Mapping[str, str], job_id: str, fields: Mapping[str, str], *, host_alive: bool = True
) -> JobView | None:
    """A listing entry from a job's hash (None for an empty one), verified: a hash that
    does not verify is left out (None), with a warning, never believed."""
    if not fields:
        return None
    try:
        record = open_job(keys, job_id, fields)
    except auth.AuthError as exc:
        # Another owner's (`unknown_key`) is none of this reader's business: no warning.
        (log.debug if exc.reason == "unknown_key" else log.warning)(
            "job %s: its record in Redis does not verify (%s); left out", job_id, exc.message)
        return None
    return _job_view(record, fields, host_alive=host_alive)


def readers_job(keys: Mapping[str, str], job_id: str, fields: Mapping[str, str]) -> bool:
    """Whether a job's hash is this reader's to know of: it opens with `keys`, or it is
    sealed with one of them and does not verify (a Redis writer changed it: not
    believed, yet the job is the reader's, and its end is still to come). False for no
    hash, and for another owner's (`unknown_key`): told as no job is."""
    if not fields:
        return False
    try:
        open_job(keys, job_id, fields)
    except auth.AuthError as exc:
        return exc.reason != "unknown_key"
    return True


def offsets_seal(
    keys: Sequence[str], job_id: str, offset: int, stderr_offset: int
) -> str:
    """The seal of where the last check of a job stopped."""
    return auth.mark(keys, auth.JOB_OFFSETS, job_id, f"{offset} {stderr_offset}")


def job_offsets(
    keys: Mapping[str, str], job_id: str, fields: Mapping[str, str]
) -> tuple[int, int]:
    """The offsets the last check of a job stopped at; (0, 0) before any check and for
    offsets that do not verify (reading from the start hides nothing)."""
    offset, stderr_offset = integer(fields, "offset") or 0, integer(fields, "stderr_offset") or 0
    try:
        auth.check_mark(keys, auth.JOB_OFFSETS, job_id, f"{offset} {stderr_offset}",
                        fields.get(OFFSETS_SEAL, ""))
    except auth.AuthError:
        return 0, 0
    return offset, stderr_offset


def _job_view(record: JobRecord, fields: Mapping[str, str], *, host_alive: bool) -> JobView:
    """A listing entry from a job's record and hash; a running job of a dead host shows
    `unknown`."""
    state = fields.get("state", JobState.UNKNOWN)
    note = text(fields, "note")
    if state == JobState.RUNNING and not host_alive:
        state = JobState.UNKNOWN
        note = f"host {record.host} is down; the job was running when last seen"
    if state not in tuple(JobState):
        state = JobState.UNKNOWN
    return JobView(
        id=record.id, host=record.host,
        # The numbers its workspace's calls use; the host's beside them.
        pid=record.ns_pid if record.ns_pid is not None else record.pid,
        pgid=record.ns_pgid if record.ns_pgid is not None else record.pgid,
        host_pid=record.pid if record.ns_pid is not None else None,
        workspace=record.workspace,
        command=record.command, cwd=record.cwd, output_path=record.output_path,
        stderr_path=record.stderr_path, started_at=record.started_at, state=JobState(state),
        running=None if state == JobState.UNKNOWN else state == JobState.RUNNING,
        exit_code=integer(fields, "exit_code"), signal=integer(fields, "signal"),
        ended_at=number(fields, "ended_at"), note=note, call_id=record.call_id,
        owner=record.owner, tags=record.tags,
    )


# ------------------------------------------------------------------------------ hosts


def host_seal(keys: Sequence[str], host: str, fields: Mapping[str, str]) -> str:
    """The seal of a host record's fields (`HOST_SEALED`, as stored: text), with the
    reader key too: every owner verifies it."""
    return auth.mark(for_readers(keys), auth.HOST, host, _canonical(fields, HOST_SEALED))


def ready_seal(keys: Sequence[str], host: str, instance: str, role: str, value: str) -> str:
    """The seal of one consumer's readiness (its pid, or "" once it stopped), for the
    worker instance it belongs to."""
    return auth.mark(for_readers(keys), auth.HOST_READY, f"{host}\n{instance}\n{role}", value)


def open_host(keys: Mapping[str, str], host: str, record: Mapping[str, str]) -> None:
    """AuthError unless a host record's seal verifies with `keys`."""
    auth.check_mark(keys, auth.HOST, host, _canonical(record, HOST_SEALED),
                    record.get(SEAL, ""))


def _ready(keys: Mapping[str, str], host: str, record: Mapping[str, str], role: str) -> bool:
    """True when a consumer's readiness is set and sealed for this worker instance."""
    value = record.get(f"{role}_ready", "")
    try:
        auth.check_mark(keys, auth.HOST_READY, f"{host}\n{record.get('instance', '')}\n{role}",
                        value, record.get(f"{role}_ready_seal", ""))
    except auth.AuthError:
        return False
    return bool(value)


def open_host_info(
    keys: Mapping[str, str], host: str, record: Mapping[str, str], token: str | None, busy: int
) -> HostInfo | None:
    """A host as listings show it, from its record (verified with `keys`), its lock
    token and its busy set. None for a host without a record, and for one whose record
    does not verify (left out with a warning, never believed)."""
    if not record:
        return None
    try:
        open_host(keys, host, record)
    except auth.AuthError as exc:
        log.warning("host %s: its record in Redis does not verify (%s); left out",
                    host, exc.message)
        return None
    holds = token is not None and token == record.get("instance")
    labels = tuple(part for part in record.get("labels", "").split(",") if part)
    return HostInfo(
        host=host,
        alive=token is not None,
        ready=holds and _ready(keys, host, record, "exec") and _ready(keys, host, record, "ctl"),
        slots=integer(record, "concurrency") or 0,
        busy=busy if token is not None else 0,
        labels=labels,
        version=record.get("version", ""),
        pid=integer(record, "pid"),
        machine=record.get("machine", ""),
        started_at=number(record, "started_at"),
        heartbeat_at=number(record, "heartbeat_at"),
        sandbox=_sandbox(record.get("sandbox")),
    )


def _sandbox(raw: str | None) -> SandboxProbe | None:
    if not raw:
        return None
    try:
        return SandboxProbe.model_validate_json(raw)
    except ValueError:
        return None  # a newer worker's shape: show the host without it
