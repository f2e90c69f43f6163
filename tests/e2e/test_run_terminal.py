"""`bashfleet run` as a person at a terminal (or a CI runner) uses it: Ctrl-C, SIGTERM, a
timeout in a `&&` chain, stdin, and sessions that outlive the process."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from .helpers import Cli, bashfleet_command, local_fleet, wait_for

HOST = "term"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    state_dir = tmp_path_factory.mktemp("term-fleet")
    with local_fleet(state_dir, "--hosts", HOST, "--concurrency", "4", "--no-flower") as cli:
        yield cli


class Running:
    """`bashfleet run ...` started in the background, its streams in files."""

    def __init__(self, cli: Cli, folder: Path, *args: str, stdin: Any = subprocess.DEVNULL):
        self.out, self.err = folder / f"{uuid.uuid4().hex}.out", folder / f"{uuid.uuid4().hex}.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen([*bashfleet_command(), "run", *args], env=cli.env,
                                         stdout=out, stderr=err, stdin=stdin)

    def stdout(self) -> str:
        return self.out.read_text()

    def stderr(self) -> str:
        return self.err.read_text()

    def wait(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)


def sleeping(seconds: str) -> list[psutil.Process]:
    """Live `sleep SECONDS` processes (each test sleeps a number of its own)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["cmdline"] == ["sleep", seconds] and (
            proc.info["status"] != psutil.STATUS_ZOMBIE
        ):
            found.append(proc)
    return found


def unique_seconds() -> str:
    return f"4{uuid.uuid4().int % 10**6:06d}"


def busy(cli: Cli) -> int:
    return sum(h["busy"] for h in json.loads(cli("hosts", "--json").stdout))


def running_jobs(cli: Cli) -> list[dict[str, Any]]:
    return [j for j in json.loads(cli("ps", "--json").stdout) if j["state"] == "running"]


# ----------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_cancels_the_remote_call(fleet: Cli, tmp_path: Path) -> None:
    """Ctrl-C used to exit 130 with no word, the command running on, unlisted, its slot
    busy."""
    seconds = unique_seconds()
    run = Running(fleet, tmp_path, "--host", HOST, f"echo begin; sleep {seconds}")
    wait_for(lambda: sleeping(seconds), "the command to run")
    run.proc.send_signal(signal.SIGINT)
    assert run.wait() == 130, run.stderr()
    assert "^C: cancelling call c" in run.stderr()
    assert "[call cancelled; its processes were killed]" in run.stderr()
    assert run.stdout() == "begin\n"  # its output so far
    assert sleeping(seconds) == []
    wait_for(lambda: busy(fleet) == 0, "the slot to be freed")
    assert running_jobs(fleet) == []


def test_a_second_ctrl_c_leaves_it_running_as_a_job(fleet: Cli, tmp_path: Path) -> None:
    seconds = unique_seconds()
    run = Running(fleet, tmp_path, "--host", HOST, f"echo begin; sleep {seconds}")
    wait_for(lambda: sleeping(seconds), "the command to run")
    run.proc.send_signal(signal.SIGINT)
    wait_for(lambda: "^C: cancelling" in run.stderr(), "the first Ctrl-C's notice")
    run.proc.send_signal(signal.SIGINT)
    assert run.wait() == 130, run.stderr()
    notice = run.stderr().split("[job ", 1)[1]
    job_id = notice.split()[0]
    assert f"`bashfleet kill {job_id}`" in notice
    assert len(sleeping(seconds)) == 1  # still running, now as a job
    assert [j["id"] for j in running_jobs(fleet)] == [job_id]
    killed = fleet("kill", job_id)
    assert killed.returncode == 0
    wait_for(lambda: sleeping(seconds) == [], "the job to end")
    # `ps` says which signal ended it.
    row = next(line for line in fleet("ps").stdout.splitlines() if line.startswith(job_id))
    assert row.split()[4] == "SIGTERM", row


class AtTerminal:
    """`bashfleet run ...` typed at a real terminal: a pseudo-terminal that is its
    controlling terminal (a Ctrl-C typed there is the line discipline's SIGINT, as a
    person's is), stdin and stderr on it (the spinner runs), stdout redirected to a file
    as in `J=$(bashfleet run ...)`."""

    def __init__(self, cli: Cli, folder: Path, *args: str) -> None:
        self.out = folder / f"{uuid.uuid4().hex}.out"
        self.primary, secondary = pty.openpty()
        self.screen = bytearray()
        with self.out.open("wb") as out:
            # setsid --ctty: a session of its own, whose controlling terminal is its stdin.
            self.proc = subprocess.Popen(
                ["setsid", "--ctty", *bashfleet_command(), "run", *args], env=cli.env,
                stdin=secondary, stdout=out, stderr=secondary)
        os.close(secondary)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with contextlib.suppress(OSError):  # EIO once the terminal's last user is gone
            while chunk := os.read(self.primary, 4096):
                self.screen += chunk

    def text(self) -> str:
        return self.screen.decode(errors="replace")

    def ctrl_c(self) -> None:
        os.write(self.primary, b"\x03")

    def wait(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
            self._reader.join(5)
            os.close(self.primary)

    def stdout(self) -> str:
        return self.out.read_text()


@pytest.mark.parametrize("attempt", range(3))
def test_two_ctrl_c_at_a_terminal_print_the_job_id_alone_on_stdout(
    fleet: Cli, tmp_path: Path, attempt: int,
) -> None:
    """The id of the job a second Ctrl-C leaves running is printed, every time (it used
    to be given up on when the detach took more than a tick), alone on stdout (it used
    to follow the call's output there)."""
    del attempt  # the race it had lost 5 times in 6: tried more than once
    seconds = unique_seconds()
    run = AtTerminal(fleet, tmp_path, "--host", HOST, f"echo start; sleep {seconds}")
    wait_for(lambda: sleeping(seconds), "the command to run")
    wait_for(lambda: "running on" in run.text(), "the spinner")
    run.ctrl_c()
    wait_for(lambda: "^C: cancelling" in run.text(), "the first Ctrl-C's notice")
    run.ctrl_c()
    assert run.wait() == 130, run.text()
    job_id = run.stdout().strip()
    assert re.fullmatch(r"j[0-9a-f]+", job_id), (run.stdout(), run.text())
    assert f"[job {job_id} running on {HOST}" in run.text()
    assert "start" in run.text()  # the output so far, on the terminal (stderr)
    assert [j["id"] for j in running_jobs(fleet)] == [job_id]
    assert fleet("kill", job_id).returncode == 0
    wait_for(lambda: sleeping(seconds) == [], "the job to end")


def test_background_on_timeout_prints_the_job_id_alone_on_stdout(fleet: Cli) -> None:
    """`J=$(bashfleet run --background-on-timeout ...)` holds the id and nothing else, so
    `bashfleet kill $J` works."""
    seconds = unique_seconds()
    run = fleet("run", "--host", HOST, "--timeout", "1", "--background-on-timeout",
                f"echo start; sleep {seconds}")
    assert run.returncode == 0, run.stderr
    job_id = run.stdout.strip()
    assert run.stdout == f"{job_id}\n" and re.fullmatch(r"j[0-9a-f]+", job_id), run.stdout
    assert "start" in run.stderr
    assert fleet("kill", job_id).returncode == 0
    wait_for(lambda: sleeping(seconds) == [], "the job to end")


def test_a_cwd_of_the_host_s_tmp_is_said_to_be_out_of_view(fleet: Cli, tmp_path: Path) -> None:
    """A directory under the host's /tmp (this test's own) exists, but not in a call's
    workspace: it said only "does not exist"."""
    run = fleet("run", "--cwd", str(tmp_path), "pwd")
    assert run.returncode == 125, run.stderr
    assert f"bad_cwd: Working directory does not exist: {tmp_path}" in run.stderr
    assert "[/tmp in a workspace is its own: the host's /tmp is not seen there." in run.stderr


def test_sigterm_cancels_at_once(fleet: Cli, tmp_path: Path) -> None:
    """A CI runner stopping the job stops the remote command too."""
    seconds = unique_seconds()
    run = Running(fleet, tmp_path, "--host", HOST, f"sleep {seconds}")
    wait_for(lambda: sleeping(seconds), "the command to run")
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait() == 143, run.stderr()
    wait_for(lambda: sleeping(seconds) == [], "the command to be killed")
    wait_for(lambda: busy(fleet) == 0, "the slot to be freed")


# ---------------------------------------------------------------------------- timeout


@pytest.mark.parametrize("mode", ["default", "slow"])
def test_a_timeout_fails_the_chain(fleet: Cli, mode: str) -> None:
    """`run --timeout 2 'sleep 5; echo finished' && echo deploy` used to exit 0 and
    deploy; docs/cli.md's 124 could never happen."""
    command = [*bashfleet_command(), "run", "--mode", mode, "--timeout", "2",
               "sleep 5; echo finished"]
    chained = subprocess.run(
        ["bash", "-c", 'exec "$@" && echo deploy', "chain", *command], env=fleet.env,
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert chained.returncode == 124
    assert "deploy" not in chained.stdout and "finished" not in chained.stdout
    # The time it ran, measured: the 2 s timeout plus the kill (longer on a loaded host).
    assert re.search(r"\[timed out after 2\.\ds; processes killed", chained.stderr), \
        chained.stderr
    assert running_jobs(fleet) == []


# ------------------------------------------------------------------------------ stdin


def test_piped_stdin_is_forwarded_or_said_to_be_lost(fleet: Cli) -> None:
    """A piped stdin reaches the command (as with ssh); with --no-stdin it does not, and a
    warning says so."""
    forwarded = subprocess.run([*bashfleet_command(), "run", "cat; echo done"], env=fleet.env,
                               input="data\n", capture_output=True, text=True, timeout=60,
                               check=False)
    assert (forwarded.returncode, forwarded.stdout) == (0, "data\ndone\n"), forwarded.stderr
    assert "warning" not in forwarded.stderr
    piped = subprocess.run([*bashfleet_command(), "run", "--no-stdin", "cat; echo done"],
                           env=fleet.env, input="data\n", capture_output=True, text=True,
                           timeout=60, check=False)
    assert piped.stdout == "done\n"
    assert "warning: the command's stdin is /dev/null on its host; what is piped" in (
        piped.stderr
    )
    quiet = subprocess.run([*bashfleet_command(), "run", "true"], env=fleet.env,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=60, check=False)
    assert "warning" not in quiet.stderr


def test_typing_at_the_terminal_is_said_to_be_lost(fleet: Cli, tmp_path: Path) -> None:
    primary, secondary = pty.openpty()
    try:
        with os.fdopen(secondary, "rb", buffering=0, closefd=False) as terminal:
            run = Running(fleet, tmp_path, "--json", "sleep 2; echo done",
                          stdin=terminal)
        wait_for(lambda: psutil.pid_exists(run.proc.pid), "the CLI to start")
        os.write(primary, b"yes\n")  # a person answering a prompt the command never sees
        assert run.wait() == 0, run.stderr()
    finally:
        os.close(primary)
        os.close(secondary)
    assert "warning: the command's stdin is /dev/null on its host; what you type here" in (
        run.stderr()
    )


# --------------------------------------------------------------------------- sessions


def test_a_session_lives_on_across_processes(fleet: Cli) -> None:
    """`run --session s 'cd /tmp; export Y=2'` then `run --session s 'pwd; echo
    $Y'` used to print the home directory and nothing."""
    session = f"e2e-{uuid.uuid4().hex[:8]}"
    first = fleet("run", "--session", session, "cd /tmp; export Y=2")
    assert first.returncode == 0, first.stderr
    second = fleet("run", "--session", session, "pwd; echo $Y; unset Y")
    assert second.stdout == "/tmp\n2\n"
    third = fleet("run", "--session", session, 'echo "${Y-unset}"; pwd')
    assert third.stdout == "unset\n/tmp\n"
    # An explicit --cwd holds for its call only.
    assert fleet("run", "--session", session, "--cwd", "/", "pwd").stdout == "/\n"
    assert fleet("run", "--session", session, "pwd").stdout == "/tmp\n"


def test_concurrent_calls_of_a_session_never_lose_a_cd(fleet: Cli, tmp_path: Path) -> None:
    """Three calls at once in a fresh session; the quick `cd` is kept although slower
    calls that did not `cd` end after it, and every export counts."""
    session = f"e2e-{uuid.uuid4().hex[:8]}"
    runs = [
        Running(fleet, tmp_path, "--session", session, "cd /tmp; export A=1"),
        Running(fleet, tmp_path, "--session", session, "sleep 1; export B=2"),
        Running(fleet, tmp_path, "--session", session, "sleep 2; export C=3"),
    ]
    assert [run.wait() for run in runs] == [0, 0, 0], [run.stderr() for run in runs]
    after = fleet("run", "--session", session, "pwd; echo $A$B$C")
    assert after.stdout == "/tmp\n123\n", after.stderr



def test_the_spinner_names_the_host_and_is_gone_after_ctrl_c(fleet: Cli) -> None:
    """At a terminal the spinner once said "running on any host" for a call that ran on
    a host, and its line stayed after Ctrl-C."""
    import select  # noqa: PLC0415
    import time  # noqa: PLC0415

    seconds = unique_seconds()
    master, slave = pty.openpty()
    proc = subprocess.Popen([*bashfleet_command(), "run", f"sleep {seconds}"], env=fleet.env,
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    shown = b""

    def read_for(check: Any, seconds_left: float = 30.0) -> None:
        nonlocal shown
        deadline = time.monotonic() + seconds_left
        while not check(shown):
            assert time.monotonic() < deadline, shown[-600:]
            if select.select([master], [], [], 0.2)[0]:
                try:
                    shown += os.read(master, 65536)
                except OSError:  # the process ended and closed its side
                    return

    try:
        read_for(lambda seen: f"running on {HOST}".encode() in seen)
        assert b"any host" not in shown
        wait_for(lambda: sleeping(seconds), "the command to run")
        proc.send_signal(signal.SIGINT)
        read_for(lambda seen: b"[call cancelled" in seen)
        assert proc.wait(30) == 130
        while select.select([master], [], [], 0.2)[0]:  # what it wrote before it ended
            try:
                shown += os.read(master, 65536)
            except OSError:
                break
        after = shown.split(b"^C: cancelling call", 1)[1]
        # Cleared before the notice, never drawn again after it.
        assert shown.split(b"^C: cancelling call", 1)[0].rstrip(b"\r\n").endswith(b"\x1b[K")
        assert b"running on" not in after, after
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(master)
