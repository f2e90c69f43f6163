# Generated from client/_async/jobs.py by scripts/unasync.py:
# edit that file and run the script.
"""The fleet's background jobs: `Jobs`, the part of `Fleet` that acts on a job
(check, kill, read_output; an interactive one's stdin, output and terminal), lists
jobs across hosts and owners, and follows their events (`wait`, `events`: heard by
`bashfleet.client._sync.events.follow`). A job is addressed by its id or by the id of
the call that started it; its host is found in Redis, and asked on its control queue.

Written for asyncio; `client/_sync/jobs.py` is generated from it by
`scripts/unasync.py`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Generator, Mapping
from typing import TYPE_CHECKING, Literal

from bashfleet.client._core.constants import CTL_TIMEOUT_S, IDLE_TICK_S, TIMED_WAIT_TICK_S
from bashfleet.client._core.events import EventCursor, job_matches
from bashfleet.client._core.identity import record_keys_at, require_url
from bashfleet.client._core.messages import control_request
from bashfleet.client._core.routing import (
    ask_every_host,
    checked_id,
    output_host,
    unknown_job,
    unknown_output,
)
from bashfleet.client._sync import records
from bashfleet.client._sync.base import FleetBase, SentControl
from bashfleet.client._sync.events import follow
from bashfleet.client.errors import (
    FleetUnavailable,
    HostUnavailable,
    UnknownJob,
    WaitTimeout,
    WorkerLost,
)
from bashfleet.worker.fleet.connect import redis_client, safe_url
from bashfleet.worker.wire import names
from bashfleet.worker.wire.control import (
    CheckRequest,
    CloseStdinRequest,
    Collect,
    JobList,
    JobsRequest,
    KillRequest,
    ReadOutputRequest,
    ResizeRequest,
    SessionOutput,
    WriteStdinRequest,
)
from bashfleet.worker.wire.events import EventKind, JobEvent, event_matches
from bashfleet.worker.wire.models import CheckResult, JobView, OutputChunk, Truncation
from bashfleet.worker.wire.records import readers_job

if TYPE_CHECKING:
    from bashfleet.worker.fleet.connect import Redis


class Jobs(FleetBase):
    """`Fleet`'s jobs: act on one, list them, wait for one, hear their events."""

    # -------------------------------------------------------------------- one job

    def check(
        self, id: str, *, grep: str | None = None, offset: int | None = None,
        stderr_offset: int | None = None, truncation: Truncation | None = None,
    ) -> CheckResult:
        """A job's state and its output since `offset` (None: since the last check).

        "The last check" is any client's: the offsets are kept in the job's record.
        `truncation` cuts the new output (default: the last 2000 lines). `id`: the job's,
        or the call's that started it.
        """
        return self.check_job(control_request(
            CheckRequest, id=id, grep=grep, offset=offset, stderr_offset=stderr_offset,
            truncation=truncation,
        ))

    def check_job(self, request: CheckRequest) -> CheckResult:
        """`check`, from its request model."""
        host, job_id = self._job_target(request.id)
        return self._control(host, request.model_copy(update={"id": job_id}),
                                   CheckResult)

    def kill(
        self, id: str, *, offset: int | None = None, stderr_offset: int | None = None,
        truncation: Truncation | None = None,
    ) -> CheckResult:
        """End a job; its final state and its output since `offset` (None: the last check)."""
        return self.kill_job(control_request(
            KillRequest, id=id, offset=offset, stderr_offset=stderr_offset,
            truncation=truncation,
        ))

    def kill_job(self, request: KillRequest) -> CheckResult:
        """`kill`, from its request model."""
        host, job_id = self._job_target(request.id)
        return self._control(host, request.model_copy(update={"id": job_id}),
                                   CheckResult)

    def read_output(
        self, id: str, *, offset: int = 0, limit: int = 65536, grep: str | None = None,
        stream: Literal["stdout", "stderr"] = "stdout",
    ) -> OutputChunk:
        """A slice of a job's output, or of the kept (spilled) output of a call."""
        return self.read_chunk(control_request(
            ReadOutputRequest, id=id, offset=offset, limit=limit, grep=grep, stream=stream
        ))

    def read_chunk(self, request: ReadOutputRequest) -> OutputChunk:
        """`read_output`, from its request model."""
        found = self._on_redis(records.lookup_id, checked_id(request.id, "job or call"))
        if ask_every_host(found):
            return self._read_on_some_host(request)
        return self._control(output_host(request.id, found), request, OutputChunk)

    def _read_on_some_host(self, request: ReadOutputRequest) -> OutputChunk:
        """The kept output of an id Redis no longer knows (a call's record is kept
        minutes after its end, its output files on its host for days): each live host is
        asked in turn; the one that keeps it answers, the others say it is unknown."""
        for host in self._on_redis(records.live_hosts):
            with contextlib.suppress(UnknownJob):
                return self._control(host, request, OutputChunk)
        raise unknown_output(request.id)

    # ------------------------------------------------------- interactive sessions

    def write_stdin(
        self, id: str, data: str = "", *, collect: Collect | None = None,
        data_b64: str | None = None,
    ) -> SessionOutput:
        """Write `data` to an interactive job's stdin (through its terminal for a PTY:
        `\u0003` is Ctrl-C), then return its output since the last read by any client of
        this owner; empty `data` only reads. `collect` says how long to wait for output."""
        return self.write_stdin_request(control_request(
            WriteStdinRequest, id=id, data=data, data_b64=data_b64,
            collect=collect or Collect(),
        ))

    def write_stdin_request(self, request: WriteStdinRequest) -> SessionOutput:
        """`write_stdin`, from its request model."""
        return self._session_control(request, request.collect)

    def read(self, id: str, *, collect: Collect | None = None) -> SessionOutput:
        """An interactive job's output since the last read (a poll: nothing is written)."""
        return self.write_stdin(id, collect=collect)

    def close_stdin(self, id: str, *, collect: Collect | None = None) -> SessionOutput:
        """End an interactive job's input (EOF; Ctrl-D through a terminal); its new output."""
        return self.close_stdin_request(control_request(
            CloseStdinRequest, id=id, collect=collect or Collect()))

    def close_stdin_request(self, request: CloseStdinRequest) -> SessionOutput:
        """`close_stdin`, from its request model."""
        return self._session_control(request, request.collect)

    def resize(self, id: str, rows: int, cols: int) -> SessionOutput:
        """Set an interactive job's terminal size (its foreground process gets SIGWINCH)."""
        request = control_request(ResizeRequest, id=id, rows=rows, cols=cols)
        return self._session_control(request, Collect(read=False))

    def _session_control(
        self, request: WriteStdinRequest | CloseStdinRequest | ResizeRequest, collect: Collect
    ) -> SessionOutput:
        host, job_id = self._job_target(request.id)
        # The worker may wait that long for output before it answers.
        timeout = CTL_TIMEOUT_S + collect.wait_s + collect.delay_s
        return self._control(host, request.model_copy(update={"id": job_id}),
                                   SessionOutput, timeout)

    # ------------------------------------------------------- every job, and whose

    def jobs(
        self, host: str | None = None, *, all_owners: bool = False,
        tags: Mapping[str, str] | None = None, owner: str | None = None,
    ) -> list[JobView]:
        """This client's background jobs on one host, or on every host the fleet knows;
        oldest first; only those carrying every tag of `tags`. `all_owners` (an admin
        client only): every owner's, or those of `owner`. Every live host is asked at
        once; a dead one's jobs are what Redis last knew of them."""
        every = all_owners or (owner is not None and owner != self.owner)
        hosts = [host] if host is not None else self._on_redis(records.known_hosts)
        live = set(self._on_redis(records.live_hosts))
        request = JobsRequest(all_owners=every)
        asked: dict[str, SentControl] = {}
        for name in hosts:
            if name in live:
                with contextlib.suppress(WorkerLost, HostUnavailable):
                    asked[name] = self._send_control(name, request)
        views: list[JobView] = []
        for name in hosts:
            views += self._host_jobs(name, asked.get(name), every)
        return sorted((view for view in views if job_matches(view, tags=tags, owner=owner)),
                      key=lambda view: view.started_at)

    def _host_jobs(self, host: str, sent: SentControl | None,
                         all_owners: bool) -> list[JobView]:
        if sent is not None:
            try:
                return list((self._await_control(sent, JobList)).jobs)
            except (WorkerLost, HostUnavailable):
                pass  # it died meanwhile: show what Redis knows
        listed = self._on_redis(records.list_jobs, host, keys=self._record_keys,
                               space=None if all_owners else self._identity.space)
        return [view for view in listed if all_owners or view.owner == self.owner]

    def job_views(self, ids: list[str]) -> dict[str, JobView]:
        """What Redis knows of these jobs, by id, in one round trip (no worker is asked):
        how a dialect learns which of its jobs ended. Unknown ids are left out."""
        return self._on_redis(records.job_views, [i for i in ids if names.valid_id(i)],
                             keys=self._record_keys)

    def _acts_on(self, owner: str) -> bool:
        """Whether this client acts on what `owner` owns: its own; anyone's for a client
        of the fleet or admin key (the operator's)."""
        return owner == self.owner or not self._identity.owner_key

    # --------------------------------------------------------------------- events

    def wait(self, id: str, *, timeout: float | None = None) -> JobView:
        """Wait until a job (or the job a call started) ends; its final view.

        Hears the job's `ended` event (`events`) as it is published, and reads the job's
        record at each idle tick, so neither a missed publish nor a Redis reconnect
        makes it miss the end. WaitTimeout after `timeout` seconds (the job runs on).
        """
        _, job_id = self._job_target(id)
        since = self._on_redis(records.last_seq)
        view = (self.job_views([job_id])).get(job_id)
        if (view is None and not readers_job(
                self._record_keys, job_id, self._on_redis(records.job_hash, job_id))) \
                or (view is not None and not self._acts_on(view.owner)):
            # Another owner's job (its record does not open, or names another owner) is
            # told as no job is: waiting on it would tell it exists. One of this owner's
            # that a Redis writer changed is not believed, and waited on.
            raise unknown_job(id)
        deadline = None if timeout is None else time.monotonic() + timeout
        tick = IDLE_TICK_S if timeout is None else TIMED_WAIT_TICK_S
        stream = self._follow(since, tick)
        try:
            while view is None or view.state != "ended":
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeout(f"job {job_id} still running after {timeout:g}s",
                                      job_id=job_id)
                event = next(stream)
                if event is None or (event.job_id == job_id and event.kind == "ended"):
                    with contextlib.suppress(FleetUnavailable):  # Redis away: next tick
                        view = (self.job_views([job_id])).get(job_id, view)
            return view
        finally:
            stream.close()

    def events(
        self, *, host: str | None = None, kinds: tuple[EventKind, ...] = (),
        tags: Mapping[str, str] | None = None, since: str | None = None,
    ) -> Generator[JobEvent, None, None]:
        """Job events (a job started, a job ended) of the whole fleet as they happen,
        from any client; filtered by host, kind and tags. `since`: a `JobEvent.seq` to
        resume after ("0-0": every event kept); None: from now. Endless: break out of
        it (or close it).

        Each event is heard once, in order, across Redis reconnects and restarts, and
        across a local fleet brought down and up again (`bashfleet.client._core.events`); while
        Redis cannot be reached it keeps trying, and says so once (a warning in the
        `bashfleet.events` log).
        """
        start = since if since is not None else self._on_redis(records.last_seq)
        wanted = dict(tags or {})
        stream = self._follow(start, IDLE_TICK_S)
        try:
            for event in stream:
                if event is not None and event_matches(event, host=host, kinds=kinds,
                                                       tags=wanted):
                    yield event
        finally:
            stream.close()

    def _follow(self, since: str, tick_s: float) -> Generator[JobEvent | None, None, None]:
        cursor = EventCursor(since, time.time(), keys=self._record_keys)
        return follow(self._event_source, cursor, tick_s)

    def _event_source(self) -> tuple[Redis, str, dict[str, str]]:
        """The Redis to hear job events from now and the keys that verify them: this
        client's, or, when the fleet it found through `bashfleet up` was replaced by
        another, the new one's (another fleet seals with other keys)."""
        url = self._raw_url
        with contextlib.suppress(FleetUnavailable):
            url = require_url(self._asked_url)
        if url == self._raw_url:
            return self._redis, self.url, self._record_keys
        found = self._event_clients.get(url)
        if found is None:
            keys = record_keys_at(url, self.admin)
            found = self._event_clients[url] = (redis_client(url), keys)
        return found[0], safe_url(url), found[1]

