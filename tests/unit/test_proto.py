"""bashfleet.worker.engine.isolate.launcher, the parts that need no namespace: messages with fds,
the PATH search, the output cap's pace, wait statuses."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bashfleet.worker.engine.isolate import kernel, proto
from bashfleet.worker.engine.isolate.proto import CapWatch


@pytest.fixture(name="pair")
def _pair_fixture() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        yield ours, theirs
    finally:
        ours.close()
        theirs.close()


def test_a_message_carries_its_body_and_fds(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair
    read_end, write_end = os.pipe()
    try:
        proto.send(ours, b"C", {"argv": ["bash", "-c", "x"], "env": {"K": "v\udcff"}},
                      [write_end])
        tag, body, fds = proto.recv(theirs)
        assert (tag, body["argv"], body["env"]) == (b"C", ["bash", "-c", "x"], {"K": "v\udcff"})
        (received,) = fds
        # A new fd for the same pipe, close-on-exec: it leaks into no spawn.
        assert fcntl.fcntl(received, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        os.write(received, b"through")
        os.close(received)
        assert os.read(read_end, 16) == b"through"
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_large_message_travels_in_a_memfd(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair
    command = "echo " + "x" * (3 * proto.INLINE_LIMIT)
    proto.send(ours, b"C", {"argv": ["bash", "-c", command]})
    tag, body, fds = proto.recv(theirs)
    assert (tag, body["argv"][2], fds) == (b"C", command, [])


def test_end_of_file(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair
    ours.close()
    assert proto.recv(theirs) == (b"", {}, [])


@pytest.mark.parametrize(
    ("status", "code"),
    [(0, 0), (3 << 8, 3), (signal.SIGTERM, -signal.SIGTERM), (signal.SIGKILL, -9)],
)
def test_returncode(status: int, code: int) -> None:
    assert proto.returncode(status) == code


def test_spawn_searches_the_childs_path_from_its_cwd(tmp_path: Path) -> None:
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
    (tmp_path / "a" / "tool").write_text("not executable")
    tool = tmp_path / "b" / "tool"
    tool.write_text("#!/bin/sh\necho ran > \"$PWD/marker\"\n")
    tool.chmod(0o755)
    null = os.open(os.devnull, os.O_RDWR)
    try:
        # PATH entries relative to the cwd, as execvp takes them: searched in the child.
        pid = kernel.spawn(None, ["tool"], {"PATH": "a:b"}, [null, null, null], [0, 1, 2],
                           cwd=str(tmp_path))
        assert os.waitpid(pid, 0)[1] == 0
        assert (tmp_path / "marker").read_text() == "ran\n"
        with pytest.raises(FileNotFoundError) as missing:
            kernel.spawn(None, ["tool"], {"PATH": "/nonexistent"}, [null, null, null],
                         [0, 1, 2], cwd=str(tmp_path))
        assert missing.value.filename == "tool"
        with pytest.raises(FileNotFoundError) as bad_cwd:
            kernel.spawn("/bin/true", ["true"], {}, [null, null, null], [0, 1, 2],
                         cwd=str(tmp_path / "gone"))
        assert bad_cwd.value.filename == str(tmp_path / "gone")
    finally:
        os.close(null)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_cap_watch_paces_its_looks_by_the_write_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr("bashfleet.worker.engine.isolate.proto.time.monotonic", clock)
    sizes = [0]
    watch = CapWatch(lambda: sizes[0], cap=1000)
    clock.now += 1
    assert watch.step() == (False, proto.CAP_MAX_WAIT_S)  # quiet
    sizes[0], clock.now = 100, clock.now + 0.01  # 10,000 bytes a second: 0.09 s left
    over, pause = watch.step()
    assert not over and pause == pytest.approx(0.045)  # half of it
    sizes[0], clock.now = 110, clock.now + 0.01  # 1,000 a second: 0.89 s left
    assert watch.step() == (False, proto.CAP_MAX_WAIT_S)  # no longer than the longest
    sizes[0], clock.now = 900, clock.now + 0.01  # 80,000 a second: 1.25 ms left
    assert watch.step() == (False, proto.CAP_MIN_WAIT_S)
    sizes[0], clock.now = 1001, clock.now + 0.01
    assert watch.step() == (True, 0.0)


def test_files_size_counts_a_shared_file_once(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.write_bytes(b"x" * 10)
    err = tmp_path / "err"
    err.write_bytes(b"y" * 5)
    fds = [os.open(p, os.O_RDONLY) for p in (out, out, err)]
    try:
        assert proto.files_size(fds) == 15
    finally:
        for fd in fds:
            os.close(fd)


# ------------------------------------------------------------------ a keeper's report


@pytest.mark.parametrize(("data", "expected"), [
    (b"pid 42\nready\n", (42, True, "")),
    # The keeper's line first: two processes write the pipe (seen under a burst of calls).
    (b"ready\npid 42\n", (42, True, "")),
    (b"pid 42\nerror 2 No such file or directory: '/x'\n",
     (42, False, "2 No such file or directory: '/x'")),
    (b"error 12 Cannot allocate memory\n", (None, False, "12 Cannot allocate memory")),
    (b"pid 42\n", (42, False, "")),
    (b"", (None, False, "")),
    (b"pid 42\n\nerror 110 the keeper did not report within its setup time\n",
     (42, False, "110 the keeper did not report within its setup time")),
    (b"pid x\nready\n", (None, True, "")),
])
def test_a_keepers_report_is_read_whatever_the_order_of_its_lines(
    data: bytes, expected: tuple[int | None, bool, str]
) -> None:
    assert proto.parse_report(data) == expected


@given(st.permutations([proto.report_line("pid", "7"), proto.report_line("ready")]))
def test_report_lines_in_any_order_say_the_same(lines: list[bytes]) -> None:
    assert proto.parse_report(b"".join(lines)) == (7, True, "")


def test_a_report_line_is_one_line() -> None:
    assert proto.report_line("error", "5 two\nlines") == b"error 5 two lines\n"
