"""Output fidelity end to end, without Redis: a real command run by the engine under each
dialect's own policy, its result rendered by that dialect as a model would read it.

The dialects that reproduce an existing tool (pipe, modes, pi, claude) get the
sanitizer's fixes and nothing more; native also gets binary detection, visible
invisibles, last frames and the line cap.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from bashfleet.client.dialects import SessionState, ToolText, get_dialect
from bashfleet.client.dialects.claude import ClaudeDialect
from bashfleet.client.dialects.modes import ModesDialect
from bashfleet.client.dialects.native import NativeDialect
from bashfleet.client.dialects.pi import PiDialect
from bashfleet.client.dialects.pipe import PipeDialect
from bashfleet.worker.wire.models import CallResult

from .engine_helpers import (
    Engine,
    _engine_fixture,  # noqa: F401 - fixture
    _janitor_fixture,  # noqa: F401 - fixture
)

DIALECTS = ["pipe", "modes", "pi", "claude", "native"]
SEEDS = ["pipe", "modes", "pi", "claude"]


def run(engine: Engine, name: str, command: str, timeout: float = 30.0) -> tuple[str, CallResult]:
    """Run `command` under dialect `name`'s policy; the text that dialect shows."""
    dialect = get_dialect(name)
    policy = dialect.policy().model_copy(update={"kill_grace_s": 0.5})
    result = engine.run(command, policy=policy, timeout_s=timeout)
    return _render(dialect, command, timeout)(result).text, result


def _render(dialect: object, command: str, timeout: float) -> Callable[[CallResult], ToolText]:
    session = SessionState()
    match dialect:
        case PipeDialect():
            return lambda r: dialect.render_run(r, command, timeout, session)
        case ModesDialect():
            return lambda r: dialect.render(r, "default", command, session)
        case PiDialect():
            return lambda r: dialect.render(r, timeout)
        case ClaudeDialect():
            return lambda r: dialect.render(r, timeout * 1000)
        case NativeDialect():
            return lambda r: dialect.render_run(r, "default", timeout)
    raise AssertionError(f"no renderer for {dialect!r}")


# ------------------------------------------------------------- every dialect: classes 1-3


@pytest.mark.parametrize("name", DIALECTS)
def test_a_lone_c1_introducer_loses_no_text(engine: Engine, name: str) -> None:
    text, _ = run(engine, name, r"printf 'important\302\220data after DCS\n'")
    assert "importantdata after DCS" in text


@pytest.mark.parametrize("name", DIALECTS)
def test_a_link_ended_by_the_c1_terminator_keeps_its_text(engine: Engine, name: str) -> None:
    command = r"printf '\033]8;;https://example.com/\302\234the link\033]8;;\302\234 after\n'"
    text, _ = run(engine, name, command)
    assert "the link after" in text
    assert "example.com" not in text


@pytest.mark.parametrize("name", DIALECTS)
def test_two_byte_escapes_leave_no_final_byte(engine: Engine, name: str) -> None:
    command = r"printf 'hel\033<lo \0337sa\0338ved \033sx\033u \033(Bok\033c\n'"
    text, _ = run(engine, name, command)
    assert "hello saved x ok" in text
    assert "\x1b" not in text


# ------------------------------------------------------------------------ pi: 4 and 5


def test_pi_timeout_notice_comes_first(engine: Engine) -> None:
    text, result = run(engine, "pi", "echo started; sleep 30", timeout=1.0)
    assert result.timed_out
    assert text == "[Command timed out after 1 seconds]\nstarted\n"


def test_pi_byte_cut_starts_at_the_line_its_footer_names(engine: Engine) -> None:
    text, _ = run(engine, "pi", "seq 1 200000")
    found = re.search(r"\n\n\[Showing lines (\d+)-(\d+) of (\d+) \(50\.0KB limit\)", text)
    assert found is not None, text[-300:]
    first, last, total = map(int, found.groups())
    assert (last, total) == (200000, 200000)
    assert text.split("\n", 1)[0] == str(first)


# --------------------------------------------------------- native vs the other dialects

BINARY = r"printf '\177ELF\002\001\001\000\000\000\000'; head -c 3000 /dev/urandom"


def test_native_reports_binary_output(engine: Engine) -> None:
    text, result = run(engine, "native", BINARY)
    assert result.spill is not None and result.spill.stdout_path is not None
    path = re.escape(result.spill.stdout_path)
    assert re.search(rf"stdout:\n\[binary output: 3011 bytes, saved to {path} on host test\]",
                     text), text


@pytest.mark.parametrize("name", SEEDS)
def test_the_seeds_show_binary_output_as_text(engine: Engine, name: str) -> None:
    _, result = run(engine, name, BINARY)
    assert result.stdout.startswith("ELF")
    info = result.stdout_truncation
    assert info is not None and not info.binary


# Trojan Source: RLO and LRI/PDI make the comment read as if it closed the string.
TROJAN = (
    r"printf 'if (role != \"user\342\200\256 \342\201\246// admin\342\201\251 "
    r"\342\201\246\") {\n'"
)


def test_native_reveals_bidirectional_controls(engine: Engine) -> None:
    text, _ = run(engine, "native", TROJAN)
    assert 'if (role != "user<U+202E> <U+2066>// admin<U+2069> <U+2066>") {' in text


@pytest.mark.parametrize("name", SEEDS)
def test_the_seeds_keep_bidirectional_controls(engine: Engine, name: str) -> None:
    _, result = run(engine, name, TROJAN)
    assert "\u202e" in result.stdout


PROGRESS = r"printf 'fetch 10%%\rfetch 50%%\rfetch 100%%\ndone\n'"


def test_native_shows_a_progress_bars_last_frame(engine: Engine) -> None:
    text, _ = run(engine, "native", PROGRESS)
    assert "stdout:\nfetch 100%\ndone" in text


@pytest.mark.parametrize("name", SEEDS)
def test_the_seeds_keep_every_frame(engine: Engine, name: str) -> None:
    _, result = run(engine, name, PROGRESS)
    assert "fetch 10%\rfetch 50%\rfetch 100%\n" in result.stdout


MINIFIED = "python3 -c \"print('x' * 30000); print('the end')\""


def test_native_cuts_a_minified_line(engine: Engine) -> None:
    text, result = run(engine, "native", MINIFIED)
    assert "x" * 2000 + "… [28,000 more characters]\nthe end" in text
    assert "1 line cut to 2,000 characters" in text
    assert result.spill is not None  # the cut characters are kept


@pytest.mark.parametrize("name", SEEDS)
def test_the_seeds_keep_long_lines(engine: Engine, name: str) -> None:
    _, result = run(engine, name, MINIFIED)
    assert "x" * 29000 in result.stdout or "x" * 29000 in result.stdout.replace("\n", "")
