"""Workspaces through the fleet: made on a host, used by calls, files and jobs scoped to
them, leases, caps, sessions that live in one; with real workers, as `Fleet.workspace`
and `bashfleet workspace` users drive them."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bashfleet.client import Fleet, LimitReached, UnknownJob, UnknownWorkspace
from bashfleet.client.errors import WorkspaceFileError
from bashfleet.client.redis_server import RedisServer

from .conftest import WorkerFactory, WorkerProcess


@pytest.fixture(name="host", scope="module")
def _host_fixture(session_workers: WorkerFactory) -> Iterator[WorkerProcess]:
    """One host for this module's workspaces (a cap of 3 per owner, to reach it)."""
    yield from session_workers.module_host("wsp", env={"BASHFLEET_LIMIT_WORKSPACES": "3"})


def owner() -> str:
    return f"tenant-{uuid.uuid4().hex[:8]}"


def test_a_workspace_runs_calls_keeps_files_and_processes(host: WorkerProcess,
                                                          redis_server: RedisServer) -> None:
    with Fleet(redis_server.url, owner=owner()) as fleet, fleet.workspace(host="wsp") as ws:
        assert (ws.host, ws.path) == ("wsp", ws.view.path)
        first = ws.run("pwd; echo one > notes.txt; sleep 300 & echo $!")
        lines = first.stdout.split()
        assert lines[0] == ws.path
        second = ws.run(f"cat notes.txt; ps -o args= -p {lines[1]}")
        assert second.stdout == "one\nsleep 300\n"
        assert ws.read_file("notes.txt") == b"one\n"
        assert ws.write_file("data/big.bin", b"x" * (5 * 1024 * 1024 + 7), mode=0o600) \
            == 5 * 1024 * 1024 + 7
        assert ws.run("stat -c '%s %a' data/big.bin").stdout == f"{5 * 1024 * 1024 + 7} 600\n"
        assert len(ws.read_file(f"{ws.path}/data/big.bin")) == 5 * 1024 * 1024 + 7


def test_file_errors_are_the_oserrors_a_local_file_raises(
    host: WorkerProcess, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A framework adapter (inspect's `read_file`, SWE-ReX's) catches FileNotFoundError,
    IsADirectoryError, PermissionError as for a local file; the workspace is still there."""
    with Fleet(redis_server.url, owner=owner()) as fleet, fleet.workspace(host="wsp") as ws:
        ws.run("mkdir dir; echo x > file; echo s > secret; chmod 000 secret")
        info = next(h for h in fleet.hosts() if h.host == "wsp")
        multi = info.sandbox is not None and info.sandbox.tenancy == "multi"
        cases: list[tuple[type[OSError], Callable[[], object]]] = [
            (FileNotFoundError, lambda: ws.read_file("missing")),
            (IsADirectoryError, lambda: ws.read_file("dir")),
            (IsADirectoryError, lambda: ws.write_file("dir", b"x")),
            # Its keeper (pid 1) is the host's root, outside its user namespace.
            (PermissionError, lambda: ws.read_file("/proc/1/environ")),
            (NotADirectoryError, lambda: ws.write_file("file/inside", b"x")),
            (FileNotFoundError, lambda: ws.download("missing", tmp_path / "m")),
            (NotADirectoryError, lambda: ws.download("file", tmp_path / "f")),
        ]
        # The host's files are the host's in every workspace: its mode bits decide.
        cases += [(PermissionError, lambda: ws.read_file("/etc/shadow")),
                  (PermissionError, lambda: ws.write_file("/usr/new", b"x"))]
        if multi:
            # Root inside its own user namespace: its own files are all its to read.
            assert ws.read_file("secret") == b"s\n"
        else:
            cases += [(PermissionError, lambda: ws.read_file("secret"))]
        for raised, act in cases:
            with pytest.raises(raised) as caught:
                act()
            assert isinstance(caught.value, WorkspaceFileError)
            assert caught.value.errno is not None
        assert ws.read_file("file") == b"x\n"


def test_upload_and_download_a_directory(host: WorkerProcess, redis_server: RedisServer,
                                         tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("print('hi')\n")
    (source / "README").write_text("readme\n")
    with Fleet(redis_server.url, owner=owner()) as fleet, fleet.workspace(host="wsp") as ws:
        ws.upload(source, "app")
        assert ws.run("python3 app/pkg/mod.py; cat app/README").stdout == "hi\nreadme\n"
        ws.run("echo made > app/pkg/out.txt")
        ws.download("app", tmp_path / "back")
    assert (tmp_path / "back" / "pkg" / "out.txt").read_text() == "made\n"
    assert (tmp_path / "back" / "README").read_text() == "readme\n"


def test_jobs_are_scoped_to_their_workspace(host: WorkerProcess,
                                            redis_server: RedisServer) -> None:
    with Fleet(redis_server.url, owner=owner()) as fleet, \
            fleet.workspace(host="wsp") as one, fleet.workspace(host="wsp") as two:
        job = one.run("echo started; sleep 300", mode="background").job
        assert job is not None and job.workspace == one.id
        assert [view.id for view in one.jobs()] == [job.id]
        assert two.jobs() == []
        with pytest.raises(UnknownJob):
            two.check(job.id)
        with pytest.raises(UnknownJob):
            two.kill(job.id)
        assert one.run(f"cat {job.output_path}").stdout.startswith("started")
        ended = one.kill(job.id)
        assert not ended.running


def test_a_deleted_workspace_is_gone_for_every_client(host: WorkerProcess,
                                                      redis_server: RedisServer) -> None:
    tenant = owner()
    with Fleet(redis_server.url, owner=tenant) as fleet, \
            Fleet(redis_server.url, owner=tenant) as other:
        ws = fleet.workspace(host="wsp", tags={"agent": "a1"})
        assert [view.id for view in other.workspaces()] == [ws.id]
        again = other.open_workspace(ws.id)
        assert again.run("echo shared").stdout == "shared\n"
        assert ws.delete() is True
        assert ws.delete() is False
        assert other.workspaces() == []
        with pytest.raises(UnknownWorkspace):
            other.open_workspace(ws.id)
        with pytest.raises(UnknownWorkspace):
            again.read_file("x")


def test_another_owners_workspace_is_unknown(host: WorkerProcess,
                                             redis_server: RedisServer) -> None:
    with Fleet(redis_server.url, owner=owner()) as fleet, \
            Fleet(redis_server.url, owner=owner()) as stranger, fleet.workspace(host="wsp") as ws:
        with pytest.raises(UnknownWorkspace):
            stranger.open_workspace(ws.id)
        refused = stranger.run("echo in", host="wsp", workspace=ws.id, check=False)
        assert refused.error is not None and refused.error.kind == "not_found"
        assert stranger.workspaces() == []


def test_an_owners_workspaces_are_capped_across_the_fleet(host: WorkerProcess,
                                                          redis_server: RedisServer) -> None:
    tenant = owner()
    with Fleet(redis_server.url, owner=tenant) as fleet:
        made = [fleet.workspace(host="wsp") for _ in range(3)]
        try:
            with pytest.raises(LimitReached, match="BASHFLEET_LIMIT_WORKSPACES=3"):
                fleet.workspace(host="wsp")
            made.pop().delete()
            made.append(fleet.workspace(host="wsp"))  # room again
        finally:
            for ws in made:
                ws.delete()


def test_a_session_lives_in_one_workspace_and_starts_where_it_was_opened(
    host: WorkerProcess, redis_server: RedisServer,
) -> None:
    session = f"s-{uuid.uuid4().hex[:10]}"
    with Fleet(redis_server.url, owner=owner()) as fleet:
        first = fleet.run("mkdir -p sub; cd sub; (sleep 300 &); echo $$ > /tmp/first",
                          session=session, host="wsp")
        assert first.error is None
        second = fleet.run("pwd; cat /tmp/first; pgrep -x sleep | wc -l", session=session)
        where, _, count = second.stdout.split()
        assert where.endswith("/sub") and count == "1"
        views = fleet.workspaces()
        assert len(views) == 1 and views[0].session == session
        fleet.open_workspace(views[0].id).delete()
        # Its workspace ended: the next call gets a new one, and is told.
        third = fleet.run("ls /tmp/first 2>&1; pgrep -x sleep | wc -l", session=session)
        assert "workspace had ended" in third.stderr
        assert "No such file" in third.stdout and third.stdout.rstrip().endswith("0")
        for view in fleet.workspaces():
            fleet.open_workspace(view.id).delete()
