"""The CLI without a fleet: its parser (every option has help), `write`'s arguments, the
job id on stdout, the spinner, the exit statuses and their mapping, the words when no
fleet answers, and a closed stdout."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from bashfleet.client import cli
from bashfleet.client import exit_status as statuses
from bashfleet.client._core.routing import CallProgress
from bashfleet.client.cli import arguments, common, jobs, results, run
from bashfleet.client.dialects import DIALECTS
from bashfleet.client.dialects.base import SCHEMA_STYLES
from bashfleet.client.errors import UnknownJob
from bashfleet.worker.wire.control import Collect, SessionOutput
from bashfleet.worker.wire.models import (
    CallResult,
    HostInfo,
    JobHandle,
    OutputChunk,
    Spill,
    SystemError_,
)

# ------------------------------------------------------------------- help everywhere


def _parsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every parser of the tree, by its command path (`bashfleet run`)."""
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _parsers(child)


def test_every_option_of_every_command_has_help() -> None:
    """`up`'s Flower options, `output --offset/--limit`, `ps --host`, the `--json` of
    check and kill once had none."""
    missing = [
        f"{prog} {'/'.join(action.option_strings) or action.dest}"
        for prog, parser in _parsers(arguments.build_parser())
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
        and not (action.help and action.help != argparse.SUPPRESS)
    ]
    assert missing == []


def _help(*argv: str) -> str:
    parser = dict(_parsers(arguments.build_parser()))[" ".join(("bashfleet", *argv))]
    return " ".join(parser.format_help().split())


def test_mcp_and_schema_help_list_every_dialect() -> None:
    assert list(arguments.DIALECT_NAMES) == sorted(DIALECTS)
    for command in ("mcp", "schema"):
        shown = _help(command)
        for name in DIALECTS:
            assert name in shown, (command, name)
    assert "codex" in _help("mcp")


def test_schema_styles_are_the_dialects_own() -> None:
    assert arguments.SCHEMA_STYLES == SCHEMA_STYLES
    assert "openai-responses" in _help("schema")


def test_attach_help_says_the_detach_keys_format() -> None:
    shown = _help("attach")
    assert "^X or ctrl-X" in shown and "default ^]" in shown


# --------------------------------------------------------------------------- write


@pytest.mark.parametrize(
    ("argv", "text", "no_newline", "close"),
    [
        # The newcomer's: options after the text, then before it.
        (["write", "J", "-n", "abc"], ["abc"], True, False),
        (["write", "J", "abc", "-n"], ["abc"], True, False),
        (["write", "J", "a", "-n", "b", "c"], ["a", "b", "c"], True, False),
        (["write", "J", "--close"], [], False, True),
        (["write", "J", "--", "-n"], ["-n"], False, False),
    ],
)
def test_write_takes_options_on_both_sides_of_its_text(
    argv: list[str], text: list[str], no_newline: bool, close: bool
) -> None:
    args, rest = cli._parse(arguments.build_parser(), argv)
    assert rest == []
    assert (args.text, args.no_newline, args.close) == (text, no_newline, close)


def test_write_still_refuses_an_unknown_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["write", "J", "abc", "--bogus"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


class FakeSessionFleet:
    """What `write` asks of the fleet, recorded."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def _out(self) -> SessionOutput:
        return SessionOutput(id="j1", host="h", running=True)

    def write_stdin(self, id: str, data: str = "", *, collect: Collect | None = None
                    ) -> SessionOutput:
        self.sent.append(("write", data))
        return self._out()

    def close_stdin(self, id: str, *, collect: Collect | None = None) -> SessionOutput:
        self.sent.append(("close", ""))
        return self._out()


@pytest.mark.parametrize(
    ("argv", "sent"),
    [
        # `--close` alone once sent a newline before the EOF.
        (["write", "j1", "--close"], [("close", "")]),
        (["write", "j1", "abc", "--close"], [("write", "abc\n"), ("close", "")]),
        (["write", "j1", "-n", "abc", "--close"], [("write", "abc"), ("close", "")]),
        (["write", "j1", "-n", "abc"], [("write", "abc")]),
        (["write", "j1"], [("write", "\n")]),  # Enter
    ],
)
def test_write_sends_what_was_asked_and_nothing_more(
    argv: list[str], sent: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = FakeSessionFleet()
    monkeypatch.setattr(common, "open_fleet", lambda: fake)
    assert cli.main(argv) == 0
    assert fake.sent == sent
    assert "[job j1 on h: running]" in capsys.readouterr().err


# ---------------------------------------------------------------- the job id, stdout


def _job_result(**fields: Any) -> CallResult:
    job = JobHandle(id="j3f2c9a1b7d4e5f6", host="a", pid=42, pgid=42, output_path="/o")
    return CallResult(call_id="c1", host="a", backgrounded=True, job=job, exit_code=None,
                      **fields)


def test_a_background_job_prints_its_id_alone_on_stdout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`X=$(bashfleet run --mode background 'sleep 5')` must hold the id."""
    results.print_result(_job_result())
    out, err = capsys.readouterr()
    assert out == "j3f2c9a1b7d4e5f6\n"
    assert "bashfleet check j3f2c9a1b7d4e5f6" in err and "bashfleet kill" in err


def test_a_call_that_went_to_the_background_prints_the_id_alone_on_stdout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`J=$(bashfleet run --background-on-timeout ...)` holds the id, nothing else: the
    output so far goes to stderr."""
    results.print_result(_job_result(stdout="partial\n", timed_out=True))
    out, err = capsys.readouterr()
    assert out == "j3f2c9a1b7d4e5f6\n"
    assert err.startswith("partial\n")


def test_a_followed_job_keeps_stdout_for_its_output(capsys: pytest.CaptureFixture[str]) -> None:
    results.print_result(_job_result(), job_id_on_stdout=False)
    out, err = capsys.readouterr()
    assert out == "" and "j3f2c9a1b7d4e5f6" in err


# ------------------------------------------------------- following a job's streams


class StderrFiles:
    """`read_output` of jobs that keep a stderr file of their own (`apart`), or not."""

    def __init__(self, *apart: str) -> None:
        self.apart = apart

    def read_output(self, item: str, *, offset: int, limit: int, stream: str) -> OutputChunk:
        if stream == "stderr" and item not in self.apart:
            raise UnknownJob(f"job {item} has no separate stderr")
        return OutputChunk(path="/o", offset=0, next_offset=0, size=0, text="", eof=True)


def test_a_job_s_stderr_is_followed_apart_wherever_it_is_kept_apart() -> None:
    """`--follow` of a background job: its stderr is followed on stderr whenever the job
    keeps one of its own, whether the call said so (its spill) or only its host knows."""
    fleet = cast("Any", StderrFiles("j3f2c9a1b7d4e5f6"))
    assert run.keeps_stderr(fleet, _job_result())
    assert not run.keeps_stderr(cast("Any", StderrFiles()), _job_result())
    spilled = _job_result(spill=Spill(host="a", stdout_path="/o", stderr_path="/e"))
    assert run.keeps_stderr(cast("Any", StderrFiles()), spilled)


# ----------------------------------------------------------------- a cwd not seen


def _bad_cwd(path: str) -> CallResult:
    return CallResult(call_id="c1", host="a", error=SystemError_(
        kind="bad_cwd", message=f"Working directory does not exist: {path}"))


@pytest.mark.parametrize("path", ["/tmp/build", "/var/tmp/x/", "/tmp"])
def test_a_cwd_under_tmp_is_said_to_be_the_host_s_not_the_workspace_s(path: str) -> None:
    """It said only "does not exist" of a directory that exists on the host: /tmp in a
    workspace is its own."""
    hint = run.cwd_hint(_bad_cwd(path), path)
    assert hint is not None and "in a workspace is its own" in hint
    assert "BASHFLEET_WORKSPACE_ALLOW" in hint


def test_a_cwd_that_is_here_is_said_to_be_out_of_the_workspace_s_view(tmp_path: Path) -> None:
    here = tmp_path.resolve()
    hint = run.cwd_hint(_bad_cwd("/srv/x"), str(here))
    if str(here).startswith(("/tmp/", "/var/tmp/")):
        assert hint is not None and "is its own" in hint
    else:
        assert hint is not None and "not in the workspace's view" in hint


def test_no_hint_for_other_results_or_a_path_known_nowhere() -> None:
    assert run.cwd_hint(_bad_cwd("/nowhere/at/all"), "/nowhere/at/all") is None
    assert run.cwd_hint(CallResult(call_id="c", host="a", exit_code=0), "/tmp") is None
    assert run.cwd_hint(_bad_cwd("/tmp/x"), None) is None


# ------------------------------------------------------------------ exit statuses


@pytest.mark.parametrize(
    ("exit_code", "signal_number", "status"),
    [(0, None, 0), (3, None, 3), (None, 9, 137), (None, 15, 143), (None, 2, 130),
     (None, None, 125)],
)
def test_a_process_ending_as_a_status(
    exit_code: int | None, signal_number: int | None, status: int
) -> None:
    assert statuses.of_process(exit_code, signal_number) == status


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({"exit_code": 0}, 0),
        ({"exit_code": 42}, 42),
        ({"signal": 9}, 137),
        ({"exit_code": None, "timed_out": True, "signal": 15}, 124),
        ({"error": SystemError_(kind="bad_cwd", message="no such dir")}, 125),
        # A timeout kill that left survivors: an error note on an outcome, not a failure.
        ({"signal": 15, "timed_out": True, "error": SystemError_(kind="internal",
                                                                 message="survivors")}, 124),
        ({"backgrounded": True}, 0),
        ({}, 125),
        # Its worker was killed (SIGKILL): the stopping worker ended the command.
        ({"signal": 15, "error": SystemError_(kind="worker_lost", message="stopped")}, 125),
    ],
)
def test_a_call_as_a_status(fields: dict[str, Any], status: int) -> None:
    assert statuses.of_call(CallResult(call_id="c", host="h", **fields)) == status


def test_the_constants_are_bashs() -> None:
    assert (statuses.TIMEOUT, statuses.SYSTEM_ERROR, statuses.INTERRUPTED,
            statuses.BROKEN_PIPE, statuses.TERMINATED, statuses.USAGE) == (
        124, 125, 130, 141, 143, 2)


# --------------------------------------------------------------------- the spinner


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class FakeProgress:
    """`call_progress` of a call that waits for any host (first question), is queued on
    host a (second), then runs there (from the third on)."""

    def __init__(self, *steps: CallProgress) -> None:
        self.steps = steps or (CallProgress("queued", None), CallProgress("queued", "a"),
                               CallProgress("running", "a"))
        self.asked = 0

    def call_progress(self, call_id: str) -> CallProgress:
        self.asked += 1
        return self.steps[min(self.asked, len(self.steps)) - 1]


def test_the_spinner_says_queued_until_a_worker_takes_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It said "running on b" while the call still waited in b's queue."""
    monkeypatch.setattr(run.HostLabel, "LOOKUP_S", 0.0)
    fake = FakeProgress()
    label = run.HostLabel(cast("Any", fake), "c1", None)
    assert [label(), label(), label(), label()] == [
        "waiting for a host", "queued on a", "running on a", "running on a"]
    assert fake.asked == 3  # running: not asked again
    named = run.HostLabel(cast("Any", FakeProgress(CallProgress("queued", "b"))), "c1", "b")
    assert named() == "queued on b"


def test_the_spinner_gives_way_to_any_message_and_leaves_no_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After Ctrl-C its line used to stay. Whatever else writes to stderr (the Ctrl-C
    notice) stops it for good and clears its line first."""
    monkeypatch.setattr(run.Spinner, "FRAME_S", 0.005)
    out = Tty()
    drawn = threading.Event()

    def label() -> str:
        drawn.set()
        return "running on a"

    spinner = run.Spinner(label, out)
    with spinner.spinning():
        assert drawn.wait(5)
        while "running on a" not in out.getvalue():
            threading.Event().wait(0.005)  # the first frame is being written
        print("\n^C: cancelling call c1", file=sys.stderr, flush=True)
        frames = out.getvalue()
        threading.Event().wait(0.05)  # frames would come every 5 ms
        assert out.getvalue() == frames, "a frame was drawn after the message"
    assert sys.stderr is not spinner
    text = out.getvalue()
    before, message = text.split("\n^C: cancelling call c1\n")
    assert before.endswith("\r\033[K"), "its line is cleared before the message"
    assert message == ""


def test_no_spinner_off_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    spinner = run._spinner(cast("Any", FakeProgress()), cast("Any", None), None)
    assert isinstance(spinner, contextlib.nullcontext)


# ------------------------------------------------------- no fleet; a closed stdout


def _cli(env: dict[str, str], *argv: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BASHFLEET_")}
    clean.update(XDG_STATE_HOME=str(tmp_path / "xdg"), HOME=str(tmp_path), **env)
    return subprocess.run([sys.executable, "-m", "bashfleet.client.cli",
                           *argv], env=clean, text=True,
                          capture_output=True, timeout=60, check=False)


def test_with_no_fleet_the_cli_says_what_a_cli_user_does(tmp_path: Path) -> None:
    """It used to say "pass redis_url=" (the Python API's words)."""
    done = _cli({}, "ps", tmp_path=tmp_path)
    assert done.returncode == 125
    assert "redis_url=" not in done.stderr
    assert "bashfleet up" in done.stderr and "BASHFLEET_REDIS_URL" in done.stderr
    assert "Traceback" not in done.stderr


def test_with_redis_stopped_the_cli_says_to_start_the_fleet(tmp_path: Path) -> None:
    import socket  # noqa: PLC0415

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = _cli({"BASHFLEET_REDIS_URL": f"redis://127.0.0.1:{port}/0"}, "hosts",
                tmp_path=tmp_path)
    assert done.returncode == 125
    assert "unreachable" in done.stderr and "bashfleet up" in done.stderr
    assert "redis_url=" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(("env", "argv", "line"), [
    ({"BASHFLEET_OWNER": ""}, ("ps",),
     "bashfleet: BASHFLEET_OWNER='' is not allowed: 1 to 64 letters, digits or _ . : @ -"),
    ({"BASHFLEET_OWNER": "bad owner!"}, ("run", "true"),
     "bashfleet: BASHFLEET_OWNER='bad owner!' is not allowed: 1 to 64 letters"),
    ({"BASHFLEET_REDIS_URL": "foo://h/0"}, ("ps",),
     "bashfleet ps: the fleet's Redis URL cannot start with foo://: use redis://, "
     "rediss://, unix:// or sentinel://"),
])
def test_a_configuration_error_is_one_clear_line(
    tmp_path: Path, env: dict[str, str], argv: tuple[str, ...], line: str,
) -> None:
    """A bad BASHFLEET_OWNER printed pydantic's paragraph; a bad URL scheme, redis-py's
    list of schemes, without sentinel://."""
    done = _cli({"BASHFLEET_REDIS_URL": "redis://127.0.0.1:1/0", **env}, *argv,
                tmp_path=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith(line) and done.stderr.count("\n") == 1, done.stderr
    assert "pydantic" not in done.stderr and "validation error" not in done.stderr


def test_a_sentinel_that_knows_no_primary_is_one_short_line(tmp_path: Path) -> None:
    """redis-py's message went on with every sentinel client's repr (1,500 characters)."""
    done = _cli({"BASHFLEET_REDIS_URL": "sentinel://127.0.0.1:1?master=mymaster"}, "ps",
                tmp_path=tmp_path)
    assert done.returncode == 125
    first = done.stderr.splitlines()[0]
    assert first == ("bashfleet: Redis at sentinel://127.0.0.1:1/0?master=mymaster is "
                     "unreachable: No master found for 'mymaster': no sentinel answered for "
                     "it (are they up, and do they monitor it?)")
    assert "<redis." not in done.stderr


def test_the_cli_client_finds_the_fleet_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's client is given no URL: one found through `bashfleet up` is found again
    where it must be (`bashfleet events` across a `down` and `up` hears the new fleet,
    tests/integration/test_job_events.py), and it signs with the admin key."""
    import bashfleet.client.fleet  # noqa: PLC0415

    made: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def fleet(*args: Any, **kwargs: Any) -> str:
        made.append((args, kwargs))
        return "the fleet"

    monkeypatch.setattr(bashfleet.client.fleet, "resolve_url", lambda *_: "redis://127.0.0.1:1/0")
    monkeypatch.setattr(bashfleet.client.fleet, "Fleet", fleet)
    assert cast(object, common.open_fleet()) == "the fleet"
    assert made == [((), {"admin": True})]


def _into_a_closed_pipe(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The CLI with a stdout whose reader is gone before anything is written (`head`
    that read its lines)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "bashfleet.client.cli",
             *argv], stdout=write_end, stderr=subprocess.PIPE,
            text=True, timeout=60, check=False,
            env={**os.environ, "XDG_STATE_HOME": str(tmp_path)},
        )
    finally:
        os.close(write_end)
    return done


@pytest.mark.parametrize("argv", [["schema"], ["schema", "--dialect", "native"]])
def test_a_closed_stdout_ends_quietly_with_141(argv: list[str], tmp_path: Path) -> None:
    """`bashfleet schema | head` used to end in a BrokenPipeError traceback."""
    done = _into_a_closed_pipe(argv, tmp_path)
    assert done.stderr == ""
    assert done.returncode == statuses.BROKEN_PIPE


def test_help_into_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    # argparse drops a failed write of its help itself (and exits 0).
    assert _into_a_closed_pipe(["--help"], tmp_path).stderr == ""


def test_schema_into_head_shows_no_traceback(tmp_path: Path) -> None:
    shell = f"{sys.executable} -m bashfleet.client.cli schema | head -n 1"
    done = subprocess.run(["bash", "-c", shell], text=True, capture_output=True, timeout=60,
                          check=False, env={**os.environ, "XDG_STATE_HOME": str(tmp_path)})
    assert done.stdout == "{\n" and done.stderr == ""


# --------------------------------------------------------------------------------- hosts


def test_hosts_leaves_out_a_fleet_long_gone() -> None:
    now = 1_700_000_000.0
    hosts = [
        HostInfo(host="live", alive=True, heartbeat_at=now - 1),
        HostInfo(host="just-died", alive=False, heartbeat_at=now - 600),
        HostInfo(host="long-gone", alive=False, heartbeat_at=now - 5 * 3600),
        HostInfo(host="never-beat", alive=False),
    ]
    assert [h.host for h in jobs.shown_hosts(hosts, now, all_hosts=False)] == ["live", "just-died"]
    assert jobs.shown_hosts(hosts, now, all_hosts=True) == hosts


@pytest.mark.parametrize(
    ("sandbox", "text"),
    [
        (None, "?"),
        ({"isolation": "none"}, "NONE, no cgroup (ulimit)"),
        ({"isolation": "process", "cgroup": "v2", "tenancy": "multi", "run_as": "r"},
         "process, cgroup v2, ids per workspace"),
        ({"isolation": "strict", "tenancy": "single", "run_as": "bashfleet-run"},
         "strict, no cgroup (ulimit), single-tenant: one uid for every workspace, as "
         "bashfleet-run"),
        ({"isolation": "process", "cgroup": "v1", "tenancy": "multi", "network": "egress"},
         "process, cgroup v1, ids per workspace, network egress"),
        ({"isolation": "process", "tenancy": "multi", "network": "egress",
          "network_host": True}, "process, no cgroup (ulimit), ids per workspace, network "
         "egress (host allowed)"),
        ({"isolation": "process", "cgroup": "v1", "tenancy": "multi", "id_problem": "x"},
         "process, cgroup v1, ids per workspace (NOT machine-wide)"),
        ({"isolation": "process", "tenancy": "multi", "seccomp": "default"},
         "process, no cgroup (ulimit), ids per workspace, seccomp default"),
        ({"isolation": "strict", "tenancy": "multi", "seccomp": "unconfined"},
         "strict, no cgroup (ulimit), ids per workspace, seccomp unconfined"),
        ({"isolation": "process", "tenancy": "multi", "layers": "overlay"},
         "process, no cgroup (ulimit), ids per workspace, own / over the host read-only"),
        ({"isolation": "process", "tenancy": "single", "layers": "read-only host"},
         "process, no cgroup (ulimit), single-tenant: one uid for every workspace, "
         "read-only host"),
    ],
)
def test_hosts_say_whether_workspaces_have_ids_of_their_own(
    sandbox: dict[str, object] | None, text: str
) -> None:
    assert jobs.isolation_text(sandbox) == text


@pytest.mark.parametrize(
    ("asked", "status", "said"),
    [("build-a", 0, "alive"), ("build-b", 1, "heartbeat expired"),
     ("build-c", 1, "no worker record")],
)
def test_hosts_alive_answers_for_the_host_asked_about_only(
    asked: str, status: int, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from bashfleet.worker.wire.models import HostInfo  # noqa: PLC0415

    known = [HostInfo(host="build-a", alive=True), HostInfo(host="build-b", alive=False)]
    assert jobs.host_alive(known, asked) == status
    assert said in capsys.readouterr()[status]
