"""`attach` without a fleet: the detach key as a person writes it (`^x`, `ctrl-x`), the
terminal filter on UTF-8 output, and the interleavings of keys and reads around an
attach (a new terminal shows the current line whole, its first key's echo kept)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bashfleet.client.attach import (
    DETACH_KEY,
    REPLAY_BYTES,
    TerminalFilter,
    current_line,
    key_name,
    parse_detach_key,
)
from bashfleet.worker.wire.models import OutputChunk

# ------------------------------------------------------------------- the detach key


@pytest.mark.parametrize(
    ("text", "key"),
    [
        # The newcomer's `^x`: Ctrl-X, not the two keys `^` then `x`.
        ("^x", b"\x18"), ("^X", b"\x18"), ("^]", b"\x1d"), ("^@", b"\x00"), ("^[", b"\x1b"),
        ("^\\", b"\x1c"), ("^^", b"\x1e"), ("^_", b"\x1f"), ("^?", b"\x7f"), ("^a", b"\x01"),
        ("ctrl-x", b"\x18"), ("Ctrl-X", b"\x18"), ("CTRL+]", b"\x1d"), ("C-x", b"\x18"),
        ("c-q", b"\x11"), ("ctrl-@", b"\x00"),
        # A Python escape (the old format) and one plain character.
        ("\\x1d", b"\x1d"), ("\\x18", b"\x18"), ("~", b"~"), ("q", b"q"),
    ],
)
def test_detach_key_forms(text: str, key: bytes) -> None:
    assert parse_detach_key(text) == key


@pytest.mark.parametrize("text", ["", "xy", "^1", "ctrl-", "ctrl-xy", "é", "\\xff", "^é"])
def test_a_detach_key_that_is_not_one_key_is_refused_with_the_format(text: str) -> None:
    with pytest.raises(ValueError, match=r"\^X or ctrl-X"):
        parse_detach_key(text)


@pytest.mark.parametrize(
    ("key", "name"),
    [(b"\x1d", "Ctrl-]"), (b"\x18", "Ctrl-X"), (b"\x00", "Ctrl-@"), (b"\x7f", "DEL"),
     (b"~", "'~'")],
)
def test_the_banner_names_the_key_as_it_is_typed(key: bytes, name: str) -> None:
    assert key_name(key) == name


def test_the_default_is_ctrl_close_bracket() -> None:
    assert parse_detach_key("^]") == DETACH_KEY
    assert key_name(DETACH_KEY) == "Ctrl-]"


@given(st.sampled_from("@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_"))
def test_caret_and_ctrl_forms_agree_and_name_themselves(char: str) -> None:
    key = parse_detach_key(f"^{char}")
    assert parse_detach_key(f"ctrl-{char.lower()}") == key
    assert key_name(key) == f"Ctrl-{char}"
    assert parse_detach_key(key_name(key).replace("Ctrl-", "^")) == key


# --------------------------------------------------------- the filter on UTF-8 bytes


@pytest.mark.parametrize(
    "text",
    # Each holds a byte 0x90, 0x98 or 0x9D-0x9F inside a character: an 8-bit control
    # introducer if the stream were Latin-1, an ordinary continuation byte in UTF-8.
    ["❯ import sys\r\n", "✝ ok\r\n", "ϐ ϙ ϝ ϟ\r\n", "…\u2029 end\r\n", "日本語\r\n"],
)
def test_utf8_characters_are_never_taken_for_c1_controls(text: str) -> None:
    data = text.encode()
    for cut in range(len(data) + 1):
        feed = TerminalFilter()
        assert feed.feed(data[:cut]) + feed.feed(data[cut:]) == data, cut


def test_c1_controls_written_as_utf8_are_removed() -> None:
    osc = "\u009d0;title\u009c".encode()
    stream = b"a" + osc + b"b"
    for cut in range(len(stream) + 1):
        feed = TerminalFilter()
        assert feed.feed(stream[:cut]) + feed.feed(stream[cut:]) == b"ab", cut


# ---------------------------------------------------------------- the current line


class FileFleet:
    """`read_output` of one job's output file, as the host slices it (whole lines when
    the file goes on past the slice)."""

    def __init__(self, data: str) -> None:
        self.data = data
        self.asked: list[tuple[int, int]] = []

    def read_output(self, id: str, *, offset: int = 0, limit: int = 65536) -> OutputChunk:
        self.asked.append((offset, limit))
        size = len(self.data)
        text = self.data[offset: offset + limit]
        if offset + len(text) < size and "\n" in text:
            text = text[: text.rfind("\n") + 1]
        return OutputChunk(path="/j.log", offset=offset, next_offset=offset + len(text),
                           size=size, text=text, eof=offset + len(text) >= size)


@pytest.mark.parametrize(
    ("data", "end", "line"),
    [
        # An idle prompt, and the key a dead terminal's read took of the line.
        ("banner\n>>> ", 11, ">>> "),
        ("banner\n>>> i", 12, ">>> i"),
        # Output came after `end`: the slice stops at a whole line, nothing is replayed.
        ("banner\n>>> i\nmore\n", 12, ""),
        ("", 0, ""),
        ("no newline yet", 14, "no newline yet"),
        ("x" * 5000, 5000, ""),  # the window does not reach the line's start
    ],
)
def test_current_line(data: str, end: int, line: str) -> None:
    assert current_line(cast("Any", FileFleet(data)), "j1", end) == line


def test_current_line_reads_at_most_the_replay_window() -> None:
    fleet = FileFleet("a\n" * 10_000 + ">>> ")
    end = len(fleet.data)
    assert current_line(cast("Any", fleet), "j1", end) == ">>> "
    assert fleet.asked == [(end - REPLAY_BYTES, REPLAY_BYTES)]
