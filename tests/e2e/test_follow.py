"""`bashfleet run --follow` as a person runs it: the output streamed live, of a foreground
call as of a background job, every byte once and in order, and the command's own exit
status at the end.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from .helpers import Cli, local_fleet, wait_for

HOST = "f"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    state_dir = tmp_path_factory.mktemp("follow-fleet")
    with local_fleet(state_dir, "--hosts", HOST, "--no-flower") as cli:
        yield cli


def numbered(first: int, last: int, pause: float) -> str:
    """A shell loop printing `line N` for N in first..last, pausing between lines."""
    return f"for i in $(seq {first} {last}); do echo \"line $i\"; sleep {pause}; done"


def test_follow_streams_every_line_once_in_order(fleet: Cli) -> None:
    """Slow lines, then a burst far larger than one check shows (2000 lines / 50 KB), then
    slow lines again: all of it on stdout, once, in order; the exit status is the job's."""
    command = (
        f"{numbered(1, 40, 0.01)}; seq -f 'burst %g' 1 20000; {numbered(41, 80, 0.01)}; exit 3"
    )
    out = fleet("run", "--host", HOST, "--mode", "background", "--follow", command, timeout=90)
    expected = (
        [f"line {n}" for n in range(1, 41)]
        + [f"burst {n}" for n in range(1, 20001)]
        + [f"line {n}" for n in range(41, 81)]
    )
    assert out.stdout.splitlines() == expected, out.stderr
    assert out.returncode == 3, out.stderr
    # Where the job runs and how it ended go to stderr, not into its output.
    assert re.search(rf"\[job \S+ running on {HOST} ", out.stderr), out.stderr
    assert "exited with code 3" in out.stderr, out.stderr


def test_follow_of_a_background_job_keeps_stderr_on_stderr(fleet: Cli) -> None:
    """A job started in the background keeps its stderr apart: `--follow` writes it to
    stderr, `output --stream stderr` reads it alone, stdout holds stdout only."""
    command = f"echo out 1; echo err 1 >&2; {numbered(2, 5, 0.05)}; echo err 2 >&2; exit 4"
    out = fleet("run", "--host", HOST, "--mode", "background", "--follow", command, timeout=60)
    assert out.stdout.splitlines() == ["out 1"] + [f"line {n}" for n in range(2, 6)], out.stderr
    assert re.findall(r"^err \d$", out.stderr, re.M) == ["err 1", "err 2"], out.stderr
    assert out.returncode == 4, out.stderr
    job = re.search(r"\[job (\S+) running on", out.stderr)
    assert job is not None, out.stderr
    err = fleet("output", job.group(1), "--stream", "stderr")
    assert err.stdout == "err 1\nerr 2\n", err.stderr
    # Checks read on from where the last check stopped (the follower's): in each stream.
    check = fleet("check", job.group(1), "--json")
    assert '"stderr_offset": 12' in check.stdout, check.stdout


def test_follow_ends_with_the_jobs_signal_status(fleet: Cli) -> None:
    """A job ended by a signal: `run --follow` exits 128+N, like bash."""
    out = fleet("run", "--host", HOST, "--mode", "background", "--follow",
                "echo before; kill -TERM $$", timeout=60)
    assert out.stdout == "before\n", out.stderr
    assert out.returncode == 128 + 15, out.stderr


def test_follow_after_a_timeout_streams_both_files_from_the_start(fleet: Cli) -> None:
    """A call still running at its timeout goes on as a job with stdout and stderr apart
    (`--background-on-timeout`): `--follow` streams each from its first byte, on from what
    it showed before the timeout (nothing is shown twice)."""
    command = (
        f"echo out 1; echo err 1 >&2; {numbered(2, 30, 0.05)}; echo err 2 >&2; exit 4"
    )
    out = fleet("run", "--host", HOST, "--timeout", "0.5", "--background-on-timeout", "--follow",
                command, timeout=60)
    assert out.stdout.splitlines() == ["out 1"] + [f"line {n}" for n in range(2, 31)]
    assert re.findall(r"^err \d$", out.stderr, re.M) == ["err 1", "err 2"], out.stderr
    assert out.returncode == 4, out.stderr


def test_another_clients_checks_take_nothing_from_the_follower(
    fleet: Cli, tmp_path: Path
) -> None:
    """A `bashfleet check` of the same job by someone else, between the follower's reads,
    neither steals lines from it nor makes it repeat any."""
    project = fleet.project()  # the job's cwd: where it waits for `go`
    go = project / f"{uuid.uuid4().hex}.go"
    command = (
        f"{numbered(1, 30, 0.005)}; until [ -e {go} ]; do sleep 0.05; done; "
        f"{numbered(31, 60, 0.005)}"
    )
    stdout, stderr = tmp_path / "follow.out", tmp_path / "follow.err"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bashfleet.client.cli",
             "run", "--host", HOST, "--mode", "background",
             "--cwd", str(project), "--follow", command],
            env=fleet.env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
        )
    try:
        notice = wait_for(lambda: re.search(r"\[job (\S+) running", stderr.read_text()),
                          "the job's notice")
        job = notice.group(1)
        wait_for(lambda: "line 30\n" in stdout.read_text(), "the first 30 lines followed")
        for _ in range(3):
            checked = fleet("check", job)
            assert checked.returncode == 0, checked.stderr
        go.touch()
        assert proc.wait(60) == 0, stderr.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert stdout.read_text().splitlines() == [f"line {n}" for n in range(1, 61)]
    assert not psutil.pid_exists(proc.pid) or psutil.Process(proc.pid).status() == "zombie"


def test_follow_streams_a_foreground_call_as_it_runs(fleet: Cli, tmp_path: Path) -> None:
    """A foreground command's lines arrive while it runs (it used to show a spinner,
    then everything at once), then the rest, once each; its status."""
    project = fleet.project()  # the call's cwd: where it waits for `go`
    go = project / f"{uuid.uuid4().hex}.go"
    command = (f"{numbered(1, 5, 0.01)}; echo oops >&2; until [ -e {go} ]; do sleep 0.05; "
               f"done; seq -f 'burst %g' 1 5000; printf 'last, no newline'; exit 5")
    stdout, stderr = tmp_path / "follow.out", tmp_path / "follow.err"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bashfleet.client.cli",
             "run", "--host", HOST, "--cwd", str(project),
             "--follow", command],
            env=fleet.env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
        )
    try:
        # The first lines are there while the command still waits for `go`.
        wait_for(lambda: "line 5\n" in stdout.read_text(), "the first lines, live")
        wait_for(lambda: "oops\n" in stderr.read_text(), "stderr, live")
        assert proc.poll() is None
        go.touch()
        assert proc.wait(60) == 5, stderr.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    expected = ([f"line {n}" for n in range(1, 6)] + [f"burst {n}" for n in range(1, 5001)]
                + ["last, no newline"])
    assert stdout.read_text().splitlines() == expected
    assert stderr.read_text().count("oops\n") == 1


def test_follow_of_a_short_foreground_call_shows_each_line_once(fleet: Cli) -> None:
    """Output small enough to come whole in the result (its files are not kept): what was
    streamed is not shown again."""
    out = fleet("run", "--host", HOST, "--follow",
                "echo a; sleep 0.6; echo b; echo e >&2; sleep 0.6; printf c")
    assert (out.returncode, out.stdout) == (0, "a\nb\nc"), out.stderr
    assert out.stderr.count("e\n") == 1
