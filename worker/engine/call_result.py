"""A foreground call's result, built from the files (or the bounded memory) its output
went to: shaped by its policy, its limits, its spill kept or removed, and how it ended.

`call.run_call` spawns and follows the call; this module only reads what it left."""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bashfleet.worker.engine import limits, procs, resources, session_state
from bashfleet.worker.engine.jobs import jobs
from bashfleet.worker.engine.output import truncate
from bashfleet.worker.engine.output.capture import (
    Extras,
    FollowedFile,
    MemoryStream,
    Shaped,
    Source,
    shape,
)
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import (
    CANCELLED_MESSAGE,
    Call,
    CallResult,
    JobRecord,
    ProcessInfo,
    Spill,
    SystemError_,
)

#: Why a foreground call's wait ended.
EndReason = Literal["exited", "timeout", "cancel", "output", "detach"]


@dataclass
class Streams:
    """The files a foreground call writes into."""

    stdout: Path
    stderr: Path | None  # None: stderr goes into the stdout file (combined)

    def followers(self) -> list[FollowedFile]:
        files = [FollowedFile(self.stdout)]
        if self.stderr is not None:
            files.append(FollowedFile(self.stderr))
        return files


@dataclass
class Pipes:
    """Output kept in bounded memory because the spill directory cannot take it."""

    stdout: MemoryStream
    stderr: MemoryStream | None  # None: stderr goes into stdout (combined)
    reason: str
    pumps: list[threading.Thread]

    def drained(self, timeout: float = 1.0) -> None:
        """Wait for the pumps to reach EOF; a daemon the call left holding a pipe may
        keep one open, so give up after `timeout` (memory stays bounded either way)."""
        deadline = time.monotonic() + timeout
        for pump in self.pumps:
            pump.join(max(0.0, deadline - time.monotonic()))


def with_state(result: CallResult, recorded: bytes, started_with: dict[str, str]) -> CallResult:
    """Add the cwd and environment changes the command ended with (nothing recorded: the
    command replaced the shell, or set its own EXIT trap)."""
    final = session_state.parse_state(recorded, started_with)
    if final is None:
        return result
    return result.model_copy(
        update={"cwd_after": final.cwd, "env_changes": final.changes, "env_removed": final.removed}
    )


@dataclass
class ResultBuilder:
    """Builds the result of a foreground call from its files."""

    call: Call
    settings: Settings
    streams: Streams
    files: list[FollowedFile]
    secrets: re.Pattern[str] | None
    cwd: str
    started: float
    pipes: Pipes | None = None

    def _sources(self) -> list[tuple[Source, int, int]]:
        """(source, size, lines) of each stream, files caught up to their end."""
        if self.pipes is not None:
            streams = [self.pipes.stdout] + ([self.pipes.stderr] if self.pipes.stderr else [])
            return [(m, m.total, m.lines) for m in streams]
        for followed in self.files:
            followed.catch_up()
        return [(f.source(), f.offset, f.lines) for f in self.files]

    def _shaped(self) -> tuple[Shaped, Shaped | None]:
        policy = self.call.policy
        extras = Extras.of(policy)
        # The pi dialect's head/tail options pick lines of the whole output, not of the
        # part truncation would show.
        asked = (self.call.head, self.call.tail)
        shaped = [
            shape(source, size, lines, policy.truncation, self.secrets,
                  digest=policy.digest_errors, extras=extras, lines=asked)
            for source, size, lines in self._sources()
        ]
        return shaped[0], (shaped[1] if len(shaped) > 1 else None)

    def _spill(self, out: Shaped, err: Shaped | None, keep: bool) -> Spill | None:
        if self.pipes is not None:
            cut = out.info.truncated or (err is not None and err.info.truncated)
            reason = f"{self.pipes.reason}; output kept in memory, the cut part is lost"
            return Spill(host=self.settings.host, error=reason) if cut else None
        sizes = [f.offset for f in self.files]
        wanted = keep or (
            (out.info.truncated or (err is not None and err.info.truncated))
            and sum(sizes) > self.call.policy.spill_min_bytes
        )
        if not wanted:
            # Nobody reads them again, and the answer says none was kept: gone before it
            # goes out (whoever looks at the host once they heard it finds none).
            for followed in self.files:
                followed.path.unlink(missing_ok=True)
            return None
        return Spill(
            host=self.settings.host,
            stdout_path=str(self.streams.stdout),
            stderr_path=str(self.streams.stderr) if self.streams.stderr else None,
            stdout_bytes=sizes[0],
            stderr_bytes=sizes[1] if len(sizes) > 1 else 0,
        )

    def _result(self, *, keep_files: bool = False, **fields: object) -> CallResult:
        out, err = self._shaped()
        out_text, err_text = self._limits(out.text), self._limits(err.text if err else "")
        return CallResult(
            call_id=self.call.call_id,
            host=self.settings.host,
            combined=self.call.policy.streams == "combined",
            stdout=out_text,
            stderr=err_text,
            stdout_truncation=out.info,
            stderr_truncation=err.info if err else None,
            spill=self._spill(out, err, keep_files),
            error_digest=out.digest + (err.digest if err else ()),
            duration_s=time.monotonic() - self.started,
            cwd=self.cwd,
            **fields,
        )

    def _limits(self, text: str) -> str:
        # The pi dialect's explicit head/tail limits, head first. `shape` applied them to the
        # whole output already (this changes nothing then); kept for texts it did not
        # shape by them (an output kept in memory whose middle is gone).
        if self.call.head is not None:
            text = truncate.head_lines(text, self.call.head)
        if self.call.tail is not None:
            text = truncate.last_lines(text, self.call.tail)
        return text

    def finished(self, returncode: int, hits: tuple[str, ...] = ()) -> CallResult:
        code, sig = split_status(returncode)
        result = self._result(exit_code=code, signal=sig)
        hit: str | None = cgroup_hit(hits, code, sig)
        host = resources.host_limits(self.settings)
        if hit is None and host.any():
            hit = limits.limit_hit(host, code, sig, result.stdout + "\n" + result.stderr)
        return result.model_copy(update={"limit_hit": hit}) if hit else result

    def _output_age(self) -> float | None:
        """Seconds since any of the call's files last grew; None when it wrote nothing."""
        if self.pipes is not None:
            last = self.pipes.stdout.last_write
            if self.pipes.stderr is not None:
                last = max(last, self.pipes.stderr.last_write)
            return round(max(0.0, time.time() - last), 3) if last else None
        stamps = []
        for followed in self.files:
            with contextlib.suppress(OSError):
                info = os.stat(followed.path)
                if info.st_size:
                    stamps.append(info.st_mtime)
        return round(max(0.0, time.time() - max(stamps)), 3) if stamps else None

    def killed(
        self,
        returncode: int,
        survivors: list[int],
        doing: tuple[ProcessInfo, ...],
        *,
        reason: EndReason,
    ) -> CallResult:
        code, sig = split_status(returncode)
        error = None
        if reason == "cancel":
            error = SystemError_(kind="cancelled", message=CANCELLED_MESSAGE)
        if survivors:
            message = f"{len(survivors)} process(es) survived the kill: {survivors}"
            error = SystemError_(kind="internal", message=message)
        result = self._result(
            exit_code=code, signal=sig, timed_out=reason == "timeout",
            cancelled=reason == "cancel", error=error, processes=doing,
            last_output_age_s=self._output_age(),
        )
        return result if reason != "output" else self._capped(result)

    def _capped(self, result: CallResult) -> CallResult:
        """The result of a call stopped for writing too much: says so where it is read."""
        notice = (f"\n[bashfleet: the output passed this host's cap of "
                  f"{self.settings.limit_output_mb} MiB; the call was stopped]\n")
        field = "stdout" if self.call.policy.streams == "combined" else "stderr"
        text = getattr(result, field)
        return result.model_copy(update={field: text + notice, "limit_hit": "output"})

    def backgrounded(self, record: JobRecord, pid: int, *, timed_out: bool) -> CallResult:
        alive = procs.find_call_processes(record.pgid, record.marker)
        return self._result(
            keep_files=True,
            timed_out=timed_out,
            backgrounded=True,
            job=jobs.handle(record),
            processes=procs.describe(alive),
            last_output_age_s=self._output_age(),
        )


def cgroup_hit(
    hits: tuple[str, ...], code: int | None, sig: int | None
) -> Literal["memory", "processes"] | None:
    """The cgroup limit that ended a call: counted by the kernel, reported when the call
    failed (a limit reached on the way by a call that then succeeded ended nothing)."""
    if sig is None and code == 0:
        return None
    if "memory" in hits:
        return "memory"
    if "pids" in hits:
        return "processes"
    return None


def split_status(returncode: int) -> tuple[int | None, int | None]:
    """Popen's returncode to (exit code, signal): negative means killed by that signal."""
    if returncode < 0:
        return None, -returncode
    return returncode, None
