"""The fleet's watcher of one exec call (`bashfleet.worker.engine.watcher.CallWatcher`):
the call's records on this host while it runs, on its disk and in Redis.

    starting           the call's claim answered "ok" (else `NotClaimed`: nothing starts)
    spawned            remember the process and its output folder; the start line
    running            owner file, then `running/<call_id>.json`, then the Redis record
    cancelled          `running/<call_id>.cancel` exists (a control consumer wrote it)
    detach_requested   `running/<call_id>.detach` exists (only once the call is on disk)
    put_away           its workspace's turn, kept for after the answer (`put_away_now`)
    ended              the running file and a seen cancel flag removed
    settle             at the end: the owner file kept if the output was, removed if not

Most calls end before `running`: their process is recorded with their end, a file
write, a /proc read and a round trip fewer.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import redis

# Named apart: `running` is also the event's method below.
from bashfleet.worker.engine import procs
from bashfleet.worker.engine import running as running_calls
from bashfleet.worker.engine.watcher import Spawned
from bashfleet.worker.fleet import control, flower, registry
from bashfleet.worker.fleet.control import Runtime
from bashfleet.worker.fleet.verify import message_queue
from bashfleet.worker.wire.models import Call
from bashfleet.worker.wire.names import CallState

log = logging.getLogger("bashfleet.worker")


class NotClaimed(Exception):  # noqa: N818 - a refusal, not an error of the engine
    """A call its claim did not give this worker: the engine starts nothing for it."""


def log_start(call: Call) -> None:
    """A call's start line: never its command text nor its env (they may hold secrets)."""
    queue = message_queue()
    log.info(
        "call started: queue %s, cwd %s, command of %d chars%s", queue or "-", call.cwd or "~",
        len(call.command), ", background" if call.background else "",
        extra={
            "call_id": call.call_id, "queue": queue, "cwd": call.cwd,
            "command_chars": len(call.command), "background": call.background,
            "timeout_s": call.timeout_s, "dialect": call.policy.name,
        },
    )


class ExecWatcher:
    """What the engine tells the fleet about one call, and what the fleet answers.

    The owner of the call's kept output is written on the host's disk too (`read_output`
    serves it to that owner only, long after the call's record left Redis), only when
    there is something to read: once the call runs on (its output is read while it runs),
    or at its end when its output was kept. Most calls keep nothing: no file written,
    then removed.
    """

    def __init__(self, rt: Runtime, call: Call,
                 claim: Callable[[], str] | None = None) -> None:
        self.rt, self.call = rt, call
        self.claim = claim
        """Reads the call's claim, sent before it was prepared (None: claimed already)."""
        self.process: Spawned | None = None
        self.on_disk = False
        """The call's running file was written: `ended` removes it."""
        self.owner_written = False
        self.cancel = running_calls.CancelFlag(rt.settings, call.call_id)
        self.later: list[Callable[[], None]] = []
        """What puts the call's workspace away: run by `put_away_now` once it answered."""

    def starting(self) -> None:
        """Start nothing unless the call's claim said "ok" (`NotClaimed`: its caller
        reads the claim again for the refusal, or the Redis error, it tells)."""
        if self.claim is not None:
            try:
                state = self.claim()
            except Exception:  # its Redis error is raised again where the claim is read
                raise NotClaimed(self.call.call_id) from None
            if state != "ok":
                raise NotClaimed(self.call.call_id)

    def spawned(self, process: Spawned) -> None:
        """Remember the call's process: recorded once it runs on, or with its end. Its
        start line and its `task-started` event (`flower.release_started`) are written
        now, while bash starts up (not before: they would delay it)."""
        self.process = process
        log_start(self.call)
        flower.release_started(self.call.call_id, self.call)

    def running(self) -> None:
        """Record the call's process once it has run FOLLOW_INTERVAL_S: on the host's disk
        (what a restarted worker, a cancel and a stop go by), then in Redis; kill it if
        it was cancelled (or its worker stopped) before a canceller could find it on
        disk. Its output's owner is written first: its output is read while it runs.

        If the consumer dies before this, the supervisor finds the call by its Redis
        record and its processes by their marker (`recovery.recover_orphans`). The
        order, disk then Redis, is what makes a cancel never missed: a canceller marks
        the call in Redis, then looks on disk.
        """
        self._write_owner()
        if self.process is None:
            return
        entry = self._entry(self.process)
        running_calls.save(self.rt.settings, entry)
        self.on_disk = True
        try:
            state = registry.update_call(self.rt.redis, self.call.call_id, **self.fields())
        except redis.RedisError as exc:
            log.warning("call %s: could not record its process: %s", self.call.call_id, exc,
                        extra={"call_id": self.call.call_id})
            return
        if state in (CallState.CANCELLING, CallState.STOPPING):
            running_calls.kill(entry)

    def cancelled(self) -> bool:
        """The call's cancel flag is on the host's disk (one stat)."""
        return self.cancel.is_set()

    def detach_requested(self) -> bool:
        """The call's detach flag is on the host's disk: looked for only once the call
        is, since a detach request finds the call there first."""
        return self.on_disk and running_calls.detach_requested(self.rt.settings, self.call.call_id)

    def put_away(self, step: Callable[[], None]) -> None:
        """Kept: the caller's answer goes out first."""
        self.later.append(step)

    def put_away_now(self) -> None:
        """Put the call's workspace away (whether its answer went out or not)."""
        steps, self.later = self.later, []
        for step in steps:
            try:
                step()
            except Exception:  # the task's own end still runs
                log.exception("call %s: its workspace could not be put away",
                              self.call.call_id, extra={"call_id": self.call.call_id})

    def fields(self) -> dict[str, object]:
        """The process fields of the call record (none before a spawn)."""
        if self.process is None:
            return {}
        process = self.process
        return {"pid": process.pid, "pgid": process.pgid, "marker": process.marker}

    def ended(self) -> None:
        """The call's engine returned: forget its running file, or the cancel flag it saw
        (nobody looks for either any more)."""
        if self.on_disk:
            running_calls.remove(self.rt.settings, self.call.call_id)
        elif self.cancel.fired:
            running_calls.forget_cancel(self.rt.settings, self.call.call_id)

    def settle(self, *, kept: bool) -> None:
        """At the call's end: the owner file written if its output was kept, removed if
        not."""
        if kept:
            self._write_owner()
        elif self.owner_written:
            with contextlib.suppress(OSError):
                control.owner_file(self.rt.settings, self.call.call_id).unlink(missing_ok=True)

    def _entry(self, process: Spawned) -> running_calls.RunningCall:
        return running_calls.RunningCall(
            call_id=self.call.call_id, pid=process.pid, pgid=process.pgid,
            marker=process.marker,
            start_time=procs.start_time(process.pid) or time.time(), worker_pid=os.getpid(),
            instance=self.rt.instance, kill_grace_s=self.call.policy.kill_grace_s,
            owner=self.call.owner,
        )

    def _write_owner(self) -> None:
        """Write who owns the call's output and where it is (once; not before a spawn)."""
        if self.owner_written or self.process is None:
            return
        self.owner_written = True
        _keep_owner(self.rt, self.call, self.process.output_dir)


def _keep_owner(rt: Runtime, call: Call, folder: Path) -> None:
    path = control.owner_file(rt.settings, call.call_id)
    text = f"{call.owner}\n{folder}"
    try:
        try:
            _write_private(path, text)
        except FileNotFoundError:  # the host's first call
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            _write_private(path, text)
    except OSError as exc:  # the output stays readable by an admin
        log.warning("call %s: could not record its owner: %s", call.call_id, exc,
                    extra={"call_id": call.call_id})


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
