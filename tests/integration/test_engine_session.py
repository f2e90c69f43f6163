"""Shell state carried between stateless calls (`Call.capture_state`), with real bash."""

from __future__ import annotations

from pathlib import Path

from .engine_helpers import (
    Engine,
    _engine_fixture,  # noqa: F401 - fixture
    _janitor_fixture,  # noqa: F401 - fixture
)


def test_exported_variables_and_cwd_carry_to_the_next_call(engine: Engine, tmp_path: Path) -> None:
    sub = tmp_path / "sub"
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


def test_exec_records_nothing_and_leaves_no_state_file(engine: Engine) -> None:
    result = engine.run("export LOST=1; exec true", capture_state=True)
    assert result.exit_code == 0
    assert result.cwd_after is None and result.env_changes == {}
    assert not any(p.suffix == ".state" for p in engine.settings.spill_dir.iterdir())


def test_without_capture_the_command_runs_unwrapped(engine: Engine) -> None:
    result = engine.run("trap -p EXIT; export X=1")
    assert result.stdout == ""
    assert result.cwd_after is None and result.env_changes == {}
