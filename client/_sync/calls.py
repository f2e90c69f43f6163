# Generated from client/_async/calls.py by scripts/unasync.py:
# edit that file and run the script.
"""The fleet's calls: `Calls`, the part of `Fleet` that runs a command
(`run`, `execute`; in a session's shell and workspace), sends it (one Lua script:
recorded and pushed in one round trip), waits for its answer, watches every call in
flight (one pipelined read per WATCH_INTERVAL_S: a lost worker shows within seconds),
and cancels or detaches one.

Written for asyncio; `client/_sync/calls.py` is generated from it by
`scripts/unasync.py`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from bashfleet.client import shells
from bashfleet.client._core.constants import FULL_OUTPUT_MAX_BYTES, WATCH_INTERVAL_S
from bashfleet.client._core.messages import (
    build_call,
    decode_result,
    exec_message,
    raise_if_not_run,
    run_request,
)
from bashfleet.client._core.output import FullRead, OutputMode, full_reads, with_full_output
from bashfleet.client._core.routing import (
    CallProgress,
    Placement,
    Route,
    call_record_of,
    checked_call_id,
    pool_members,
    route,
    unknown_call,
)
from bashfleet.client._core.watch import (
    Outage,
    Pending,
    Verdict,
    due,
    labels_to_read,
    note_lock,
    note_queue,
    verdict,
)
from bashfleet.client._core.workspaces import open_view
from bashfleet.client._sync import records
from bashfleet.client._sync.base import CLOSED, unreachable
from bashfleet.client._sync.concurrency import CANCELLATION_EXCEPTIONS, Slot
from bashfleet.client._sync.jobs import Jobs
from bashfleet.client._sync.replies import Answer
from bashfleet.client._sync.workspaces import Workspaces
from bashfleet.client.errors import (
    CallRejected,
    FleetUnavailable,
    UnknownCall,
    UnknownJob,
    WorkerError,
)
from bashfleet.worker.fleet.connect import redis_errors
from bashfleet.worker.wire import names
from bashfleet.worker.wire.control import (
    MAX_READ_LIMIT,
    CancelRequest,
    CancelResult,
    DetachRequest,
    DetachResult,
)
from bashfleet.worker.wire.models import CallResult, HostInfo, RunRequest
from bashfleet.worker.wire.names import CallState

log = logging.getLogger(__name__)

#: The watch's name among a client's background work.
WATCH = "bashfleet-watch"


class Calls(Workspaces, Jobs):
    """`Fleet`'s calls: `run`, `execute`, `cancel`, `detach`, `call_progress`,
    `call_host`, `shared_queues`, and the watch of the calls in flight. Over
    `Workspaces` (a call in a workspace runs on its host; a session's first call makes
    the session's) and `Jobs` (`output="full"` reads the output back with `read_output`)."""

    # ------------------------------------------------------------------------ run

    def run(
        self, command: str, *, check: bool = True, output: OutputMode = "tail",
        max_output_bytes: int = FULL_OUTPUT_MAX_BYTES, **options: Any,
    ) -> CallResult:
        """Run `command` and wait for its result; `options` are `RunRequest`'s fields
        (host, label, mode, timeout, cwd, session, policy, env, call_id, head, tail,
        unset_env, capture_state, tags, stdin...). An unknown or invalid option is a
        CallRejected, nothing sent.

        `host` None: any live host (`label`: a host of that pool). `mode`: `default`
        (the policy's timeout), `slow` (15 minutes unless `timeout` says otherwise) or
        `background` (start it detached, return its job at once). A `session` is a
        shell that lives on in Redis: its calls run on the host of its first call (asking
        for another host is a SessionPinned error), and each starts in the directory and
        with the variables the previous ones left. `call_id` (default: a fresh one) lets
        another caller `cancel` or `detach` the call.

        The result's `stdout` and `stderr` are the output as the native policy shows it:
        the last 2000 lines / 50 KB of each stream, the rest left out (its counts in
        `stdout_truncation` / `stderr_truncation`, the whole in the call's spill files on
        its host: `result.spill`). `output="full"` reads the whole output back (through
        `read_output`) into the result, up to `max_output_bytes` of stdout and stderr
        together (OutputTooLarge past it).

        `check` (default True): a call that did not run at all (a bad cwd, a blocked or
        invalid command, a refused signature, a spawn failure, no worker to take it, a
        background job past its owner's cap) raises CallNotRun, which carries its kind,
        message and result; `check=False` returns that result instead (its `error` says
        why). A command that ran and failed is never an error: see `exit_code`,
        `signal`, `timed_out`.
        """
        return self.execute(run_request(command, options), check=check, output=output,
                                  max_output_bytes=max_output_bytes)

    def execute(
        self, request: RunRequest, *, check: bool = False, output: OutputMode = "tail",
        max_output_bytes: int = FULL_OUTPUT_MAX_BYTES,
    ) -> CallResult:
        """Run a `RunRequest` (what `run` builds) and wait for its result (`run` says what
        `check`, `output` and `max_output_bytes` do).

        The dialects' `Runner` method: a call that did not run is in its result (`error`),
        which a dialect renders as text for its model, unless `check` asks for CallNotRun
        (`run` asks by default).

        With a `session`, the call runs in the session's shell (`bashfleet.client.shells`): on its
        pinned host, in its cwd, with its variables; and what the call changed (a `cd`,
        an `export`, an `unset`) is kept for the session's next call, whoever makes it.
        An asyncio task awaiting it that is cancelled cancels the call too (withdrawn if
        queued, its processes killed if running), as `cancel` does.
        """
        if output not in ("tail", "full"):
            raise CallRejected(f"invalid output {output!r}: 'tail' or 'full'")
        if request.session is None:
            result = self._execute(request)
        else:
            result = self._execute_in_session(request, request.session)
        if check:
            raise_if_not_run(result)
        if output == "full":
            result = self._full_output(result, max_output_bytes)
        return result

    def _execute_in_session(self, request: RunRequest, session: str) -> CallResult:
        if not names.valid_id(session):
            raise CallRejected(f"invalid session id {session!r}")
        shell = self._call(self._shells.load, session)
        if shell.workspace is None and request.workspace is None:
            shell = self._session_workspace(session, shell, request)
        elif shell.workspace is None and request.workspace is not None:
            # An agent session's workspace (a dialect's): the shell lives in it from now,
            # whoever calls next (the CLI's --session included).
            shell = self._call(self._shells.commit, session, shells.ShellChange(
                host=request.host, workspace=request.workspace))
        result = self._execute(shells.fill_request(shell, request))
        if (shell.workspace is not None and request.workspace is None
                and shells.workspace_gone(result)):
            # Its workspace ended (unused past its TTL): a new one, said so in the result.
            # (A caller that named it, an agent session, is told it ended: it asks for
            # the session's workspace again, `workspace(session=)`, and says so itself.)
            self._refuse_another_owners(session, shell.workspace)
            shell = self._session_workspace(session, shell, request, replace=True)
            # The refused attempt ran nothing: its id (the caller's, to cancel it) is the
            # new attempt's.
            self._on_redis(records.forget_call, result.call_id)
            result = shells.with_new_workspace(
                self._execute(shells.fill_request(shell, request)))
        change = shells.change_of(result)
        if change:
            try:
                self._call(self._shells.commit, session, change)
            except redis_errors(FleetUnavailable) as exc:
                # The call ran: its result matters more than the session's next cwd.
                log.warning("session %s: could not save its shell: %s", session, exc)
        return result

    def _execute(self, request: RunRequest) -> CallResult:
        if request.workspace is not None and request.host is None:
            # A call in a workspace runs on its host: from its sealed view in Redis.
            view = self._workspace_view(request.workspace)
            request = request.model_copy(update={"host": view.host})
        call = build_call(request, self.owner)
        with self._slots:
            where = self._route(Placement.of(request))
            message = exec_message(self._identity, call, where.queue, self._replies.channel)
            slot = self._replies.expect(call.call_id)
            sent = False
            try:
                self._send_call(call.call_id, where, message,
                                      fresh_id=request.call_id is None)
                sent = True
                pending = Pending(call.call_id, where, sent_at=time.monotonic())
                return self._wait_call(pending, slot)
            except CANCELLATION_EXCEPTIONS:
                if sent and not self._closing.is_set():  # (`close` cancelled it then)
                    # The caller gave up: so does the fleet (withdraw, or kill), before
                    # the caller's task ends (an event loop's shutdown waits for that).
                    self._cancel_now(call.call_id)
                raise
            finally:
                self._replies.forget(call.call_id)

    def wait_sent(self, call_id: str, queue: str, host: str | None,
                        channel: str | None = None) -> CallResult:
        """The result of a call this owner sent already (on `queue`, for `host`; None: any
        host of the queue), waited for as `execute` waits for its own: its answer heard
        or read back, a lost worker or a withdrawn call found by the watch. The CLI's
        plain `run` sends its call itself and hands it over here when it outlasts its
        own short wait; nothing is sent again. A caller that gives up cancels it.
        `channel`: the reply channel the call names, listened to when this client has
        not listened yet (its answer is heard as it comes, not read back by the watch)."""
        where = Route(queue, host)
        if channel is not None:
            self._replies.adopt(channel)
        with self._slots:
            slot = self._replies.expect(call_id)
            try:
                return self._wait_call(Pending(call_id, where), slot)
            except CANCELLATION_EXCEPTIONS:
                if not self._closing.is_set():
                    self._cancel_now(call_id)
                raise
            finally:
                self._replies.forget(call_id)

    def _refuse_another_owners(self, session: str, workspace_id: str | None) -> None:
        """CallRejected when the session's workspace is there but another owner's (an MCP
        session's, say): its host answered as for an ended one, and making one of this
        owner's would take the session's shell from its owner."""
        if workspace_id is None:
            return
        sealed = (self._on_redis(records.workspace_views, [workspace_id]))[0]
        view = open_view(self._record_keys, workspace_id, sealed)
        if view is not None and view.owner != self.owner:
            raise CallRejected(
                f"session {session} lives in workspace {workspace_id} of another owner: a "
                "client of its owner (BASHFLEET_OWNER, Fleet(owner=)) runs its calls; or use "
                "another session")

    def _session_workspace(self, session: str, shell: shells.ShellState,
                                 request: RunRequest, *, replace: bool = False,
                                 ) -> shells.ShellState:
        """The session's workspace, made at its first call (on its pinned host, or where
        the call goes), at the directory of that call's cwd when the host allows it;
        laid onto the shell so that every caller of the session shares one (the first
        made wins: a concurrent one made meanwhile is deleted)."""
        host = shell.host or request.host
        workspace = self._new_workspace(
            host=host, label=None if host else request.label, ttl_s=names.SESSION_TTL_S,
            near=request.cwd or request.default_cwd, session=session,
            isolation=request.isolation, network=request.network)
        change = shells.ShellChange(host=workspace.host, workspace=workspace.id,
                                    force_workspace=replace)
        stored = self._call(self._shells.commit, session, change)
        if stored.workspace != workspace.id:
            workspace.delete()  # another caller's made first: the session's
        return stored

    def _route(self, placement: Placement) -> Route:
        """Where a call goes (`bashfleet.client._core.routing.route`), from the live hosts when no
        host is named."""
        if not placement.needs_live_hosts:
            return route(placement)
        live = self._on_redis(records.live_hosts)
        infos: list[HostInfo] = []
        if placement.label is not None and live:
            infos = self._on_redis(records.list_hosts, live, keys=self._record_keys)
        return route(placement, live, infos)

    def _send_call(self, call_id: str, where: Route, message: str, *,
                         fresh_id: bool) -> None:
        """Record the call and push its message: one round trip, one Lua script that also
        checks the named host is alive, unless a send found it alive lately
        (`HostsSeenAlive`), and that an id its caller chose is unused."""
        if self._closing.is_set():
            raise FleetUnavailable(CLOSED)
        target = where.target
        tag = self._identity.call_tag(call_id)
        now = time.monotonic()
        check = target is not None and not self._seen_alive.fresh(target, now)
        self._sending.add(call_id)
        try:
            sent = self._on_redis(records.send_call, call_id, where.queue, target,
                                        message, require_alive=check, owner_tag=tag,
                                        fresh_id=fresh_id)
            if sent == "down" and target is not None:
                self._seen_alive.lost(target)
                self._require_alive(target)  # raises HostUnavailable, naming live hosts
                sent = self._on_redis(records.send_call, call_id, where.queue, target,
                                            message, require_alive=False, owner_tag=tag,
                                            fresh_id=fresh_id)
            elif sent == "ok" and check and target is not None:
                self._seen_alive.saw(target, now)
        finally:
            self._sending.discard(call_id)
        if sent == "taken":
            raise CallRejected(f"call id {call_id} is already in use")

    def _wait_call(self, pending: Pending, slot: Slot[Answer]) -> CallResult:
        """The call's result: its answer, or what the watch found wrong with it."""
        if self._closing.is_set():  # closed while it was pushed: `close` did not see it
            self._cancel_now(pending.call_id)
            raise FleetUnavailable(CLOSED)
        self._pending[pending.call_id] = pending
        try:
            self._tasks.start_once(WATCH, self._watch_calls)
            answer = slot.wait()
        finally:
            self._pending.pop(pending.call_id, None)
        if isinstance(answer, str):
            return decode_result(self._keys, pending.call_id, answer)
        if isinstance(answer, CallResult):
            return answer
        raise answer if answer is not None else WorkerError(f"call {pending.call_id}: no answer")

    def _full_output(self, result: CallResult, max_bytes: int) -> CallResult:
        """The result with its whole output read back (`bashfleet.client._core.output`)."""
        texts = {}
        for read in full_reads(result, max_bytes):
            texts[read.stream] = self._read_whole(result.call_id, read)
        return with_full_output(result, texts) if texts else result

    def _read_whole(self, call_id: str, read: FullRead) -> str:
        parts = []
        offset = 0
        while True:
            chunk = self.read_output(call_id, offset=offset, limit=MAX_READ_LIMIT,
                                           stream=read.stream)
            parts.append(chunk.text)
            if chunk.eof or chunk.next_offset <= offset:
                return "".join(parts)
            offset = chunk.next_offset

    # ------------------------------------------------------------------ the watch

    def _watch_calls(self) -> None:
        """Watch every waiting call, one pass per WATCH_INTERVAL_S, until none waits."""
        outage = Outage(self._outage_grace_s)
        while not self._closing.wait(WATCH_INTERVAL_S):
            if self._tasks.retire(WATCH, lambda: not self._pending):
                return
            try:
                self._watch_pass()
                outage.ended()
            except redis_errors(FleetUnavailable) as exc:
                if outage.outlasted(time.monotonic()):
                    self._fail_all(exc if isinstance(exc, FleetUnavailable) else
                                   unreachable(self.url, exc))
            except Exception as exc:  # a bug of ours: tell the callers, never leave them
                log.exception("the watch of the calls in flight failed")
                self._fail_all(WorkerError(f"the client's watch failed: {exc!r}"))

    def _watch_pass(self) -> None:
        now = time.monotonic()
        waiting = [p for p in list(self._pending.values())
                   if due(p, now) and not self._replies.answered(p.call_id)]
        if not waiting:
            return
        hosts = {h for p in waiting for h in (p.target, p.host) if h}
        snapshot = self._on_redis(records.watch_snapshot, [p.call_id for p in waiting], hosts)
        queued = [p for p, record in zip(waiting, snapshot.records, strict=True)
                  if record.get("state") in (CallState.QUEUED, None)]
        live = self._live_for(queued)
        self._scan_queues(queued)
        now = time.monotonic()
        for host, token in snapshot.tokens.items():
            if token is None:
                self._seen_alive.lost(host)
        for pending, answer, record in zip(waiting, snapshot.answers, snapshot.records,
                                           strict=True):
            if answer is not None:
                self._replies.deliver(pending.call_id, answer)
                continue
            pending.host = record.get("host") or pending.host
            note_lock(pending, snapshot.tokens, now)
            found = verdict(pending, record, snapshot.tokens, live.get(pending.label or ""),
                            now)
            if found.problem is not None:
                self._conclude(pending, found)

    def _live_for(self, queued: list[Pending]) -> dict[str, list[str]]:
        """Live hosts that could take each untargeted queued call, by its label ("" for
        any host); read only when such a call waits."""
        labels = labels_to_read(queued)
        if not labels:
            return {}
        alive = self._on_redis(records.live_hosts)
        infos = self._on_redis(records.list_hosts, alive, keys=self._record_keys) \
            if labels - {""} and alive else []
        return {label: pool_members(label, infos) if label else alive for label in labels}

    def _scan_queues(self, queued: list[Pending]) -> None:
        """Note which queued calls' messages are gone from their queues (taken by a
        consumer that never claimed them); one read per queue."""
        now = time.monotonic()
        for queue in {p.route.queue for p in queued}:
            ids = self._on_redis(records.queued_ids, queue)
            for pending in queued:
                if pending.route.queue == queue:
                    note_queue(pending, ids, now)

    def _conclude(self, pending: Pending, found: Verdict) -> None:
        """End a call the watch found in trouble (withdrawing it first when it was queued);
        an answer stored meanwhile wins."""
        if found.withdraw:
            previous = self._on_redis(records.withdraw_call, pending.call_id)
            if previous != CallState.QUEUED:
                return  # a worker took it after all: watch it as a running call
        stored = self._on_redis(records.stored_reply, pending.call_id)
        if stored is not None:
            self._replies.deliver(pending.call_id, stored)
        elif found.problem is not None:
            self._replies.deliver(pending.call_id, found.problem)

    # -------------------------------------------- cancel, detach, where a call is

    def cancel(self, call_id: str) -> bool:
        """Stop a call: withdraw it if queued, kill its processes if running (its result
        then says `cancelled`). True when it was withdrawn or its processes were
        signalled; False when it had ended already. UnknownCall for an id no call has.
        """
        record = self._own_call(call_id)
        previous = self._on_redis(records.withdraw_call, call_id, CallState.CANCELLED)
        if previous == CallState.QUEUED:
            return True
        if previous != CallState.RUNNING:
            return False
        request = CancelRequest(call_id=call_id)
        try:
            return (self._control(record["host"], request, CancelResult)).cancelled
        except (UnknownCall, UnknownJob):  # the worker's word for it: told as no call
            raise unknown_call(call_id) from None

    def _own_call(self, call_id: str) -> Mapping[str, str]:
        """A call's record, when it is this client's to act on (`Identity.owns_call`);
        another owner's call is UnknownCall, as no call is, word for word."""
        record = call_record_of(
            call_id, self._on_redis(records.call_record, checked_call_id(call_id)))
        if not self._identity.owns_call(call_id, record):
            raise unknown_call(call_id)
        return record

    def detach(self, call_id: str) -> bool:
        """Leave a running foreground call running as a background job.

        True when the call was asked to: its own result (the one `run` returns) then
        names the job (`CallResult.job`). False when it was not running (yet: a call is
        detachable once it has run 50 ms) or had ended already. UnknownCall for an id
        no call has.
        """
        record = self._own_call(call_id)
        if record.get("state") != CallState.RUNNING:
            return False
        request = DetachRequest(call_id=call_id)
        try:
            return (self._control(record["host"], request, DetachResult)).detached
        except (UnknownCall, UnknownJob):  # the worker's word for it: told as no call
            raise unknown_call(call_id) from None

    def call_progress(self, call_id: str) -> CallProgress:
        """How far a call got: queued (on which host, when sent to one), running (where),
        ended; from its record (`bashfleet run`'s spinner says `queued on b`, then
        `running on b`): words to show, not verified claims."""
        if not names.valid_id(call_id):
            return CallProgress(None, None)
        record = self._on_redis(records.call_record, call_id)
        return CallProgress(record.get("state") or None, record.get("host") or None)

    def call_host(self, call_id: str) -> str | None:
        """The host a call runs (or ran) on; None while it waits in a queue for any host,
        or when the call is unknown (`bashfleet run`'s spinner names it once known).
        Read from the call record's host field as control calls route by it: a name to
        show, not a verified claim."""
        if not names.valid_id(call_id):
            return None
        return (self._on_redis(records.call_record, call_id)).get("host") or None

    def shared_queues(self) -> dict[str, int]:
        """Calls waiting in the queues no single host owns, by queue name.

        `bashfleet.any.exec` (calls with no host) and `bashfleet.pool.<label>.exec` for
        each label of a known host: any live host (of the label) takes them, so
        `hosts()` counts them for none.
        """
        infos = self._on_redis(records.list_hosts, keys=self._record_keys)
        labels = sorted({label for info in infos for label in info.labels})
        queues = [names.ANY_EXEC_QUEUE, *(names.pool_queue(label) for label in labels)]
        return self._on_redis(records.queue_depths, queues)
