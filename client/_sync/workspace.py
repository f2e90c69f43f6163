# Generated from client/_async/workspace.py by scripts/unasync.py:
# edit that file and run the script.
"""A workspace as a client holds it: `Fleet.workspace(...)` makes one.

    with fleet.workspace(label="linux", ttl_s=3600) as ws:
        ws.write_file("src/main.py", b"print('hi')")
        result = ws.run("python3 src/main.py")
        job = (ws.run("python3 -m http.server 8000", mode="background")).job
        ws.run("curl -s localhost:8000")        # the server it left runs on
        ws.download("src", "./back")

A directory on one host plus the namespaces its calls share: its calls and background
jobs see and signal each other, and read their own output files; other workspaces, the
worker and the fleet are invisible to them. It lives until `delete` (or leaving the
`with`), or until its TTL passes unused (a call, a control call, a file operation
or `renew` uses it). Files are read and written in it as its calls would (as its run
user, in its view): a path is relative to its directory, or absolute as its calls see it.

Written for asyncio; `client/_sync/workspace.py` (`client.Workspace`) is generated from
it by `scripts/unasync.py`.
"""

from __future__ import annotations

import base64
import os
import tempfile
from collections.abc import Iterable, Mapping
from typing import IO, TYPE_CHECKING, Any, Literal, TypeVar

from bashfleet.client._core.messages import control_request
from bashfleet.client._core.workspaces import (
    FILE_CHUNK,
    chunks,
    file_pieces,
    tar_pieces,
    unpack_file,
)
from bashfleet.client._sync import transfers
from bashfleet.client.errors import CallRejected, FleetUnavailable, UnknownJob, UnknownWorkspace
from bashfleet.worker.fleet.connect import connection_errors
from bashfleet.worker.wire.control import (
    CheckRequest,
    FileChunk,
    FileReadRequest,
    FileWriteRequest,
    FileWritten,
    KillRequest,
    ReadOutputRequest,
    SnapshotCreateRequest,
    TransferOutcome,
    TransferRequest,
    WorkspaceDeleted,
    WorkspaceDeleteRequest,
    WorkspaceForkRequest,
    WorkspaceForks,
    WorkspaceNetworkRequest,
    WorkspaceRenewRequest,
    WorkspaceRestoreRequest,
)
from bashfleet.worker.wire.models import (
    CallResult,
    CheckResult,
    JobView,
    Model,
    OutputChunk,
    RestoreResult,
    Snapshot,
    Truncation,
    WorkspaceView,
)
from bashfleet.worker.wire.network import NetworkPolicy
from bashfleet.worker.wire.transfer import new_transfer_id

if TYPE_CHECKING:
    from bashfleet.client._sync.fleet import Fleet

R = TypeVar("R", bound=Model)


class Workspace:
    """A workspace on one host (see the module's docstring)."""

    def __init__(self, fleet: Fleet, view: WorkspaceView) -> None:
        self._fleet = fleet
        self.view = view
        """What its host said of it when it was made (or last renewed)."""

    @property
    def id(self) -> str:
        """Its id: `w` and 15 hex digits."""
        return self.view.id

    @property
    def host(self) -> str:
        """The host it lives on (its calls run there)."""
        return self.view.host

    @property
    def path(self) -> str:
        """Its directory: the same path on its host and in its calls' view, where a call
        without a cwd starts."""
        return self.view.path

    def __repr__(self) -> str:
        return f"<Workspace {self.id} on {self.host} at {self.path}>"

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.delete()

    # ----------------------------------------------------------------------- calls

    def run(self, command: str, **options: Any) -> CallResult:
        """Run `command` in this workspace (`Fleet.run`'s options: mode, timeout,
        cwd, env, stdin...; its host is this workspace's)."""
        if options.get("host") not in (None, self.host) or options.get("label") is not None:
            raise CallRejected(f"workspace {self.id} is on host {self.host}: a call in it "
                               "runs there")
        options.update(host=self.host, workspace=self.id)
        return self._fleet.run(command, **options)

    def check(self, job_id: str, *, grep: str | None = None, offset: int | None = None,
                    truncation: Truncation | None = None) -> CheckResult:
        """A job of this workspace: its state and output since `offset` (another
        workspace's job is unknown here: UnknownJob)."""
        return self._fleet.check_job(control_request(
            CheckRequest, id=job_id, grep=grep, offset=offset, truncation=truncation,
            workspace=self.id))

    def kill(self, job_id: str, *, signal: Literal[9, 15] = 15) -> CheckResult:
        """End a job of this workspace (group SIGTERM, grace, SIGKILL; 9: SIGKILL at once)."""
        return self._fleet.kill_job(control_request(
            KillRequest, id=job_id, signal=signal, workspace=self.id))

    def jobs(self) -> list[JobView]:
        """This workspace's background jobs, oldest first."""
        return [view for view in self._fleet.jobs(host=self.host)
                if view.workspace == self.id]

    def read_output(self, id: str, *, offset: int = 0, limit: int = 65536,
                          stream: Literal["stdout", "stderr"] = "stdout") -> OutputChunk:
        """A slice of the output of a job or a call of this workspace."""
        return self._fleet.read_chunk(control_request(
            ReadOutputRequest, id=id, offset=offset, limit=limit, stream=stream,
            workspace=self.id))

    # ----------------------------------------------------------------------- files

    def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """A file's bytes, read in the workspace as its calls would (large files in
        chunks of FILE_CHUNK). `max_bytes`: read no more than its first bytes (a caller
        with a size cap reads `cap + 1` and refuses a file that gave more)."""
        if max_bytes is not None and max_bytes < 1:
            raise CallRejected(f"max_bytes must be at least 1, not {max_bytes}")
        data = bytearray()
        while True:
            left = FILE_CHUNK if max_bytes is None else min(FILE_CHUNK, max_bytes - len(data))
            chunk = self._ask(control_request(
                FileReadRequest, workspace=self.id, path=path, offset=len(data),
                limit=left), FileChunk)
            data += base64.b64decode(chunk.data_b64)
            if chunk.eof or not chunk.data_b64 or len(data) == max_bytes:
                return bytes(data)

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> int:
        """Write a file in the workspace as its calls would (owned by its run user; its
        parents made); its size after. `str` data is written as UTF-8."""
        raw = data.encode() if isinstance(data, str) else data
        size = 0
        pieces = list(chunks(raw))
        for index, (offset, piece) in enumerate(pieces):
            last = index == len(pieces) - 1
            written = self._ask(control_request(
                FileWriteRequest, workspace=self.id, path=path, append=offset > 0,
                data_b64=base64.b64encode(piece).decode("ascii"),
                mode=mode if last else None), FileWritten)
            size = written.size
        return size

    def upload(self, local: str | os.PathLike[str], dst: str = ".") -> None:
        """Copy a local directory's contents into `dst` of the workspace (a tar stream,
        unpacked there by tar as its run user while it arrives)."""
        self._send("tree", dst, tar_pieces(local))

    def download(self, src: str, local: str | os.PathLike[str]) -> None:
        """Copy the workspace's directory `src` into a local directory (made if missing):
        a tar stream from tar in the workspace, kept in a local temporary file until it
        all arrived, then every member checked before anything is written
        (`bashfleet.client._core.archives`)."""
        with tempfile.TemporaryFile() as spool:
            self._receive("tree", src, spool)
            spool.seek(0)
            unpack_file(spool, local)

    def upload_file(self, local: str | os.PathLike[str], path: str, *,
                          mode: int | None = None) -> int:
        """Copy a local file to `path` in the workspace (its parents made; `mode`: its
        permissions), streamed; its size."""
        return (self._send("file", path, file_pieces(local), mode=mode)).size

    def download_file(self, path: str, local: str | os.PathLike[str]) -> int:
        """Copy the workspace's file `path` to the local file `local`, streamed (written
        beside it and renamed into place once whole); its size."""
        target = os.fspath(local)
        spool = tempfile.NamedTemporaryFile(  # noqa: SIM115 - renamed or removed below
            dir=os.path.dirname(os.path.abspath(target)), prefix=".bashfleet-", delete=False)
        try:
            with spool:
                result = self._receive("file", path, spool)
            os.replace(spool.name, target)
        except BaseException:
            os.unlink(spool.name)
            raise
        return result.size

    def _send(self, kind: Literal["file", "tree"], path: str, pieces: Iterable[bytes],
                    *, mode: int | None = None) -> TransferOutcome:
        request = control_request(TransferRequest, workspace=self.id, direction="upload",
                                  kind=kind, path=path, mode=mode, transfer=new_transfer_id())
        try:
            return transfers.send(self._fleet, self.host, request, pieces)
        except UnknownJob as exc:
            raise self._gone(exc) from None
        except connection_errors() as exc:
            raise FleetUnavailable(f"Redis at {self._fleet.url} failed: {exc}") from None

    def _receive(self, kind: Literal["file", "tree"], path: str, sink: IO[bytes]
                       ) -> TransferOutcome:
        request = control_request(TransferRequest, workspace=self.id, direction="download",
                                  kind=kind, path=path, transfer=new_transfer_id())
        try:
            return transfers.receive(self._fleet, self.host, request, sink)
        except UnknownJob as exc:
            raise self._gone(exc) from None
        except connection_errors() as exc:
            raise FleetUnavailable(f"Redis at {self._fleet.url} failed: {exc}") from None

    def _gone(self, exc: UnknownJob) -> UnknownWorkspace:
        """What a request about this workspace raises when its host no longer has it."""
        return UnknownWorkspace(f"workspace {self.id}: {exc}")

    def _ask(self, request: Any, response: type[R]) -> R:
        """A control call about this workspace; UnknownWorkspace when its host no longer
        has it (deleted, or expired unused)."""
        try:
            return self._fleet._control(self.host, request, response)
        except UnknownJob as exc:
            raise UnknownWorkspace(f"workspace {self.id}: {exc}") from None

    # ---------------------------------------------------------------------- lease

    def renew(self) -> WorkspaceView:
        """Mark it used now (its TTL starts again): what a long-lived holder (an MCP
        server, a framework's sandbox) calls while it lives; its view."""
        self.view = self._ask(control_request(
            WorkspaceRenewRequest, id=self.id), WorkspaceView)
        return self.view

    def set_network(self, policy: NetworkPolicy | str | bool) -> WorkspaceView:
        """Put another network policy in force while it lives: `none`, `egress`,
        `allow=pypi.org,*.pythonhosted.org,10.1.0.0/16` (a `NetworkPolicy`, or its
        spelling); its processes keep running, connections the new policy refuses are
        cut. `host` only for a workspace made so. Its view."""
        self.view = self._ask(control_request(
            WorkspaceNetworkRequest, id=self.id, network=policy), WorkspaceView)
        return self.view

    def info(self) -> WorkspaceView:
        """Its view, with its disk bytes and processes counted (and it is renewed)."""
        self.view = self._ask(control_request(
            WorkspaceRenewRequest, id=self.id, count=True), WorkspaceView)
        return self.view

    # ------------------------------------------------------------------ snapshots

    def snapshot(self, *, ttl_s: float | None = None,
                       tags: Mapping[str, str] | None = None) -> Snapshot:
        """Freeze its files now: its own layers (everything its calls changed of its `/`,
        its directory, /tmp, HOME), copied while its processes are paused for the
        instant it takes (they run on after, with their streams, jobs and sessions).
        `ttl_s`: seconds it is kept (the host's default, a day); `tags` for listings.
        Make workspaces from it with `fleet.workspace(snapshot=...)` (on any host) or put
        this one back with `restore`. Files only: no process is part of it.
        LimitReached past the owner's cap of snapshots (count or bytes)."""
        return self._ask(control_request(
            SnapshotCreateRequest, workspace=self.id, ttl_s=ttl_s, tags=dict(tags or {})),
            Snapshot)

    def fork(self, n: int = 1, *, ttl_s: float | None = None,
                   tags: Mapping[str, str] | None = None, host: str | None = None,
                   label: str | None = None) -> list[Workspace]:
        """`n` new workspaces, each with the files this one has now (a snapshot is taken
        for them) in the same paths, and no process running: its own processes, streams
        and jobs go on untouched. On its host (one request: the snapshot goes with the
        last of them), unless `host` or `label` name others: then the snapshot (tagged
        `made_by=fork`, kept its TTL) travels there through the fleet's registry.
        `ttl_s` (default: this one's) and `tags` (added to this one's) for each. All or
        none: LimitReached past the owner's cap of workspaces, and none is left."""
        if (host is None or host == self.host) and label is None:
            made = self._ask(control_request(
                WorkspaceForkRequest, workspace=self.id, n=n, ttl_s=ttl_s,
                tags=dict(tags or {})), WorkspaceForks)
            return [Workspace(self._fleet, view) for view in made.workspaces]
        snap = self.snapshot(tags={**(tags or {}), "made_by": "fork"})
        forks: list[Workspace] = []
        try:
            for _ in range(n):
                forks.append(self._fleet.workspace(
                    snapshot=snap, host=host, label=label, ttl_s=ttl_s or self.view.ttl_s,
                    tags={**self.view.tags, **(tags or {})}))
        except BaseException:
            for fork in forks:
                fork.delete()
            raise
        return forks

    def restore(self, snapshot: Snapshot | str) -> RestoreResult:
        """Put its files back to `snapshot` (one of this workspace, or of the one it was
        made from): every process running in it is ended (`ended` says how many), its
        id, path, lease and sessions stay. UnknownSnapshot for a snapshot that is not the
        owner's; CallRejected for one of another workspace's directory or base."""
        record = self._fleet._snapshot_record(snapshot)
        if record.host != self.host:
            self._fleet._move_snapshot(record, self.host)
        done = self._ask(control_request(
            WorkspaceRestoreRequest, workspace=self.id, snapshot=record.id), RestoreResult)
        self.renew()
        return done

    def delete(self) -> bool:
        """End it: every process in it killed, its jobs' ends recorded, its files (a
        fresh directory too), /tmp and HOME removed. False when it was gone already."""
        try:
            done = self._ask(control_request(
                WorkspaceDeleteRequest, id=self.id), WorkspaceDeleted)
        except UnknownWorkspace:
            return False
        return done.deleted
