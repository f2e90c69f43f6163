"""bashfleet.worker.engine.session_state: the EXIT trap bash sources through BASH_ENV, and the diff
of the final environment."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bashfleet.worker.engine.environment import MARKER_VAR
from bashfleet.worker.engine.session_state import parse_state
from bashfleet.worker.engine.startup import Startup, startup_script

START = {"PATH": "/usr/bin", "HOME": "/root", "KEEP": "1", MARKER_VAR: "c1"}


def _state(cwd: str, env: dict[str, str]) -> bytes:
    return (cwd + "\0" + "".join(f"{k}={v}\0" for k, v in env.items())).encode()


@pytest.mark.parametrize(
    ("final", "changes", "removed"),
    [
        (dict(START), {}, ()),
        ({**START, "FOO": "bar"}, {"FOO": "bar"}, ()),
        ({**START, "KEEP": "2"}, {"KEEP": "2"}, ()),
        ({k: v for k, v in START.items() if k != "HOME"}, {}, ("HOME",)),
        # Values with '=' and newlines survive the NUL-separated format.
        ({**START, "EQ": "a=b\nc"}, {"EQ": "a=b\nc"}, ()),
        # Variables bash maintains itself are never carried.
        ({**START, "SHLVL": "2", "_": "/usr/bin/env", "OLDPWD": "/"}, {}, ()),
    ],
)
def test_parse_state_diffs_against_the_start(
    final: dict[str, str], changes: dict[str, str], removed: tuple[str, ...]
) -> None:
    state = parse_state(_state("/work", final), START)
    assert state is not None
    assert state.cwd == "/work"
    assert state.changes == changes
    assert state.removed == removed


def test_the_marker_is_never_carried_the_hardening_like_any_variable() -> None:
    """`unset PAGER` once did not stick (the diff skipped the hardening)."""
    start = {**START, "PAGER": "cat", "GIT_PAGER": "cat"}
    final = {k: v for k, v in start.items() if k not in (MARKER_VAR, "PAGER")}
    state = parse_state(_state("/", final | {"GIT_PAGER": "less"}), start)
    assert state is not None
    assert state.changes == {"GIT_PAGER": "less"} and state.removed == ("PAGER",)
    unchanged = parse_state(_state("/", start), start)
    assert unchanged is not None and unchanged.changes == {} and unchanged.removed == ()


def test_empty_state_is_unusable() -> None:
    assert parse_state(b"", START) is None


def _run(
    tmp_path: Path, command: str
) -> tuple[subprocess.CompletedProcess[str], Startup]:
    state = Startup("", capture=True)
    env = {"PATH": os.environ["PATH"], "BASH_ENV": state.bash_env, "KEEP": "1"}
    done = subprocess.run(["bash", "-c", command], env=env, cwd=tmp_path, text=True,
                          capture_output=True, check=False, pass_fds=[state.fd])
    return done, state


def test_a_command_that_replaces_its_shell_records_nothing(tmp_path: Path) -> None:
    done, state = _run(tmp_path, "exec true")
    assert done.returncode == 0 and state.recorded() == b""
    assert Startup("", capture=False).recorded() is None
    state.close()


def test_the_script_writes_to_the_descriptor_only() -> None:
    script = startup_script("ulimit -f 8\n", 200)
    assert script.startswith("unset BASH_ENV\nulimit -f 8\n")
    assert script.count(">&200") == 2 and ".state" not in script

def test_bash_sources_the_trap_and_records_the_final_state(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    done, state = _run(tmp_path, "cd sub; export NEW=2; unset KEEP; exit 3")
    assert done.returncode == 3  # the command's own status
    started = {"PATH": os.environ["PATH"], "KEEP": "1", "BASH_ENV": state.bash_env}
    final = parse_state(state.recorded() or b"", started)
    assert final is not None
    assert (final.cwd, final.changes, final.removed) == (str(tmp_path / "sub"), {"NEW": "2"},
                                                         ("KEEP",))


def test_the_command_line_is_the_callers_and_nested_bash_does_not_source_it(
    tmp_path: Path,
) -> None:
    """A process list shows the command, not the capture; a script the command runs does
    not inherit BASH_ENV (so it neither re-arms the trap nor overwrites the state when
    it exits)."""
    done, state = _run(
        tmp_path,
        'tr "\\0" " " < /proc/$$/cmdline; echo; echo "${BASH_ENV-none}"; '
        'bash -c \'echo "${BASH_ENV-none}"; cd /\'; true',
    )
    cmdline, outer, inner = done.stdout.splitlines()
    assert cmdline.startswith("bash -c tr ") and "trap" not in cmdline
    assert (outer, inner) == ("none", "none")
    final = parse_state(state.recorded() or b"", {})
    assert final is not None and final.cwd == str(tmp_path)  # the nested `cd /` is not ours


@given(
    st.dictionaries(
        st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True),
        st.text(alphabet=st.characters(exclude_characters="\0", exclude_categories=["Cs"])),
        max_size=8,
    )
)
def test_any_exported_change_round_trips(extra: dict[str, str]) -> None:
    final = {**START, **extra}
    state = parse_state(_state("/", final), START)
    assert state is not None
    expected = {
        k: v for k, v in extra.items()
        if START.get(k) != v
        and k not in {"SHLVL", "PWD", "OLDPWD", "_", "BASH_ENV", MARKER_VAR}
    }
    assert state.changes == expected


