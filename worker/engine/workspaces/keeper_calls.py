"""Starting a process in a workspace through its keeper, over connections kept
open per workspace and given back after each call.
"""

from __future__ import annotations

import threading

from bashfleet.worker.engine import (
    sandbox,
)
from bashfleet.worker.engine.isolate import proto
from bashfleet.worker.engine.isolate.launcher import (
    KeeperConnection,
    KeeperLostError,
    KeeperProcess,
    SandboxError,
)
from bashfleet.worker.wire.models import (
    WorkspaceRecord,
)

# ---------------------------------------------------------------- calls in a workspace


class _Connections:
    """Idle connections to keepers, per workspace, in this process."""

    def __init__(self) -> None:
        self.idle: dict[str, list[KeeperConnection]] = {}
        self.lock = threading.Lock()

    def take(self, record: WorkspaceRecord) -> KeeperConnection:
        with self.lock:
            idle = self.idle.get(record.id)
            if idle:
                return idle.pop()
        if record.socket_path is None:
            raise KeeperLostError(2, f"workspace {record.id} has no sandbox")
        return KeeperConnection.connect(record.socket_path)

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


class WorkspaceProcess(KeeperProcess):
    """A call in a workspace; its connection goes back to the pool when it ended."""

    def __init__(self, record: WorkspaceRecord, conn: KeeperConnection, started: object) -> None:
        super().__init__(conn, started)  # type: ignore[arg-type]
        self.record = record

    def ended(self) -> None:
        if self.conn.clean is not None:
            recycled[self.record.id] = self.conn.clean
        connections.give_back(self.record.id, self.conn)


#: Workspace id -> whether its throwaway call left it clean (its keeper said so in the
#: call's status); read once by `Throwaways.end`.
recycled: dict[str, bool] = {}


def start(record: WorkspaceRecord, request: proto.SpawnRequest, fds: list[int],
          timeout: float = sandbox.ANSWER_TIMEOUT_S) -> WorkspaceProcess:
    """Start a call in the workspace; SandboxError when it could not (KeeperLostError:
    the workspace is gone)."""
    for attempt in range(2):
        conn = connections.take(record)
        try:
            started = conn.start(request, fds, timeout)
        except KeeperLostError:
            conn.close()
            if attempt:
                raise
            continue  # an idle connection whose keeper restarted: a fresh one
        except SandboxError:
            connections.give_back(record.id, conn)
            raise
        return WorkspaceProcess(record, conn, started)
    raise AssertionError("unreachable")  # pragma: no cover
