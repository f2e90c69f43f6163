"""Output fidelity in the engine's shaping: the native extras on small and huge outputs,
pi's byte tail through a file, and slices that never end inside an escape sequence."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bashfleet.worker.engine.output import truncate
from bashfleet.worker.engine.output.capture import (
    PLAIN,
    WHOLE_READ_LIMIT,
    Extras,
    MemoryStream,
    escape_boundary,
    read_slice,
    shape,
)
from bashfleet.worker.engine.output.sanitize import cut_marker, sanitize
from bashfleet.worker.wire.models import ByteTail, CharCap, Middle, Policy, TailLines, Truncation

NATIVE = Extras(detect_binary=True, reveal_invisible=True, last_frame=True, max_line_chars=20)
POLICIES: list[Truncation] = [TailLines(), ByteTail(), CharCap(), Middle()]


def _lines(raw: bytes) -> int:
    return raw.count(b"\n") + (1 if raw and not raw.endswith(b"\n") else 0)


def _file(tmp_path: Path, raw: bytes) -> Path:
    path = tmp_path / "out.log"
    path.write_bytes(raw)
    return path


def test_extras_of_a_policy() -> None:
    assert Extras.of(Policy()) == PLAIN
    policy = Policy(detect_binary=True, reveal_invisible=True, last_frame=True, max_line_chars=9)
    assert Extras.of(policy) == Extras(True, True, True, 9)


# --------------------------------------------------------------------------- binary


@pytest.mark.parametrize("policy", POLICIES, ids=repr)
@pytest.mark.parametrize(
    "raw",
    [b"\x7fELF\x02\x01\x01\x00\x00" + bytes(range(256)) * 3, b"PK\x03\x04" + b"\x00" * 40 + b"\n"],
)
def test_binary_output_shows_nothing_and_counts_everything(
    tmp_path: Path, raw: bytes, policy: Truncation
) -> None:
    shaped = shape(_file(tmp_path, raw), len(raw), _lines(raw), policy, None, extras=NATIVE)
    info = shaped.info
    assert shaped.text == ""
    assert info.binary and info.truncated
    assert (info.total_bytes, info.total_lines) == (len(raw), _lines(raw))
    assert (info.shown_bytes, info.shown_lines, info.shown_ranges) == (0, 0, ())
    # Without the extra, the same bytes are cleaned-up text (pipe, modes, pi, claude's view).
    plain = shape(_file(tmp_path, raw), len(raw), _lines(raw), policy, None)
    assert not plain.info.binary and plain.text


def test_binary_detection_of_a_huge_output_reads_only_its_start(tmp_path: Path) -> None:
    raw = b"\x00\x01\x02" + b"y\n" * (WHOLE_READ_LIMIT // 2 + 10)
    shaped = shape(_file(tmp_path, raw), len(raw), 4242, TailLines(), None, extras=NATIVE)
    assert shaped.info.binary
    assert (shaped.info.total_lines, shaped.info.total_bytes) == (4242, len(raw))


def test_binary_detection_in_memory(tmp_path: Path) -> None:
    stream = MemoryStream()
    stream.append(b"\x00\xff\xfe" * 100)
    shaped = shape(stream, stream.total, stream.lines, TailLines(), None, extras=NATIVE)
    assert shaped.info.binary and shaped.text == ""


@pytest.mark.parametrize(
    "raw",
    [b"plain text\n", "héllo ✓\n".encode(), b"\x1b[31mred\x1b[0m\r\n" * 30, b"x\xffy\n" * 50],
)
def test_text_is_not_binary(tmp_path: Path, raw: bytes) -> None:
    shaped = shape(_file(tmp_path, raw), len(raw), _lines(raw), TailLines(), None, extras=NATIVE)
    assert not shaped.info.binary
    assert shaped.text


# ---------------------------------------------------------------------- long lines


def test_long_lines_are_cut_and_the_shown_ones_counted(tmp_path: Path) -> None:
    raw = b"a" * 50 + b"\nshort\n" + b"b" * 21 + b"\n" + b"c" * 20 + b"\n"
    shaped = shape(_file(tmp_path, raw), len(raw), 4, TailLines(), None, extras=NATIVE)
    assert shaped.text == (
        "a" * 20 + cut_marker(30) + "\nshort\n" + "b" * 20 + cut_marker(1) + "\n" + "c" * 20 + "\n"
    )
    info = shaped.info
    assert info.long_lines_cut == 2
    assert info.truncated  # characters were left out: the spill file is kept
    assert (info.total_lines, info.shown_lines, info.total_bytes) == (4, 4, len(raw))
    assert info.shown_bytes == truncate.utf8_len(shaped.text)


def test_only_shown_long_lines_are_counted(tmp_path: Path) -> None:
    raw = b"x" * 100 + b"\n" + b"line\n" * 10
    shaped = shape(
        _file(tmp_path, raw), len(raw), 11, TailLines(max_lines=5), None, extras=NATIVE
    )
    assert shaped.text == "line\n" * 5
    assert shaped.info.long_lines_cut == 0
    assert shaped.info.limit == "lines"


def test_one_minified_line_cannot_fill_the_budget(tmp_path: Path) -> None:
    # A 3 MB line before the real output: the tail still shows the lines after it.
    raw = b"var a=1;" * 400_000 + b"\nerror: at line 2\ndone\n"
    extras = Extras(max_line_chars=2000)
    shaped = shape(_file(tmp_path, raw), len(raw), 3, TailLines(), None, extras=extras)
    assert shaped.text.endswith("error: at line 2\ndone\n")
    assert shaped.info.total_lines == 3


@pytest.mark.parametrize("policy", [TailLines(max_lines=3), CharCap(max_chars=60)], ids=repr)
def test_long_lines_in_a_huge_output(tmp_path: Path, policy: Truncation) -> None:
    line = b"z" * 30 + b"\n"
    raw = line * (WHOLE_READ_LIMIT // len(line) + 100)
    shaped = shape(_file(tmp_path, raw), len(raw), _lines(raw), policy, None, extras=NATIVE)
    assert shaped.info.long_lines_cut == truncate.count_lines(shaped.text)
    assert shaped.text.startswith("z" * 20 + cut_marker(10))


def test_long_lines_in_a_huge_middle_cut(tmp_path: Path) -> None:
    line = b"m" * 30 + b"\n"
    raw = line * (WHOLE_READ_LIMIT // len(line) + 100)
    policy = Middle(max_bytes=1000, keep_bytes=200)
    shaped = shape(_file(tmp_path, raw), len(raw), _lines(raw), policy, None, extras=NATIVE)
    head, _, tail = shaped.text.partition(truncate.SNIP)
    shown = truncate.count_lines(head) + truncate.count_lines(tail)
    assert shaped.info.long_lines_cut == shown


# --------------------------------------------------------------- invisible, frames


def test_invisibles_and_frames_through_shape(tmp_path: Path) -> None:
    raw = "admin\u202e \u2066x\u2069\n".encode() + b"10%\r50%\r100%\r\ndone\n"
    extras = Extras(reveal_invisible=True, last_frame=True)
    shaped = shape(_file(tmp_path, raw), len(raw), 3, TailLines(), None, extras=extras)
    assert shaped.text == "admin<U+202E> <U+2066>x<U+2069>\n100%\ndone\n"
    assert shaped.info.total_lines == 3
    plain = shape(_file(tmp_path, raw), len(raw), 3, TailLines(), None)
    assert plain.text == "admin\u202e \u2066x\u2069\n10%\r50%\r100%\ndone\n"


# ------------------------------------------------------------------- pi's byte tail


def test_a_huge_byte_tail_starts_at_the_line_its_notice_names(tmp_path: Path) -> None:
    # `seq 1 200000` under pi's 50 KB tail: the shown text must start at a whole line.
    raw = b"".join(b"%d\n" % n for n in range(1, 200_001))
    path = _file(tmp_path, raw)
    shaped = shape(path, len(raw), 200_000, ByteTail(max_bytes=51_200), None)
    info = shaped.info
    (first, last), = info.shown_ranges
    assert (last, info.total_lines) == (200_000, 200_000)
    assert shaped.text.split("\n", 1)[0] == str(first) == "192687"
    assert not info.partial_line
    assert info.limit == "bytes"
    assert info.shown_bytes <= 51_200


# ------------------------------------------------------- slices and escape sequences


@pytest.mark.parametrize(
    ("data", "boundary"),
    [
        (b"plain text", 10),
        (b"text\x1b[31", 4),
        (b"text\x1b[", 4),
        (b"text\x1b", 4),
        (b"text\x1b]8;;http://x", 4),
        (b"text\xc2\x9d8;;http://x", 4),
        (b"text\x1bPtmux;\x1b\x1b]52", 4),
        (b"text\x1b(", 4),
        (b"text\x1b5", 4),
        (b"\x1b]8;;only a sequence", 20),  # a reader always moves on
        (b"text\x1b[31mred", 12),  # complete sequences stay
        (b"text\x1b]0;t\x07more", 14),
        (b"text\x1bc", 6),
        (b"text\x1bP1$r\x07still in the DCS", 4),  # BEL does not end a DCS
    ],
)
def test_escape_boundary(data: bytes, boundary: int) -> None:
    assert escape_boundary(data) == boundary


def test_a_slice_never_ends_inside_an_escape(tmp_path: Path) -> None:
    raw = b"abc\x1b]8;;https://example.com\x07link\x1b]8;;\x07 and more text"
    path = _file(tmp_path, raw)
    text, end, _ = read_slice(path, 0, 10, None)
    assert (text, end) == ("abc", 3)
    text, end, _ = read_slice(path, end, 40, None)
    assert (text, end) == ("link and ", 43)


_piece = st.one_of(
    st.text(alphabet=st.sampled_from("ab é✓"), min_size=1, max_size=8),
    st.sampled_from(
        ["\x1b[31m", "\x1b[0m", "\x1b]8;;http://x.y/\x07", "\x1b]0;title\x1b\\", "\x1b(B",
         "\x1b7", "\x1bPq#0\x1b\\", "\x9b1m", "\x1b]8;;u\x9c", "\x1b5n", "\n"]
    ),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_piece, max_size=40), st.integers(24, 80))
def test_consecutive_slices_read_as_the_whole(pieces: list[str], limit: int) -> None:
    raw = "".join(pieces).encode()
    with tempfile.TemporaryDirectory() as tmp:
        path = _file(Path(tmp), raw)
        offset, parts = 0, []
        while offset < len(raw):
            text, offset, _ = read_slice(path, offset, limit, None)
            parts.append(text)
    assert "".join(parts) == sanitize(raw)
