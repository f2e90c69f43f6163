"""How a worker recovers from faults, from what it keeps on its own disk.

- Running foreground calls (`bashfleet.worker.engine.running`: one file per call once it has run
  50 ms): a worker that starts after a crash kills the calls those files name and
  marks them lost, so a command whose caller was told "worker lost" does not go on
  running (or finish its side effects) behind everybody's back. A dead consumer's
  youngest calls are found by their Redis record and their marker instead
  (`_recover_unrecorded`).
- Background jobs have their own record files (`bashfleet.worker.engine.jobs.jobs`); `sync_job`
  publishes
a
  job's state to Redis, which a restarted worker does for every job it owns (and
  records the exit status of jobs that ended while it was down).
- When Redis loses its data (a restart without persistence, a flush, a failover to an
  empty replica), these files are how the worker rebuilds its part of the registry:
  `republish_calls` and `JobWatcher.republish_all`, run when the supervisor's
  heartbeat finds its host record gone.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from bashfleet.worker.engine import procs, running
from bashfleet.worker.engine.jobs import jobs
from bashfleet.worker.engine.running import ORPHAN_GRACE_S, RunningCall
from bashfleet.worker.fleet import registry
from bashfleet.worker.fleet.connect import Redis
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire import names
from bashfleet.worker.wire.models import JobRecord, JobStatus
from bashfleet.worker.wire.names import CALL_ACTIVE, CallState

log = logging.getLogger("bashfleet.worker")


def recover_orphans(
    settings: Settings,
    client: Redis | None,
    *,
    worker_pid: int | None = None,
    reason: str,
) -> list[str]:
    """Kill the calls a dead worker left running; mark them lost; return their ids.

    `worker_pid` limits this to the calls of one dead consumer process; None takes
    every recorded call (a worker starting after a crash, or stopping).
    """
    entries = [e for e in running.all_calls(settings) if worker_pid in (None, e.worker_pid)]

    def end(entry: RunningCall) -> str:
        survivors = running.kill(entry, ORPHAN_GRACE_S)
        if survivors:
            log.warning("call %s: %d process(es) survived the kill", entry.call_id, len(survivors))
        _mark_lost(settings, client, entry.call_id, reason)
        running.remove(settings, entry.call_id)
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


def _mark_lost(settings: Settings, client: Redis | None, call_id: str,
               reason: str) -> None:
    if client is None:
        return
    try:
        registry.mark_call(client, call_id, CallState.LOST, note=reason, ended_at=time.time())
        registry.forget_busy(client, settings.host, call_id)
    except Exception as exc:  # Redis down: the files are the truth; carry on.
        log.warning("call %s: could not record it as lost: %s", call_id, exc)


def _recover_unrecorded(
    settings: Settings, client: Redis, worker_pid: int | None, known: set[str],
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
        if call_id in known or record.get("state") not in CALL_ACTIVE:
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


def republish_calls(settings: Settings, client: Redis, instance: str) -> int:
    """Publish again the running calls of this worker instance (Redis lost them).

    Their call records and busy slots come back from the local files, so a caller
    can still cancel them and `hosts` counts them; a call that ends meanwhile keeps
    its end (see `registry.restore_running_call`). Returns how many were restored.
    """
    restored = 0
    for entry in running.all_calls(settings):
        if entry.instance != instance:
            continue  # a dead instance's call: recover_orphans ends those
        state = registry.restore_running_call(
            client, settings.host, entry.call_id, instance=entry.instance,
            worker_pid=entry.worker_pid, pid=entry.pid, pgid=entry.pgid,
            marker=entry.marker, started_at=entry.start_time, owner=entry.owner,
            keys=settings.fleet_keys(),
        )
        restored += state in CALL_ACTIVE
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


def sync_job(client: Redis, record: JobRecord, keys: registry.Keys) -> bool:
    """Publish a job's current state to Redis, sealed with `keys`; True while it runs."""
    alive, status = job_state(record)
    registry.save_job(
        client, record, keys=keys, running=alive,
        exit_code=status.exit_code if status else None,
        signal=status.signal if status else None,
        ended_at=status.ended_at if status else None,
        note=status.note if status else None,
    )
    return alive


class JobListener(Protocol):
    """Told of background jobs' starts and ends (`bashfleet.worker.fleet.flower.JobEvents`)."""

    def started(self, record: JobRecord) -> None:
        """A job runs (first seen running by this watcher)."""

    def ended(self, record: JobRecord, status: JobStatus | None) -> None:
        """A job the listener was told of ended."""


class JobWatcher:
    """Keeps Redis in step with this host's background jobs (run by the supervisor).

    Every job is published once (a restarted worker re-adopts its live jobs and records
    the end of those that ended while it was down); running jobs are re-checked on each
    pass, so their end shows in listings without anybody checking them.
    """

    def __init__(
        self, settings: Settings, client: Redis, listener: JobListener | None = None
    ) -> None:
        self.settings = settings
        self.client = client
        self.keys = settings.sealing_keys()
        self._ended: set[str] = set()
        self._seen: set[str] = set()
        self._listener = listener
        self._announced: set[str] = set()  # told to the listener as running
        self._since = time.time()
        self._running: dict[str, JobRecord] = {}

    def republish_all(self) -> None:
        """Publish every job again at the next pass, ended ones too (Redis lost them).

        Running jobs are re-published on every pass anyway; this brings back the
        records of jobs that ended, so they stay checkable after a Redis data loss.
        """
        self._ended.clear()
        self._seen.clear()
        self._running.clear()

    def _record_ids(self) -> list[str]:
        folder = self.settings.jobs_dir
        if not folder.is_dir():
            return []
        # Records are <id>.json; spec and status files have a second suffix.
        return [p.stem for p in folder.glob("*.json") if "." not in p.stem]

    def sync(self) -> int:
        """One pass; returns how many jobs run now."""
        live = 0
        horizon = time.time() - names.JOB_TTL_S
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
            if sync_job(self.client, record, self.keys):
                live += 1
                self._running[job_id] = record
                self._announce(record, running=True)
            else:
                self._ended.add(job_id)
                self._running.pop(job_id, None)
                self._announce(record, running=False)
        return live

    def sync_ended(self) -> int:
        """Publish at once the end of the running jobs whose status file appeared (one
        stat each, no Redis otherwise), so `wait` and job events hear of an end within
        a tick of the supervisor's loop, not at the next full pass. Returns how many."""
        ended = [r for r in self._running.values() if os.path.exists(r.status_path)]
        for record in ended:
            sync_job(self.client, record, self.keys)
            self._running.pop(record.id, None)
            self._ended.add(record.id)
            self._announce(record, running=False)
        return len(ended)

    def _announce(self, record: JobRecord, *, running: bool) -> None:
        """Tell the listener (Flower's view) of a job's start, once, and of its end: for
        a job it saw running, or one that started (and ended) since this watcher did."""
        listener = self._listener
        if listener is None:
            return
        seen = record.id in self._announced
        if not seen and (running or record.started_at >= self._since):
            listener.started(record)
            self._announced.add(record.id)
            seen = True
        if not running and seen:
            listener.ended(record, jobs.read_status(record))
            self._announced.discard(record.id)
