"""What the control calls do on the owning host: one function per request model.

Each takes the worker's `Runtime` and its request (`bashfleet.worker.wire.control`), and returns
its response model or raises a `ToolError` (`JobError`): the task turns that into the
reply's `error`. Served by the control consumer (`bashfleet.<host>.ctl`), apart from
the command slots, so they answer at once even when every slot is busy.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

import redis

from bashfleet.worker.engine import running
from bashfleet.worker.engine.jobs import jobs
from bashfleet.worker.engine.output.capture import read_slice
from bashfleet.worker.engine.output.patterns import grep_lines
from bashfleet.worker.engine.secrets import worker_redaction
from bashfleet.worker.fleet import recovery, registry
from bashfleet.worker.fleet.nonces import NonceMemory
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire import auth, names
from bashfleet.worker.wire.control import (
    MAX_READ_LIMIT,
    CancelRequest,
    CancelResult,
    CheckRequest,
    DetachRequest,
    DetachResult,
    JobList,
    JobsRequest,
    KillRequest,
    ReadOutputRequest,
)
from bashfleet.worker.wire.errors import ToolError
from bashfleet.worker.wire.models import CheckResult, JobRecord, OutputChunk, Truncation
from bashfleet.worker.wire.names import CallState
from bashfleet.worker.wire.owner_keys import Keyring
from bashfleet.worker.wire.records import job_offsets, open_job_view

#: Grace between SIGTERM and SIGKILL when a job is killed through the fleet.
KILL_GRACE_S = 2.0


@dataclass(frozen=True)
class Runtime:
    """What every task of this worker process needs."""

    settings: Settings
    redis: redis.Redis
    instance: str
    nonces: NonceMemory | None = None
    """The nonces this consumer accepted (None: Redis alone remembers them)."""

    # Worked out once: a runtime's settings do not change, and every call asks (its
    # answer's key, its verification, its claim's owner mark).
    @cached_property
    def keys(self) -> Keyring:
        """The keys a message may be signed with, by id (the admin key among them)."""
        return keyring(self.settings)

    @cached_property
    def admin_key_id(self) -> str | None:
        """The id of the admin key, when one is configured."""
        admin = self.settings.admin_key
        return auth.key_id(admin.get_secret_value()) if admin else None

    @cached_property
    def fleet_keys(self) -> tuple[str, ...]:
        """The fleet keys among the accepted keys (`Settings.fleet_keys`)."""
        return self.settings.fleet_keys()


@lru_cache(maxsize=8)
def _keyring(keys: tuple[str, ...], fleet: tuple[str, ...]) -> Keyring:
    return Keyring(keys, fleet)


def keyring(settings: Settings) -> Keyring:
    """Every key this worker accepts, by id: the fleet keys, the admin key, and each
    owner's key, derived from the fleet keys when a message names it
    (`bashfleet.worker.wire.owner_keys`)."""
    admin = (settings.admin_key.get_secret_value(),) if settings.admin_key else ()
    fleet = settings.fleet_keys()
    return _keyring((*fleet, *admin), fleet)


JobAction = Callable[[Runtime, JobRecord, int, int, Truncation | None], CheckResult]


def check(rt: Runtime, request: CheckRequest, admin: bool = False) -> CheckResult:
    """A job's state and its output since the offset (None: since the last check)."""

    def act(
        rt: Runtime, record: JobRecord, start: int, err_start: int, cut: Truncation | None
    ) -> CheckResult:
        return jobs.check_job(
            record, offset=start, stderr_offset=err_start, grep=request.grep, policy=cut,
            settings=rt.settings,
        )

    return _job_action(rt, request, act, admin)


def kill(rt: Runtime, request: KillRequest, admin: bool = False) -> CheckResult:
    """End a job (group SIGTERM, grace, SIGKILL, marker sweep); its final state."""

    def act(
        rt: Runtime, record: JobRecord, start: int, err_start: int, cut: Truncation | None
    ) -> CheckResult:
        return jobs.kill_job(
            record, offset=start, stderr_offset=err_start, grace_s=KILL_GRACE_S, policy=cut,
            settings=rt.settings, first=request.signal,
        )

    return _job_action(rt, request, act, admin, always_sync=True)


def owned_record(settings: Settings, job_id: str, owner: str, admin: bool,
                 workspace: str | None = None) -> JobRecord:
    """A job's record, for its owner (or an admin): another owner's job is answered as
    an unknown one, so its existence does not leak; so is one whose files are not
    regular files this worker serves, and, asked within a workspace, another's job."""
    record = jobs.load_record(job_id, settings)
    files = [record.output_path, *([record.stderr_path] if record.stderr_path else [])]
    if (record.owner != owner and not admin) or not all(
        served_file(settings, Path(path)) for path in files
    ) or (workspace is not None and record.workspace != workspace):
        raise jobs.JobError("not_found", f"no such job: {job_id}")
    return record


def served_file(settings: Settings, path: Path) -> bool:
    """True for a regular file (not a symlink) inside this worker's state directory or
    its workspaces' output directories (read-only in every workspace's view): the only
    files a control call ever reads."""
    try:
        info = path.lstat()
    except OSError:
        return not path.exists()  # not written yet (a job's first byte): nothing to read
    real = os.path.realpath(path)
    roots = (settings.state_dir, settings.workspace_root_dir() / ".out")
    inside = any(real.startswith(os.path.realpath(root) + os.sep) for root in roots)
    return inside and stat.S_ISREG(info.st_mode)


def _job_action(
    rt: Runtime, request: CheckRequest | KillRequest, act: JobAction, admin: bool, *,
    always_sync: bool = False,
) -> CheckResult:
    """Check or kill a job from its local record; keep the offsets and, once it has
    ended (or always, for a kill), its record in Redis up to date."""
    record = owned_record(rt.settings, request.id, request.owner, admin, request.workspace)
    start, err_start = _offsets(rt, request)
    result = act(rt, record, start, err_start, request.truncation)
    registry.save_offsets(
        rt.redis, request.id, result.offset, result.stderr_offset, rt.settings.sealing_keys()
    )
    if always_sync or not result.running:
        recovery.sync_job(rt.redis, record, rt.settings.sealing_keys())
    return result


def _offsets(rt: Runtime, request: CheckRequest | KillRequest) -> tuple[int, int]:
    """Where to read from: as asked, else where the last check (by any client) stopped."""
    stored, stored_err = job_offsets(rt.keys, request.id, registry.job_fields(rt.redis, request.id))
    start = stored if request.offset is None else request.offset
    if request.stderr_offset is not None:
        return start, request.stderr_offset
    # Reading stdout from the start reads stderr from the start too.
    return start, 0 if request.offset == 0 else stored_err


def read_output(rt: Runtime, request: ReadOutputRequest, admin: bool = False) -> OutputChunk:
    """A slice of a job's output file or of a call's spill file on this host."""
    path = _output_path(rt.settings, request, admin)
    pattern = jobs.compile_grep(request.grep)
    size = path.stat().st_size
    start = min(request.offset, size)
    size_to_read = min(request.limit, MAX_READ_LIMIT)
    text, end, size = read_slice(path, start, size_to_read, worker_redaction(rt.settings))
    if pattern is not None:
        text = grep_lines(text, pattern)
    return OutputChunk(
        path=str(path), offset=start, next_offset=end, size=size, text=text, eof=end >= size
    )


def _output_path(settings: Settings, request: ReadOutputRequest, admin: bool) -> Path:
    """The file of a job or call id: only regular files this worker wrote, in its state
    directory, for their owner (or an admin), are ever read."""
    item_id, stream = request.id, request.stream
    if not names.valid_id(item_id):
        raise jobs.JobError("not_found", f"no such job or call: {item_id!r}")
    try:
        record = owned_record(settings, item_id, request.owner, admin, request.workspace)
    except jobs.JobError:
        record = None
    if record is not None:
        chosen = record.output_path if stream == "stdout" else record.stderr_path
        if chosen is None:
            raise jobs.JobError("not_found", f"job {item_id} has no separate stderr")
        return Path(chosen)
    unknown = jobs.JobError(
        "not_found", f"no job or kept output for {item_id!r} on {settings.host}"
    )
    owner, folder = spill_owner_and_folder(settings, item_id)
    if (not admin and owner != request.owner) or (
            request.workspace is not None and folder.name != request.workspace):
        raise unknown
    suffixes = (".out", ".log") if stream == "stdout" else (".err",)
    for suffix in suffixes:
        candidate = folder / f"{item_id}{suffix}"
        if candidate.exists() and served_file(settings, candidate):
            return candidate
    raise unknown


def owner_file(settings: Settings, call_id: str) -> Path:
    """Where the owner of a call's kept output is written (beside its spill files)."""
    return settings.spill_dir / f"{call_id}.owner"


def spill_owner_and_folder(settings: Settings, call_id: str) -> tuple[str | None, Path]:
    """(the owner of a call's kept output, the directory of its spill files): from the
    owner file its exec task wrote (None, the spill directory: unknown)."""
    path = owner_file(settings, call_id)
    if not served_file(settings, path) or not path.exists():
        return None, settings.spill_dir
    owner, _, folder = path.read_text(encoding="utf-8").partition("\n")
    return owner.strip(), Path(folder.strip()) if folder.strip() else settings.spill_dir


def _check_call_owner(rt: Runtime, call_id: str, owner: str, admin: bool) -> None:
    """JobError `not_found` unless the call is `owner`'s (or the asker an admin): its
    owner as its worker sealed it in the call's record, which any client knowing the id
    may write. Another owner's call is told as no call is."""
    recorded = registry.call_owner(rt.redis, call_id, auth.keyring(rt.settings.fleet_keys()))
    if recorded is None or (recorded != owner and not admin):
        raise jobs.JobError("not_found", f"no such call: {call_id} (unknown or expired)")


def cancel(rt: Runtime, request: CancelRequest, admin: bool = False) -> CancelResult:
    """Kill the processes of a running foreground call; its exec task then answers."""
    _check_call_owner(rt, request.call_id, request.owner, admin)
    previous = registry.mark_call(
        rt.redis, request.call_id, CallState.CANCELLING, only_from=(CallState.RUNNING,)
    )
    entry = running.load(rt.settings, request.call_id)
    if entry is None:
        # Not on disk to be killed by pid (in its first 50 ms, or an interactive
        # session's first wait, which records no process): its engine finds the flag at
        # its next wake-up (a call's running hook also sees `cancelling`).
        if previous != CallState.RUNNING:
            return CancelResult(cancelled=False, state=previous)
        running.request_cancel(rt.settings, request.call_id)
        if registry.call_state(rt.redis, request.call_id) != CallState.CANCELLING:
            running.forget_cancel(rt.settings, request.call_id)  # it ended meanwhile
        return CancelResult(cancelled=True, state=CallState.CANCELLING)
    survivors = running.kill(entry)
    return CancelResult(
        cancelled=True, state=CallState.CANCELLING, survivors=tuple(survivors)
    )


def detach(rt: Runtime, request: DetachRequest, admin: bool = False) -> DetachResult:
    """Ask the engine running a foreground call to leave it running as a job.

    Only a call whose process is recorded on this host's disk (it has run 50 ms) can
    be asked: the flag is its `running/<call_id>.detach` file, which the call's exec task
    removes with the record when the call ends. If the record is gone once the flag is
    written, the call ended meanwhile and the flag goes too.
    """
    _check_call_owner(rt, request.call_id, request.owner, admin)
    state = registry.call_state(rt.redis, request.call_id)
    if state != CallState.RUNNING or running.load(rt.settings, request.call_id) is None:
        return DetachResult(detached=False, state=state)
    running.request_detach(rt.settings, request.call_id)
    if running.load(rt.settings, request.call_id) is None:
        running.remove(rt.settings, request.call_id)
        return DetachResult(detached=False, state=CallState.DONE)
    return DetachResult(detached=True, state=state)


def _listed_records(rt: Runtime, request: JobsRequest) -> list[JobRecord]:
    """The local records a listing reads: every job of the host for every owner's, else
    those its owner's index in Redis names (its jobs on this host: the rest are not
    read). A job Redis no longer lists is too old to show either way (`list_jobs`)."""
    if request.all_owners:
        return jobs.local_records(rt.settings)
    found = []
    for job_id in registry.owner_job_ids(rt.redis, rt.settings.host, request.owner):
        try:
            found.append(jobs.load_record(job_id, rt.settings))
        except (jobs.JobError, OSError, ValueError):
            continue  # its files were removed (`bashfleet gc`): nothing to show
    return found


def list_jobs(rt: Runtime, request: JobsRequest, admin: bool = False) -> JobList:
    """This host's jobs, fresh from its disk (and published to Redis): the asker's own,
    or every owner's for an admin who asks for `all_owners`. A job whose hash in Redis
    does not verify (forged) is published again from the disk, never shown as it was."""
    if request.all_owners and not admin:
        raise ToolError("unauthorized", "listing every owner's jobs needs the admin key")
    views = []
    records = [
        record for record in _listed_records(rt, request)
        if (record.owner == request.owner or request.all_owners)
        and (request.workspace is None or record.workspace == request.workspace)
    ]
    # One round trip for all of them (10,000 jobs: 2.2 s one by one, see bench_scale).
    known = registry.jobs_fields(rt.redis, [record.id for record in records])
    keys = rt.settings.sealing_keys()
    for record, stored in zip(records, known, strict=True):
        if not stored:
            continue  # expired from the fleet's listing: too old to show
        view = open_job_view(rt.keys, record.id, stored)
        if view is None or view.state != "ended":
            recovery.sync_job(rt.redis, record, keys)
            view = open_job_view(rt.keys, record.id, registry.job_fields(rt.redis, record.id))
        if view is not None:
            views.append(view)
    return JobList(jobs=tuple(views))
