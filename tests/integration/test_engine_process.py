"""The process a call gets: no TTY, empty stdin, own session, hardened and scrubbed env,
exit codes and signals, and the system errors that keep a command from running."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from pathlib import Path

import psutil
import pytest

from bashfleet.worker import InterceptRule, Policy
from bashfleet.worker.engine import isolate, sandbox, workspaces
from bashfleet.worker.engine.environment import MARKER_VAR
from bashfleet.worker.engine.isolate import launcher

from .engine_helpers import (
    DEADLINE_S,
    KILL,
    Engine,
    Watch,
    WitnessEngine,
    _engine_fixture,  # noqa: F401 - fixture
    _janitor_fixture,  # noqa: F401 - fixture
    _plain_engine_fixture,  # noqa: F401 - fixture
    _witness_engine_fixture,  # noqa: F401 - fixture
    current_umask,
    spill_files,
    wait_until,
)

SECRET = "s3cr3t-value-123"


def _env_lines(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {name: value for name, value in pairs}


def test_no_tty_and_stdin_is_empty(engine: Engine) -> None:
    result = engine.run(
        'test -t 0; echo "t0=$?"; test -t 1; echo "t1=$?"; test -t 2; echo "t2=$?"; '
        'tty; echo "tty=$?"; cat; echo "cat=$?"; '
        # No controlling terminal at all: opening /dev/tty fails.
        '( : < /dev/tty ) 2>/dev/null; echo "devtty=$?"',
        timeout_s=10,
    )
    assert result.error is None
    assert result.exit_code == 0
    assert result.stdout == (
        "t0=1\nt1=1\nt2=1\nnot a tty\ntty=1\ncat=0\ndevtty=1\n"
    ), result.stdout
    assert not result.timed_out
    # `cat` on /dev/null returns at once: the call did not wait for input.
    assert result.duration_s < 5


def test_own_process_group_and_session(plain_engine: Engine) -> None:
    engine = plain_engine
    watch = Watch()
    result = engine.run(
        'echo "$$"; read -r line < /proc/$$/stat; echo "${line##*) }"', watcher=watch,
    )
    assert result.exit_code == 0, result
    pid_text, stat_text = result.stdout.splitlines()
    pid = int(pid_text)
    _state, _ppid, pgid, sid = stat_text.split()[:4]
    assert int(pgid) == pid
    assert int(sid) == pid
    assert int(pgid) != os.getpgid(0)
    assert int(sid) != os.getsid(0)
    assert [(s.pid, s.pgid, s.marker) for s in watch.spawns] == [(pid, pid, result.call_id)]


def test_hardened_environment_and_marker(engine: Engine) -> None:
    result = engine.run("env")
    env = _env_lines(result.stdout)
    assert {
        name: env.get(name)
        for name in (
            "PAGER", "GIT_PAGER", "GIT_EDITOR", "EDITOR", "GIT_TERMINAL_PROMPT", "CI",
            "DEBIAN_FRONTEND", "TERM", "NO_COLOR",
        )
    } == {
        "PAGER": "cat", "GIT_PAGER": "cat", "GIT_EDITOR": "true", "EDITOR": "true",
        "GIT_TERMINAL_PROMPT": "0", "CI": "1", "DEBIAN_FRONTEND": "noninteractive",
        "TERM": "dumb", "NO_COLOR": "1",
    }
    assert env[MARKER_VAR] == result.call_id


def test_session_env_is_added_over_the_hardening_but_cannot_forge_the_marker(
    engine: Engine,
) -> None:
    # The hardening (PAGER=cat, CI=1...) is a default: what a caller or its session set
    # holds (a session's `export PAGER=less` sticks); the marker never moves.
    result = engine.run(
        'echo "$SESSION_VAR $PAGER $CI ${BASHFLEET_CALL_MARKER}"',
        env={"SESSION_VAR": "kept", "PAGER": "less", "CI": "0", MARKER_VAR: "forged"},
    )
    assert result.stdout == f"kept less 0 {result.call_id}\n"
    assert engine.run('echo "$PAGER $CI"').stdout == "cat 1\n"


def test_planted_secret_is_scrubbed_and_redacted(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_API_TOKEN", SECRET)
    monkeypatch.setenv("BASHFLEET_REDIS_URL", "redis://:hunter2-broker@example:6379/0")
    secret_file = engine.tmp / "leak.txt"  # in the workspace: what a call can read
    secret_file.write_text(f"token={SECRET}\n")

    listing = engine.run("env")
    assert "MY_API_TOKEN" not in listing.stdout
    assert SECRET not in listing.stdout
    assert "BASHFLEET_REDIS_URL" not in listing.stdout
    assert "hunter2-broker" not in listing.stdout

    # The command finds the value some other way and prints it, on both streams.
    leaked = engine.run(f"cat {secret_file}; printf 'err:%s\\n' \"$(cat {secret_file})\" >&2")
    assert leaked.exit_code == 0
    assert leaked.stdout == "token=[REDACTED]\n"
    assert leaked.stderr == "err:token=[REDACTED]\n"
    assert SECRET not in leaked.model_dump_json()


@pytest.mark.parametrize("code", [0, 1, 42, 255])
def test_exit_codes(engine: Engine, code: int) -> None:
    result = engine.run(f"echo before; exit {code}")
    assert (result.exit_code, result.signal, result.error, result.timed_out) == (
        code, None, None, False,
    )
    assert result.stdout == "before\n"


@pytest.mark.parametrize(("how", "number"), [("-9", 9), ("-TERM", 15)])
def test_death_by_signal(engine: Engine, how: str, number: int) -> None:
    result = engine.run(f"echo dying; kill {how} $$; echo not-reached")
    assert result.exit_code is None
    assert result.signal == number
    assert result.error is None
    assert not result.timed_out
    assert result.stdout == "dying\n"


def _side_effect_command(path: Path) -> str:
    return f"touch {path}; echo ran"


def _assert_nothing_ran(engine: Engine, side: Path, call_id: str) -> None:
    assert not side.exists()
    assert spill_files(engine.settings, call_id) == []


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_bad_cwd_runs_nothing(witness_engine: WitnessEngine, kind: str) -> None:
    """A cwd that is missing or a file, in the call's view (the witness directory is in
    every view): bad_cwd, and the command, which could have written the witness, did not
    run."""
    engine = witness_engine
    side = engine.witness / "side-effect"
    cwd = engine.witness / "nowhere"
    if kind == "file":
        cwd.write_text("not a directory")
    result = engine.run(_side_effect_command(side), cwd=str(cwd))
    assert result.error is not None
    assert result.error.kind == "bad_cwd"
    assert str(cwd) in result.error.message
    assert (result.exit_code, result.signal, result.stdout) == (None, None, "")
    _assert_nothing_ran(engine, side, result.call_id)


def test_bad_cwd_runs_no_background_job_either(witness_engine: WitnessEngine) -> None:
    engine = witness_engine
    side = engine.witness / "side-effect"
    result = engine.run(_side_effect_command(side), cwd=str(engine.witness / "gone"),
                        background=True)
    assert result.error is not None
    assert result.error.kind == "bad_cwd"
    assert result.job is None
    assert not side.exists()


def test_cwd_is_used(engine: Engine) -> None:
    where = engine.tmp / "here"
    where.mkdir()
    result = engine.run("pwd", cwd=str(where))
    assert result.stdout == f"{where.resolve()}\n"
    assert result.cwd == str(where.resolve())


def test_policy_block_runs_nothing(engine: Engine) -> None:
    side = engine.tmp / "side-effect"  # in the call's workspace: it could write there
    rule = InterceptRule(pattern=r"^\s*touch\s", tool="write", message="Use the write tool.")
    blocking = Policy(
        on_timeout="kill", kill_grace_s=0.5, intercept=(rule,), available_tools=("write",)
    )
    result = engine.run(_side_effect_command(side), policy=blocking)
    assert result.error is not None
    assert result.error.kind == "blocked"
    assert result.error.message.startswith("Blocked: Use the write tool.")
    assert _side_effect_command(side) in result.error.message
    _assert_nothing_ran(engine, side, result.call_id)

    # The same rule does not block when the agent lacks the tool it points to.
    lacking = blocking.model_copy(update={"available_tools": ("read",)})
    allowed = engine.run(_side_effect_command(side), policy=lacking)
    assert allowed.error is None
    assert allowed.stdout == "ran\n"
    assert side.exists()


def test_timeout_above_policy_maximum_is_invalid(engine: Engine) -> None:
    side = engine.tmp / "side-effect"
    strict = KILL.model_copy(update={"max_timeout_s": 10.0})
    result = engine.run(_side_effect_command(side), policy=strict, timeout_s=11)
    assert result.error is not None
    assert result.error.kind == "invalid"
    assert "10s" in result.error.message
    _assert_nothing_ran(engine, side, result.call_id)


@pytest.mark.parametrize("background", [False, True])
def test_spawn_failure_is_a_system_error(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, background: bool
) -> None:
    # No bash on the PATH the command inherits: the call cannot start.
    monkeypatch.setenv("PATH", "/nonexistent-bin")
    result = engine.run("echo hi", background=background)
    assert result.error is not None
    assert result.error.kind == "spawn_failed"
    assert result.exit_code is None
    assert result.job is None
    # Nothing of the call is left behind: no spill, no job record or status; the
    # throwaway workspace it ran in (its record is the state directory's only file while
    # it exists) is removed once the call ended.
    state = engine.settings.state_dir

    def files_left() -> list[str]:
        # os.walk, unlike rglob, skips what is removed while it walks. The keepers made
        # ahead for the next workspaces (`blank-*`) are no call's leftovers.
        return [name for folder, _dirs, names in os.walk(state) for name in names
                if os.path.isfile(os.path.join(folder, name))
                and not name.startswith("blank-")]

    wait_until(lambda: files_left() == [], what="no files left behind")


def _fake_bash(folder: Path) -> Path:
    """A `bash` that only says it ran, and with which arguments."""
    folder.mkdir(parents=True, exist_ok=True)
    fake = folder / "bash"
    fake.write_text('#!/bin/sh\necho "fake bash $1"\n')
    fake.chmod(0o755)
    return fake


def test_bash_is_the_first_on_the_childs_path(engine: Engine) -> None:
    # The engine resolves bash itself (one execve instead of one per PATH entry): it
    # must still be the bash a PATH search would find, by the child's PATH (in the
    # call's view: the fake one is in its workspace).
    first = _fake_bash(engine.tmp / "first")
    path = f"{first.parent}:{os.environ['PATH']}"
    assert engine.run("echo hi", env={"PATH": path}).stdout == "fake bash -c\n"
    assert engine.run("echo hi").stdout == "hi\n"


def test_relative_path_entries_are_relative_to_the_cwd(engine: Engine) -> None:
    _fake_bash(engine.tmp / "bin")
    result = engine.run("echo hi", env={"PATH": f"bin:{os.environ['PATH']}"})
    assert result.stdout == "fake bash -c\n"


@pytest.mark.parametrize("how", ["removed", "no longer executable"])
def test_a_bash_that_went_away_is_searched_again(engine: Engine, how: str) -> None:
    first = _fake_bash(engine.tmp / "gone")
    path = f"{first.parent}:{os.environ['PATH']}"
    assert engine.run("echo hi", env={"PATH": path}).stdout == "fake bash -c\n"
    if how == "removed":
        first.unlink()
    else:
        first.chmod(0o644)
    again = engine.run("echo hi", env={"PATH": path})
    assert (again.error, again.stdout) == (None, "hi\n")


def test_concurrent_workspaces_keep_the_umask(tmp_path: Path) -> None:
    """Workspaces made in several threads at once (a call's own beside the throwaway
    pool's refill, or two consumers' calls) leave the worker's umask as it was: every
    directory the worker makes, and the zygote and keepers it starts (so every call's
    files), inherit it. Under 0o177 a keeper makes its view's directories 0600 (the run
    user cannot enter its own workspace: bad_cwd "Permission denied"), and the sandbox's
    probe fails (the worker falls back to no sandbox).

    Each workspace's keeper socket is made by `launcher.listen`, which sets the process
    umask around its bind; here four threads make sockets at once, as four workspaces
    being made would (making whole workspaces shows the same, less often per second)."""
    before = current_umask()

    def make(thread: int) -> None:
        for i in range(50):
            launcher.listen(str(tmp_path / f"{thread}-{i}.sock")).close()

    threads = [threading.Thread(target=make, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    after = current_umask()
    os.umask(before)  # the next tests get the umask they expect
    assert len(list(tmp_path.glob("*.sock"))) == 200, "every socket was made"
    assert oct(after) == oct(before)


PR_SET_CHILD_SUBREAPER = 36


def _set_subreaper(on: bool) -> None:
    """Orphans of our descendants come to us (not to init) while on: the probe's keepers
    that the engine leaves behind can then be told from other sessions' and ended."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _end_adopted_keepers() -> None:
    """Kill and reap the keepers that came to us as orphans (ours: we are their
    subreaper), the workspaces' as well as the probe's."""
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if isolate.runs(child.cmdline(), "launcher"):
                child.kill()
                child.wait(DEADLINE_S)


def test_concurrent_first_calls_are_all_sandboxed(engine: Engine) -> None:
    """The first workspaces of a worker process, made together (a consumer's threads,
    the throwaway pool's refill), all get the host's sandbox: none is made without one
    because the sandbox's probe, run by each of them at once, failed for one of them
    (no silent fallback to no sandbox)."""
    made: list[str] = []
    _set_subreaper(True)
    try:
        sandbox.close_all()
        sandbox._probes.clear()  # nothing probed yet, as in a fresh worker process

        def make() -> None:
            made.append(engine.workspace().isolation)

        threads = [threading.Thread(target=make) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for record in workspaces.local_records(engine.settings):
            workspaces.delete(record.id, engine.settings)
        sandbox.close_all()
        _end_adopted_keepers()
        _set_subreaper(False)
    assert sorted(made) == ["process"] * 6


def test_a_call_in_a_deleted_workspace_says_the_workspace_is_missing(engine: Engine) -> None:
    record = engine.workspace()
    ran = engine.run("true", workspace=record.id, cwd=None)
    assert ran.error is None and ran.exit_code == 0
    workspaces.delete(record.id, engine.settings)
    gone = engine.run("true", workspace=record.id, cwd=None)
    assert gone.error is not None and gone.error.kind == "not_found"
    assert gone.error.missing == "workspace"  # data a session acts on, not its message
    # Any other refusal names nothing missing.
    bad = engine.run("true", cwd="/no/such/dir")
    assert bad.error is not None and bad.error.missing is None
