"""What a worker keeps on its own disk to survive its own death, and how it recovers.

- One small JSON file per running foreground call (`<state_dir>/running/<call_id>.json`:
  pid, process group, marker, start time), written once the call has run 50 ms (most
  calls end sooner, and a dead consumer's youngest calls are found by their Redis
  record and their marker instead: `_recover_unrecorded`) and removed when it ends.
  A worker that starts after a crash kills the process groups those files name, so a
  command whose caller was told "worker lost" does not go on running (or finish its
  side effects) behind everybody's back. The files are the truth even when Redis lost
  its data.
- Background jobs have their own record files (`worker.engine.jobs`); `sync_job` publishes a
  job's state to Redis, which a restarted worker does for every job it owns (and
  records the exit status of jobs that ended while it was down).
- When Redis loses its data (a restart without persistence, a flush, a failover to an
  empty replica), these files are how the worker rebuilds its part of the registry:
  `republish_calls` and `JobWatcher.republish_all`, run when the supervisor's
  heartbeat finds its host record gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from worker.engine import jobs, procs

from worker.fleet import registry
from worker.wire.models import JobRecord, JobStatus
from worker.settings import Settings

log = logging.getLogger("bashfleet.worker")

#: Grace between SIGTERM and SIGKILL for calls orphaned by a dead worker.
ORPHAN_GRACE_S = 1.0


class RunningCall(BaseModel):
    """A foreground call whose bash runs now, as recorded on the host's disk."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    call_id: str
    """The call's id (also its marker)."""
    pid: int
    """Process id of the call's bash (its process group leader)."""
    pgid: int
    """Process group id."""
    marker: str
    """Marker value every process of the call carries."""
    start_time: float
    """Kernel start time of `pid`: guards against pid reuse."""
    worker_pid: int
    """Process that runs the call (the exec consumer)."""
    instance: str
    """Worker instance (host lock token) that ran it."""
    kill_grace_s: float = 2.0
    """The call's policy grace between SIGTERM and SIGKILL."""


def running_dir(settings: Settings) -> Path:
    """Where running-call files live."""
    return settings.state_dir / "running"


def _path(settings: Settings, call_id: str, suffix: str = ".json") -> str:
    # A str, not a Path: built twice on every call, where pathlib costs microseconds.
    return os.path.join(settings.state_dir, "running", call_id + suffix)


def save_running(settings: Settings, entry: RunningCall) -> None:
    """Record a call's processes, atomically (a reader never sees a partial file).

    Runs on every foreground call: plain os calls, and the directory is made only when
    it is missing (an mkdir on every call failed with EEXIST, a syscall for nothing).
    """
    path = _path(settings, entry.call_id)
    tmp = _path(settings, entry.call_id, ".tmp")
    data = entry.model_dump_json().encode("utf-8")
    try:
        _write_file(tmp, data)
    except FileNotFoundError:
        running_dir(settings).mkdir(parents=True, exist_ok=True, mode=0o700)
        _write_file(tmp, data)
    os.replace(tmp, path)


def _write_file(path: str, data: bytes) -> None:
    # 0o666 before the umask: the mode pathlib's write_text gave these files.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def remove_running(settings: Settings, call_id: str) -> None:
    """Forget a call that ended (or became a background job)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_path(settings, call_id))


def load_running(settings: Settings, call_id: str) -> RunningCall | None:
    """The running call's record, or None."""
    if not registry.valid_id(call_id):
        return None
    try:
        return RunningCall.model_validate_json(Path(_path(settings, call_id)).read_text("utf-8"))
    except (FileNotFoundError, ValueError):
        return None


def all_running(settings: Settings) -> list[RunningCall]:
    """Every running-call record on this host."""
    folder = running_dir(settings)
    if not folder.is_dir():
        return []
    entries = []
    for path in sorted(folder.glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            entries.append(RunningCall.model_validate_json(path.read_text("utf-8")))
    return entries


def kill_running(entry: RunningCall, grace_s: float | None = None) -> list[int]:
    """End a call's processes (group, then marked escapees); return survivors."""
    # The group is signalled only while its leader is the very process we started;
    # otherwise the marker sweep alone finds what is left of the call.
    leader_ours = procs.is_same_process(entry.pid, entry.start_time)
    return procs.terminate(
        entry.pgid if leader_ours else None, entry.marker,
        grace_s=entry.kill_grace_s if grace_s is None else grace_s,
    )


def recover_orphans(
    settings: Settings,
    client: registry.Redis | None,
    *,
    worker_pid: int | None = None,
    reason: str,
) -> list[str]:
    """Kill the calls a dead worker left running; mark them lost; return their ids.

    `worker_pid` limits this to the calls of one dead consumer process; None takes
    every recorded call (a worker starting after a crash, or stopping).
    """
    entries = [e for e in all_running(settings) if worker_pid in (None, e.worker_pid)]

    def end(entry: RunningCall) -> str:
        survivors = kill_running(entry, ORPHAN_GRACE_S)
        if survivors:
            log.warning("call %s: %d process(es) survived the kill", entry.call_id, len(survivors))
        _mark_lost(settings, client, entry.call_id, reason)
        remove_running(settings, entry.call_id)
        return entry.call_id

    ended: list[str] = []
    if entries:
        with ThreadPoolExecutor(max_workers=min(8, len(entries))) as pool:
            ended = list(pool.map(end, entries))
    if client is not None:
        known = {e.call_id for e in entries}
        ended += _recover_unrecorded(settings, client, worker_pid, known, reason)
    if ended:
        log.warning("killed %d call(s) left running by %s: %s", len(ended), reason,
                    ", ".join(ended))
    return ended


def _mark_lost(settings: Settings, client: registry.Redis | None, call_id: str,
               reason: str) -> None:
    if client is None:
        return
    try:
        registry.mark_call(client, call_id, "lost", note=reason, ended_at=time.time())
        client.srem(registry.running_key(settings.host), call_id)
    except Exception as exc:  # Redis down: the files are the truth; carry on.
        log.warning("call %s: could not record it as lost: %s", call_id, exc)


def _recover_unrecorded(
    settings: Settings, client: registry.Redis, worker_pid: int | None, known: set[str],
    reason: str,
) -> list[str]:
    """Calls a dead consumer claimed but had not (or no longer) on disk: it died between
    the claim and the spawn record, or between the call's end and its finish. Their
    records in the host's busy set name them; their processes, if any started, carry
    their marker. Without this their callers would wait for them forever."""
    try:
        busy = registry.busy_calls(client, settings.host)
    except Exception as exc:  # Redis down: its records are checked next time
        log.warning("could not list the calls claimed on %s: %s", settings.host, exc)
        return []
    lost = []
    for call_id, record in busy.items():
        if call_id in known or record.get("state") not in registry.CALL_ACTIVE:
            continue
        if worker_pid is not None and record.get("worker_pid") != str(worker_pid):
            continue
        survivors = procs.terminate(None, record.get("marker") or call_id,
                                    grace_s=ORPHAN_GRACE_S)
        if survivors:
            log.warning("call %s: %d process(es) survived the kill", call_id, len(survivors))
        _mark_lost(settings, client, call_id, reason)
        lost.append(call_id)
    return lost


def republish_calls(settings: Settings, client: registry.Redis, instance: str) -> int:
    """Publish again the running calls of this worker instance (Redis lost them).

    Their call records and busy slots come back from the local files, so a caller
    can still cancel them and `hosts` counts them; a call that ends meanwhile keeps
    its end (see `registry.restore_running_call`). Returns how many were restored.
    """
    restored = 0
    for entry in all_running(settings):
        if entry.instance != instance:
            continue  # a dead instance's call: recover_orphans ends those
        state = registry.restore_running_call(
            client, settings.host, entry.call_id, instance=entry.instance,
            worker_pid=entry.worker_pid, pid=entry.pid, pgid=entry.pgid,
            marker=entry.marker, started_at=entry.start_time,
        )
        restored += state in registry.CALL_ACTIVE
    return restored


# ------------------------------------------------------------------------------- jobs


def job_state(record: JobRecord) -> tuple[bool, JobStatus | None]:
    """(running, status): a job that ended unseen gets its status recorded as unknown."""
    status = jobs.read_status(record)
    if status is not None:
        return False, status
    if jobs.is_running(record):
        return True, None
    jobs.write_status(record, None, note="ended while no worker was watching; exit status unknown")
    return False, jobs.read_status(record)


def sync_job(client: registry.Redis, record: JobRecord) -> bool:
    """Publish a job's current state to Redis; return True while it runs."""
    running, status = job_state(record)
    registry.save_job(
        client, record, running=running,
        exit_code=status.exit_code if status else None,
        signal=status.signal if status else None,
        ended_at=status.ended_at if status else None,
        note=status.note if status else None,
    )
    return running


class JobWatcher:
    """Keeps Redis in step with this host's background jobs (run by the supervisor).

    Every job is published once (a restarted worker re-adopts its live jobs and records
    the end of those that ended while it was down); running jobs are re-checked on each
    pass, so their end shows in listings without anybody checking them.
    """

    def __init__(self, settings: Settings, client: registry.Redis) -> None:
        self.settings = settings
        self.client = client
        self._ended: set[str] = set()
        self._seen: set[str] = set()

    def republish_all(self) -> None:
        """Publish every job again at the next pass, ended ones too (Redis lost them).

        Running jobs are re-published on every pass anyway; this brings back the
        records of jobs that ended, so they stay checkable after a Redis data loss.
        """
        self._ended.clear()
        self._seen.clear()

    def _record_ids(self) -> list[str]:
        folder = self.settings.jobs_dir
        if not folder.is_dir():
            return []
        # Records are <id>.json; spec and status files have a second suffix.
        return [p.stem for p in folder.glob("*.json") if "." not in p.stem]

    def sync(self) -> int:
        """One pass; returns how many jobs run now."""
        running = 0
        horizon = time.time() - registry.JOB_TTL_S
        for job_id in self._record_ids():
            if job_id in self._ended:
                continue
            try:
                record = jobs.load_record(job_id, self.settings)
            except (jobs.JobError, ValueError, OSError):
                self._ended.add(job_id)
                continue
            if job_id not in self._seen:
                self._seen.add(job_id)
                status = jobs.read_status(record)
                if status is not None and status.ended_at < horizon:
                    self._ended.add(job_id)  # too old to list again
                    continue
            if sync_job(self.client, record):
                running += 1
            else:
                self._ended.add(job_id)
        return running
