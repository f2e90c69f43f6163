"""File transfers through a real fleet: files and directories streamed in and out of a
workspace as chunks on Redis (`bashfleet.worker.fleet.transfers`), exact bytes, with the errors a
local file would raise, never through a file the workspace's commands could replace."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bashfleet.client import Fleet
from bashfleet.client.errors import WorkspaceFileError
from bashfleet.client.redis_server import RedisServer

from .conftest import WorkerFactory, WorkerProcess


@pytest.fixture(name="host", scope="module")
def _host_fixture(session_workers: WorkerFactory) -> Iterator[WorkerProcess]:
    yield from session_workers.module_host("xfer")


def _fleet(redis_server: RedisServer) -> Fleet:
    return Fleet(redis_server.url, owner=f"tenant-{uuid.uuid4().hex[:8]}")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_large_file_goes_up_and_down_exactly(host: WorkerProcess, redis_server: RedisServer,
                                               tmp_path: Path) -> None:
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(40 * 1024 * 1024 + 12345))
    with _fleet(redis_server) as fleet, fleet.workspace(host="xfer") as ws:
        tmp_before = ws.run("ls -A /tmp").stdout
        assert ws.upload_file(source, "data/big.bin", mode=0o640) == source.stat().st_size
        check = ws.run("stat -c '%s %a' data/big.bin; sha256sum < data/big.bin")
        size, mode, digest = check.stdout.split()[:3]
        assert (int(size), mode, digest) == (source.stat().st_size, "640", _digest(source))
        assert ws.download_file("data/big.bin", tmp_path / "back.bin") == source.stat().st_size
        assert _digest(tmp_path / "back.bin") == _digest(source)
        # Nothing rested in the workspace's /tmp on the way.
        assert ws.run("ls -A /tmp").stdout == tmp_before
        # Empty files travel too.
        (tmp_path / "empty").write_bytes(b"")
        assert ws.upload_file(tmp_path / "empty", "empty") == 0
        assert ws.download_file("empty", tmp_path / "empty.back") == 0
        assert (tmp_path / "empty.back").read_bytes() == b""


def test_file_transfers_raise_what_a_local_file_would(
    host: WorkerProcess, redis_server: RedisServer, tmp_path: Path,
) -> None:
    (tmp_path / "one").write_bytes(b"1")
    with _fleet(redis_server) as fleet, fleet.workspace(host="xfer") as ws:
        ws.run("mkdir dir; echo x > file")
        cases: list[tuple[type[OSError], object]] = [
            (FileNotFoundError, lambda: ws.download_file("missing", tmp_path / "m")),
            (IsADirectoryError, lambda: ws.download_file("dir", tmp_path / "d")),
            (NotADirectoryError, lambda: ws.upload_file(tmp_path / "one", "file/inside")),
            (IsADirectoryError, lambda: ws.upload_file(tmp_path / "one", "dir")),
        ]
        for raised, act in cases:
            with pytest.raises(raised) as caught:
                act()  # type: ignore[operator]
            assert isinstance(caught.value, WorkspaceFileError)
        # A failed download leaves nothing behind locally.
        assert sorted(p.name for p in tmp_path.iterdir()) == ["one"]
        assert ws.read_file("file") == b"x\n"


def test_a_directory_goes_up_and_down(host: WorkerProcess, redis_server: RedisServer,
                                      tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "pkg" / "deep").mkdir(parents=True)
    blobs = {f"pkg/deep/f{n}.bin": os.urandom(n * 700_001) for n in range(4)}
    for name, data in blobs.items():
        (source / name).write_bytes(data)
    (source / "link").symlink_to("pkg/deep/f1.bin")
    with _fleet(redis_server) as fleet, fleet.workspace(host="xfer") as ws:
        tmp_before = ws.run("ls -A /tmp").stdout
        ws.upload(source, "app")
        assert ws.run("readlink app/link").stdout == "pkg/deep/f1.bin\n"
        ws.run("echo made > app/pkg/out.txt")
        ws.download("app", tmp_path / "back")
        assert ws.run("ls -A /tmp").stdout == tmp_before
    for name, data in blobs.items():
        assert (tmp_path / "back" / name).read_bytes() == data
    assert (tmp_path / "back" / "pkg" / "out.txt").read_text() == "made\n"
    assert os.readlink(tmp_path / "back" / "link") == "pkg/deep/f1.bin"


def test_a_download_that_would_escape_is_refused_whole(
    host: WorkerProcess, redis_server: RedisServer, tmp_path: Path,
) -> None:
    """What a workspace's commands put in a directory is checked before anything lands."""
    with _fleet(redis_server) as fleet, fleet.workspace(host="xfer") as ws:
        ws.run("mkdir out; echo ok > out/a; ln -s /etc out/evil")
        with pytest.raises(WorkspaceFileError, match="evil"):
            ws.download("out", tmp_path / "back")
    assert not (tmp_path / "back").exists() or not any((tmp_path / "back").iterdir())


def test_the_async_client_streams_the_same(host: WorkerProcess, redis_server: RedisServer,
                                           tmp_path: Path) -> None:
    import asyncio  # noqa: PLC0415

    from bashfleet.client.aio import AsyncFleet  # noqa: PLC0415

    source = tmp_path / "a.bin"
    source.write_bytes(os.urandom(5 * 1024 * 1024 + 3))

    async def roundtrip() -> None:
        async with AsyncFleet(redis_server.url, owner=f"tenant-{uuid.uuid4().hex[:8]}") as fleet:
            ws = await fleet.workspace(host="xfer")
            async with ws:
                assert await ws.upload_file(source, "a.bin") == source.stat().st_size
                await ws.download_file("a.bin", tmp_path / "b.bin")
                await ws.upload(tmp_path / "tree-src", "tree")
                await ws.download("tree", tmp_path / "tree-back")

    (tmp_path / "tree-src").mkdir()
    (tmp_path / "tree-src" / "f").write_bytes(b"f")
    asyncio.run(roundtrip())
    assert _digest(tmp_path / "b.bin") == _digest(source)
    assert (tmp_path / "tree-back" / "f").read_bytes() == b"f"


def test_transfers_under_way_leave_the_control_calls_free(
    host: WorkerProcess, redis_server: RedisServer,
) -> None:
    """More transfers than the host has control threads, all stalled mid-stream: a check
    is still answered at once (the data moves on threads of their own)."""
    import threading  # noqa: PLC0415
    import time  # noqa: PLC0415

    from bashfleet.client._core.workspaces import PIECE_BYTES  # noqa: PLC0415

    go = threading.Event()
    sizes: list[int] = []

    def stalled() -> Iterator[bytes]:
        yield b"x" * PIECE_BYTES
        go.wait(60)
        yield b"y"

    with _fleet(redis_server) as fleet, fleet.workspace(host="xfer") as ws:
        job = ws.run("sleep 60", mode="background").job
        assert job is not None

        def upload(n: int) -> None:
            sizes.append(ws._send("file", f"stalled-{n}", stalled()).size)

        threads = [threading.Thread(target=upload, args=(n,)) for n in range(6)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # every transfer has pushed its first chunk and waits
        started = time.monotonic()
        assert ws.check(job.id).running
        assert time.monotonic() - started < 2.0
        go.set()
        for thread in threads:
            thread.join(60)
        assert sizes == [PIECE_BYTES + 1] * 6
