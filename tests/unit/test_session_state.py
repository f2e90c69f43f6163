"""worker.engine.session_state: the EXIT-trap wrapper and the diff of the final environment."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.engine.environment import MARKER_VAR
from worker.engine.session_state import parse_state, wrap_command

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


def test_marker_and_hardening_are_never_carried() -> None:
    final = {k: v for k, v in START.items() if k != MARKER_VAR} | {"PAGER": "less"}
    state = parse_state(_state("/", final), START)
    assert state is not None
    assert state.changes == {} and state.removed == ()


def test_empty_state_is_unusable() -> None:
    assert parse_state(b"", START) is None


def test_wrap_keeps_the_command_on_its_own_line_and_quotes_the_path() -> None:
    wrapped = wrap_command("echo 'hi'", "/tmp/a b/state")
    first, second = wrapped.split("\n", 1)
    assert first.startswith("trap ") and first.endswith(" EXIT")
    assert "'\"'\"'" in first or "a b" in first  # the spaced path is quoted
    assert second == "echo 'hi'"


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
        if START.get(k) != v and k not in {"SHLVL", "PWD", "OLDPWD", "_", MARKER_VAR}
        and k not in {"PAGER", "GIT_PAGER", "MANPAGER", "GIT_EDITOR", "EDITOR", "VISUAL",
                      "GIT_TERMINAL_PROMPT", "CI", "DEBIAN_FRONTEND", "TERM", "NO_COLOR",
                      "PYTHONUNBUFFERED", "PIP_NO_INPUT"}
    }
    assert state.changes == expected


def test_wrap_into_an_open_fd() -> None:
    # The engine's way: the worker opens the state file and passes it in as this fd.
    wrapped = wrap_command("cd /tmp", fd=200)
    trap_line, command = wrapped.split("\n")
    assert command == "cd /tmp"
    assert trap_line.count(">&200") == 2 and "state" not in trap_line
