"""bashfleet.worker.engine.procs:
start times read from /proc equal psutil's, and pid reuse is detected."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import psutil
import pytest

from bashfleet.worker.engine import procs
from bashfleet.worker.engine.memo import TimedMemo


@pytest.fixture(name="child")
def _child_fixture() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_start_time_is_psutils_create_time(child: subprocess.Popen[bytes]) -> None:
    # Equal, not close: records written by the engine are compared with psutil's values.
    for pid in (os.getpid(), child.pid, 1):
        assert procs.start_time(pid) == psutil.Process(pid).create_time()


def test_start_time_of_a_gone_process_is_none() -> None:
    finished = subprocess.Popen(["true"])
    finished.wait()
    assert procs.start_time(finished.pid) is None


def test_start_time_falls_back_to_psutil_without_boot_time(
    child: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(procs, "_boot_times", TimedMemo(ttl_s=10.0))
    monkeypatch.setattr(procs, "_read_boot_time", lambda: None)
    assert procs.start_time(child.pid) == psutil.Process(child.pid).create_time()


def test_boot_time_is_read_again_after_its_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[float] = []

    def read() -> float:
        reads.append(1000.0 + len(reads))
        return reads[-1]

    monkeypatch.setattr(procs, "_boot_times", TimedMemo(ttl_s=10.0))
    monkeypatch.setattr(procs, "_read_boot_time", read)
    assert procs.boot_time() == procs.boot_time() == 1000.0
    monkeypatch.setattr(procs._boot_times, "ttl_s", 0.0)
    assert procs.boot_time() == 1001.0


def test_read_stat_parses_a_command_name_with_spaces_and_parentheses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    line = b"42 (a) b (c) S 7 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 12345 0 0\n"
    monkeypatch.setattr(procs, "_read_proc_file", lambda path: line)
    assert procs.read_stat(42) == procs.ProcStat(
        pid=42, state="S", ppid=7, pgid=42, start_ticks=12345
    )


def test_is_same_process(child: subprocess.Popen[bytes]) -> None:
    started = psutil.Process(child.pid).create_time()
    assert procs.is_same_process(child.pid, started)
    assert not procs.is_same_process(child.pid, started - 1.0)  # a reused pid
    child.kill()
    child.wait()
    assert not procs.is_same_process(child.pid, started)


MAPS = """\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 1234  /usr/bin/python3.11
7f0000000000-7f0000001000 rw-s 00000000 08:01 99    /work/m.bin
7f0000001000-7f0000002000 r--s 00000000 08:01 98    /work/read-only.bin
7f0000002000-7f0000003000 rw-p 00000000 08:01 97    /work/private.bin
7f0000003000-7f0000004000 rw-s 00000000 00:01 5     /dev/zero (deleted)
7f0000004000-7f0000005000 rw-p 00000000 00:00 0
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0     [stack]
7ffd00030000-7ffd00031000 rw-s 00000000 00:00 0     [vvar]
"""


def test_shared_writable_files_are_the_shared_writable_mappings_with_a_path() -> None:
    # A private mapping copies on write (the file never changes); a read-only one cannot
    # write; shared memory without a file (a /dev/zero one) is told as a file: it errs
    # toward "cannot tell".
    assert procs.shared_writable_files(MAPS) == ["/work/m.bin", "/dev/zero (deleted)"]
    assert procs.shared_writable_files("") == []


def test_a_process_that_maps_nothing_shared_is_told_so(child: subprocess.Popen[bytes]) -> None:
    assert procs.maps_shared_writable(child.pid) is False
    assert procs.maps_shared_writable(2**22 + 1) is None  # no such process
