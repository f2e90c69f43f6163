"""Shell state carried between stateless calls (`Call.capture_state`), with real bash."""

from __future__ import annotations

import os
from pathlib import Path

from .engine_helpers import (
    Engine,
    Watch,
    _engine_fixture,  # noqa: F401 - fixture
    _janitor_fixture,  # noqa: F401 - fixture
    wait_until,
)


def test_exported_variables_and_cwd_carry_to_the_next_call(engine: Engine) -> None:
    # In the call's workspace: the directories a call can enter.
    sub = engine.tmp / "sub"
    sub.mkdir()
    first = engine.run(f"export GREETING='hello there'; unset HOME; cd {sub}; exit 3",
                       capture_state=True)
    assert first.exit_code == 3  # the trap keeps the command's status
    assert first.cwd_after == str(sub)
    assert first.env_changes == {"GREETING": "hello there"}
    assert first.env_removed == ("HOME",)

    second = engine.run(
        'echo "$GREETING|${HOME:-unset}|$PWD"', cwd=first.cwd_after, env=first.env_changes,
        unset_env=first.env_removed, capture_state=True,
    )
    assert second.stdout == f"hello there|unset|{sub}\n"
    assert second.env_changes == {} and second.env_removed == ()


def test_the_command_line_is_the_command(engine: Engine) -> None:
    """The capture comes in through BASH_ENV, not the command line, so a process list
    (and `procs.describe` after a timeout) shows the command itself."""
    result = engine.run("tr '\\0' ' ' < /proc/$$/cmdline; echo; echo ${BASH_ENV-none}",
                        capture_state=True)
    cmdline, bash_env = result.stdout.splitlines()
    assert cmdline == "bash -c tr '\\0' ' ' < /proc/$$/cmdline; echo; echo ${BASH_ENV-none} "
    assert bash_env == "none"
    assert result.env_changes == {} and result.env_removed == ()


def test_a_call_that_does_not_cd_ends_where_it_started_symlinks_included(
    engine: Engine,
) -> None:
    """$PWD starts as the cwd asked for, so a call without `cd` reports no move (a session
    then keeps a concurrent call's `cd`), also in a directory reached through a symlink
    (both in one project directory under the allowed root: the call's workspace)."""
    project = engine.tmp / "project"
    real = project / "real"
    real.mkdir(parents=True)
    link = project / "link"
    link.symlink_to(real)
    result = engine.run("echo $PWD", cwd=str(link), capture_state=True)
    assert result.stdout == f"{link}\n"
    assert result.cwd == result.cwd_after == str(link)


def _state_files(engine: Engine) -> list[Path]:
    """State capture files anywhere the engine or its calls write: its state directory,
    the workspaces' directories and output directories (the capture goes through a
    descriptor, so there should be none)."""
    root = engine.settings.state_dir.parent
    # os.walk, unlike rglob, skips what a throwaway workspace's removal takes meanwhile.
    return [Path(folder, name) for folder, _dirs, names in os.walk(root)
            for name in names if name.endswith(".state")]


def test_exec_records_nothing_and_leaves_no_state_file(engine: Engine) -> None:
    result = engine.run("export LOST=1; exec true", capture_state=True)
    assert result.exit_code == 0
    assert result.cwd_after is None and result.env_changes == {}
    assert _state_files(engine) == []


def test_without_capture_the_command_runs_unwrapped(engine: Engine) -> None:
    result = engine.run("trap -p EXIT; export X=1")
    assert result.stdout == ""
    assert result.cwd_after is None and result.env_changes == {}


def test_a_killed_call_leaves_no_state_file(engine: Engine) -> None:
    result = engine.run("export X=1; sleep 30", capture_state=True, timeout_s=0.3)
    assert result.timed_out and result.cwd_after is None
    assert _state_files(engine) == []


def test_a_running_call_detaches_into_a_job(engine: Engine) -> None:
    """A detach (a caller's second Ctrl-C) leaves the call running as a job, output and
    all."""

    class DetachOnceRunning(Watch):
        def running(self) -> None:
            self.detach.set()

    result = engine.run(
        "echo before; sleep 0.5; echo after; sleep 30", watcher=DetachOnceRunning(),
        timeout_s=60,
    )
    assert result.backgrounded and result.job is not None
    assert result.timed_out is False and result.exit_code is None
    assert result.stdout == "before\n"
    log = Path(result.job.output_path)
    wait_until(lambda: "after" in log.read_text(), what="the job to go on writing")
