"""Starting a process in a workspace through its keeper, over connections kept
open per workspace and given back after each call.
"""

from __future__ import annotations

import errno
import os
import threading

from bashfleet.worker.engine import (
    procs,
    sandbox,
)
from bashfleet.worker.engine.isolate import proto
from bashfleet.worker.engine.isolate.launcher import (
    KeeperAsleepError,
    KeeperConnection,
    KeeperLostError,
    KeeperProcess,
    SandboxError,
    Started,
)
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import (
    WorkspaceRecord,
)

# ---------------------------------------------------------------- calls in a workspace


class _Connections:
    """Idle connections to keepers, per workspace, in this process."""

    def __init__(self) -> None:
        self.idle: dict[str, list[KeeperConnection]] = {}
        self.lock = threading.Lock()

    def take(self, record: WorkspaceRecord, settings: Settings | None = None
             ) -> KeeperConnection:
        """An idle connection to the workspace's keeper, else a fresh one (`awake`)."""
        with self.lock:
            idle = self.idle.get(record.id)
            if idle:
                return idle.pop()
        return awake(record, settings)

    def give_back(self, ws_id: str, conn: KeeperConnection) -> None:
        with self.lock:
            idle = self.idle.setdefault(ws_id, [])
            if conn.reusable and len(idle) < 8:
                idle.append(conn)
                return
        conn.close()

    def drop(self, ws_id: str) -> None:
        with self.lock:
            idle = self.idle.pop(ws_id, [])
        for conn in idle:
            conn.close()


connections = _Connections()


def awake(record: WorkspaceRecord, settings: Settings | None, *,
          hold: bool = False) -> KeeperConnection:
    """A fresh connection to the workspace's keeper, which answered a ping: a sleeping
    workspace is woken first (its holder answers the ping `Z`; this process's zygote
    forks a keeper into it). `hold`: the keeper stays awake while it is open."""
    if record.socket_path is None:
        raise KeeperLostError(errno.ENOENT, f"workspace {record.id} has no sandbox")
    for _ in range(WAKE_TRIES):
        conn = KeeperConnection.connect(record.socket_path)
        try:
            conn.ping(sandbox.ANSWER_TIMEOUT_S, hold=hold)
        except KeeperAsleepError as asleep:
            try:
                _wake(record, settings, conn, asleep.fds)
            finally:
                proto.close_all(asleep.fds)
                conn.close()
            continue
        except KeeperLostError:
            conn.close()  # it went to sleep as we connected: its holder answers next
            continue
        except BaseException:
            conn.close()
            raise
        return conn
    raise KeeperLostError(errno.EAGAIN, f"workspace {record.id}'s keeper did not wake")


#: Wakes tried for one connection: another worker's wake may be under way (the holder
#: answers one connection at a time), or the keeper slept again at once.
WAKE_TRIES = 4


def _wake(record: WorkspaceRecord, settings: Settings | None, conn: KeeperConnection,
          given: list[int]) -> None:
    if settings is None or record.keeper_pid is None:
        raise SandboxError(errno.EAGAIN, f"workspace {record.id} sleeps and cannot be woken "
                           "here")
    try:
        holder = os.pidfd_open(record.keeper_pid)
    except OSError as exc:
        raise KeeperLostError(errno.ESRCH, f"workspace {record.id}'s keeper is gone") from exc
    try:
        if record.keeper_start is not None \
                and not procs.is_same_process(record.keeper_pid, record.keeper_start):
            raise KeeperLostError(errno.ESRCH, f"workspace {record.id}'s keeper is gone")
        sandbox.zygote.wake(settings, holder, conn.fileno(), given, record.cgroup)
    finally:
        os.close(holder)


class WorkspaceProcess(KeeperProcess):
    """A call in a workspace; its connection goes back to the pool when it ended."""

    def __init__(self, record: WorkspaceRecord, conn: KeeperConnection, started: object) -> None:
        super().__init__(conn, started)  # type: ignore[arg-type]
        self.record = record

    def ended(self) -> None:
        # Its keeper's word on the workspace, or the connection it follows on: read by
        # its put-away, once the call's answer went out (`take_clean`), not now.
        pending = self.conn.clean_pending
        word = self.conn if pending else self.conn.clean
        if word is not None:
            with _clean_lock:
                recycled[self.record.id] = word
        if not pending:
            connections.give_back(self.record.id, self.conn)


#: Workspace id -> whether its throwaway call left it clean (its keeper's word), or the
#: connection that word comes on; taken once by `Throwaways.end` (`take_clean`).
recycled: dict[str, bool | KeeperConnection] = {}
_clean_lock = threading.Lock()


def take_clean(ws_id: str) -> bool | None:
    """Whether the throwaway call that ended in workspace `ws_id` left it clean, as its
    keeper says (read now if it was not yet: its connection then goes back to the pool);
    None when no call of it was asked that."""
    with _clean_lock:
        found = recycled.pop(ws_id, None)
    if not isinstance(found, KeeperConnection):
        return found
    try:
        return found.read_clean()
    finally:
        connections.give_back(ws_id, found)


def start(record: WorkspaceRecord, request: proto.SpawnRequest, fds: list[int],
          timeout: float = sandbox.ANSWER_TIMEOUT_S, *,
          settings: Settings | None = None) -> WorkspaceProcess:
    """Start a call in the workspace (`start_on`); its connection goes back to the pool
    when it ended."""
    conn, started = start_on(record, request, fds, timeout, settings=settings)
    return WorkspaceProcess(record, conn, started)


#: Tries of a start: idle connections given back meanwhile may be a slept keeper's too.
START_TRIES = 3


def start_on(record: WorkspaceRecord, request: proto.SpawnRequest, fds: list[int],
             timeout: float = sandbox.ANSWER_TIMEOUT_S, *,
             settings: Settings | None = None) -> tuple[KeeperConnection, Started]:
    """Start a call or job in the workspace (woken when it sleeps: `settings` give this
    process's zygote): the connection it was started on, and how it started.
    SandboxError when it could not (KeeperLostError: the workspace is gone). A pooled
    connection whose keeper went to sleep is closed before the keeper read the request
    (it looks for an unread message before it sleeps): it runs on a fresh one."""
    for attempt in range(START_TRIES):
        conn = connections.take(record, settings)
        try:
            started = conn.start(request, fds, timeout)
        except KeeperLostError:
            conn.close()
            if attempt == START_TRIES - 1:
                raise
            # An idle connection whose keeper restarted or slept: so are the other idle
            # ones it served; a fresh one.
            connections.drop(record.id)
            continue
        except SandboxError:
            connections.give_back(record.id, conn)
            raise
        return conn, started
    raise AssertionError("unreachable")  # pragma: no cover
