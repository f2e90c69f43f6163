"""bashfleet.worker.engine.output.truncate:
cuts by policy with exact counts, and the pi dialect's head / tail line limits."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bashfleet.worker.engine.output import truncate
from bashfleet.worker.engine.output.truncate import (
    SNIP,
    apply,
    byte_tail,
    char_cap,
    count_lines,
    error_digest,
    head_lines,
    last_lines,
    line_range,
    middle,
    shown_limit,
    tail_lines,
    utf8_head,
    utf8_len,
    utf8_tail,
    wanted_lines,
)
from bashfleet.worker.wire.models import (
    ByteTail,
    CharCap,
    Middle,
    TailLines,
    Truncation,
    TruncationInfo,
)

KB = 1024


def _lines_ref(text: str) -> list[str]:
    """Reference split: lines ended by LF, a last unterminated line included."""
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text)


# ----------------------------------------------------------------------- counting


@pytest.mark.parametrize(
    ("text", "lines"),
    [
        ("", 0),
        ("a", 1),
        ("a\n", 1),
        ("\n", 1),
        ("\n\n", 2),
        ("a\nb", 2),
        ("a\nb\n", 2),
        ("a\rb\r", 1),  # CR is not a line break
        ("a\u2028b", 1),
    ],
)
def test_count_lines(text: str, lines: int) -> None:
    assert count_lines(text) == lines


@pytest.mark.parametrize(
    ("text", "size"), [("", 0), ("abc", 3), ("é", 2), ("✓", 3), ("😀", 4), ("\ud800", 3)]
)
def test_utf8_len(text: str, size: int) -> None:
    assert utf8_len(text) == size


@pytest.mark.parametrize(
    ("text", "limit", "tail", "head"),
    [
        ("abcdef", 3, "def", "abc"),
        ("abc", 10, "abc", "abc"),
        ("abc", 0, "", ""),
        ("a✓b", 4, "✓b", "a✓"),
        ("a✓b", 3, "b", "a"),  # the 3-byte ✓ does not fit with a neighbour
        ("a✓b", 2, "b", "a"),
        ("😀😀", 5, "😀", "😀"),
        ("😀😀", 3, "", ""),
        ("ééé", 5, "éé", "éé"),
        ("\ud800abc", 4, "abc", "\ud800a"),  # lone surrogates encode as 3 bytes
    ],
)
def test_utf8_tail_and_head(text: str, limit: int, tail: str, head: str) -> None:
    assert utf8_tail(text, limit) == tail
    assert utf8_head(text, limit) == head


# ------------------------------------ the pipe dialect's tail: 2000 lines / 50 KB


def test_seed000_3000_short_lines_hit_the_line_limit() -> None:
    text = "".join(f"line {i}\n" for i in range(1, 3001))
    assert utf8_len(text) < 50 * KB
    cut = apply(text, TailLines())
    info = cut.info
    assert cut.text == "".join(f"line {i}\n" for i in range(1001, 3001))
    assert info.truncated
    assert info.limit == "lines"
    assert info.direction == "tail"
    assert (info.total_lines, info.shown_lines) == (3000, 2000)
    assert info.total_bytes == utf8_len(text)
    assert info.shown_bytes == utf8_len(cut.text)
    assert info.shown_ranges == ((1001, 3000),)
    assert not info.partial_line


def test_seed000_single_60kb_line_shows_the_tail_of_the_line() -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(60 * KB)) + "\n"
    cut = apply(text, TailLines())
    info = cut.info
    assert info.truncated
    assert info.limit == "bytes"
    assert info.partial_line
    assert cut.text == text[-51200:]
    assert info.shown_bytes == 51200
    assert (info.total_lines, info.shown_lines) == (1, 1)
    assert info.total_bytes == 60 * KB + 1
    assert info.shown_ranges == ((1, 1),)


def test_seed000_byte_limit_keeps_whole_lines() -> None:
    line = "x" * 99 + "\n"  # 100 bytes
    text = line * 1000  # 100 KB, 1000 lines: bytes hit first
    cut = apply(text, TailLines())
    info = cut.info
    assert info.limit == "bytes"
    assert info.shown_lines == 512  # 512 * 100 = 51,200 bytes exactly
    assert info.shown_bytes == 51200
    assert cut.text == line * 512
    assert info.shown_ranges == ((489, 1000),)
    assert not info.partial_line


def test_seed000_whole_output_is_unchanged() -> None:
    text = "a\nb\nc"
    cut = apply(text, TailLines())
    assert cut.text == text
    assert cut.info == TruncationInfo(
        direction="tail",
        truncated=False,
        limit=None,
        total_lines=3,
        total_bytes=5,
        shown_lines=3,
        shown_bytes=5,
        shown_ranges=((1, 3),),
    )


def test_tail_lines_exactly_at_limits_is_whole() -> None:
    text = "ab\n" * 4
    assert not tail_lines(text, 4, 12).info.truncated
    assert tail_lines(text, 3, 12).info.limit == "lines"
    assert tail_lines(text, 4, 11).info.limit == "bytes"


def test_tail_lines_empty_and_blank() -> None:
    assert tail_lines("", 1, 1).text == ""
    assert tail_lines("", 1, 1).info.shown_ranges == ()
    cut = tail_lines("\n\n\n", 2, 100)
    assert cut.text == "\n\n"
    assert cut.info.shown_ranges == ((2, 3),)


def test_tail_lines_without_trailing_newline() -> None:
    cut = tail_lines("one\ntwo\nthree", 2, 100)
    assert cut.text == "two\nthree"
    assert cut.info.shown_ranges == ((2, 3),)


def test_tail_lines_never_splits_a_character() -> None:
    text = "✓" * 10  # 30 bytes, one line
    cut = tail_lines(text, 10, 10)
    assert cut.text == "✓" * 3
    assert cut.info.shown_bytes == 9
    assert cut.info.partial_line


# --------------------------------------------------- the pi dialect's byte tail


def test_byte_tail_starts_at_the_next_whole_line() -> None:
    # The last 8 bytes start inside "hello": the shown text starts at the next line, so
    # its first line is the one the notice names (as pi's truncateTail).
    cut = byte_tail("hello\nworld\n", 8)
    assert cut.text == "world\n"
    assert not cut.info.partial_line
    assert cut.info.limit == "bytes"
    assert cut.info.shown_ranges == ((2, 2),)


def test_byte_tail_shows_part_of_a_last_line_larger_than_the_limit() -> None:
    cut = byte_tail("hello\nworld\n", 4)
    assert cut.text == "rld\n"
    assert cut.info.partial_line
    assert cut.info.shown_ranges == ((2, 2),)
    cut = byte_tail("hello\nworld", 3)
    assert (cut.text, cut.info.partial_line) == ("rld", True)


def test_byte_tail_at_a_line_start_is_not_partial() -> None:
    cut = byte_tail("hello\nworld\n", 6)
    assert cut.text == "world\n"
    assert not cut.info.partial_line
    assert cut.info.shown_ranges == ((2, 2),)


def test_byte_tail_utf8_safe_at_50kb() -> None:
    text = "é" * (30 * KB)  # 60 KB
    cut = apply(text, ByteTail())
    assert cut.text == "é" * (25 * KB)
    assert cut.info.shown_bytes == 50 * KB


# --------------------------------------------------- the claude dialect's 30,000 chars


def test_char_cap_30000_characters() -> None:
    text = ("é" * 99 + "\n") * 400  # 40,000 characters
    cut = apply(text, CharCap())
    info = cut.info
    assert cut.text == text[:30000]
    assert len(cut.text) == 30000
    assert info.direction == "head"
    assert info.limit == "chars"
    assert (info.total_lines, info.shown_lines) == (400, 300)
    assert info.shown_ranges == ((1, 300),)
    assert info.shown_bytes == utf8_len(cut.text)
    assert not info.partial_line  # 300 whole lines of 100 characters


def test_char_cap_inside_a_line_is_partial() -> None:
    cut = char_cap("abc\ndef\n", 5)
    assert cut.text == "abc\nd"
    assert cut.info.partial_line
    assert cut.info.shown_ranges == ((1, 2),)


def test_char_cap_whole() -> None:
    cut = char_cap("abc", 3)
    assert cut.text == "abc"
    assert not cut.info.truncated
    assert cut.info.direction == "head"


# --------------------------------------------------- the modes dialect's middle


def test_seed001_middle_format_and_counts() -> None:
    lines = [f"{i:07d}\n" for i in range(20000)]  # 8 bytes each: 160,000 bytes
    text = "".join(lines)
    cut = apply(text, Middle())
    head = "".join(lines[:512])  # 4096 bytes
    tail = "".join(lines[-512:])
    assert cut.text == head + "\n\n[snip]\n\n" + tail
    assert SNIP == "\n\n[snip]\n\n"
    info = cut.info
    assert info.direction == "middle"
    assert info.truncated
    assert info.limit == "bytes"
    assert (info.total_lines, info.total_bytes) == (20000, 160000)
    assert info.shown_lines == 1024
    assert info.shown_bytes == 8192
    assert info.shown_ranges == ((1, 512), (19489, 20000))
    assert not info.partial_line


def test_middle_under_the_limit_is_whole() -> None:
    text = "x" * (128 * KB)
    cut = apply(text, Middle())
    assert cut.text == text
    assert not cut.info.truncated
    assert cut.info.direction == "middle"


def test_middle_one_huge_line_counts_it_once() -> None:
    text = "x" * 300
    cut = middle(text, 100, 10)
    assert cut.text == "x" * 10 + SNIP + "x" * 10
    assert cut.info.total_lines == 1
    assert cut.info.shown_lines == 1
    assert cut.info.shown_ranges == ((1, 1), (1, 1))
    assert cut.info.partial_line


def test_middle_keep_larger_than_limit_shows_whole_without_overlap() -> None:
    # Head and tail of 100 bytes each would overlap in a 20-byte text.
    text = "0123456789\n" * 2
    cut = middle(text, 10, 100)
    assert cut.text == text
    assert not cut.info.truncated
    assert cut.info.shown_bytes == cut.info.total_bytes == 22


def test_middle_never_splits_characters() -> None:
    text = "✓" * 100  # 300 bytes
    cut = middle(text, 100, 10)
    assert cut.text == "✓" * 3 + SNIP + "✓" * 3
    assert cut.info.shown_bytes == 18


# ------------------------------------------------------------- limits and dispatch


@pytest.mark.parametrize(
    ("policy", "limit"),
    [
        (TailLines(), 51200),
        (TailLines(max_lines=5, max_bytes=10), 10),
        (ByteTail(max_bytes=7), 7),
        (CharCap(), 30000),
        (Middle(), 128 * KB),
        (Middle(max_bytes=10, keep_bytes=100), 200 + len(SNIP)),
    ],
)
def test_shown_limit(policy: Truncation, limit: int) -> None:
    assert shown_limit(policy) == limit


@pytest.mark.parametrize(
    ("text", "count", "head", "last"),
    [
        ("a\nb\nc\n", 2, "a\nb\n", "b\nc\n"),
        ("a\nb\nc", 2, "a\nb\n", "b\nc"),
        ("a\nb\nc", 0, "", ""),
        ("a\nb\nc", 10, "a\nb\nc", "a\nb\nc"),
        ("", 3, "", ""),
        ("\n\n", 1, "\n", "\n"),
        # CR (kept by sanitize for progress bars) and U+2028 are not line breaks.
        ("10%\r50%\r100%\ndone\n", 1, "10%\r50%\r100%\n", "done\n"),
        ("a\u2028b\nc\x0cd\n", 1, "a\u2028b\n", "c\x0cd\n"),
    ],
)
def test_head_and_last_lines(text: str, count: int, head: str, last: str) -> None:
    assert head_lines(text, count) == head
    assert last_lines(text, count) == last


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("all good\nfine\n", ()),
        ("ok\nerror: boom\nok\n", ("error: boom",)),
        ("FAILED tests/x.py::t\n", ("FAILED tests/x.py::t",)),
        ("thread 'main' panicked at x\n", ("thread 'main' panicked at x",)),
        ("Traceback (most recent call last):\n  x\n", ("Traceback (most recent call last):",)),
        ("  12 warnings generated.\n", ("12 warnings generated.",)),
        ("=== 3 failed, 2 passed ===\n", ("=== 3 failed, 2 passed ===",)),
        ("Fatal: nope\n", ("Fatal: nope",)),
        ("warning: unused variable\n", ()),
    ],
)
def test_error_digest(text: str, found: tuple[str, ...]) -> None:
    assert error_digest(text) == found


def test_error_digest_keeps_the_last_lines_shortened() -> None:
    text = "".join(f"error {i} " + "x" * 500 + "\n" for i in range(30))
    found = error_digest(text, limit=5, width=20)
    assert len(found) == 5
    assert found[0].startswith("error 25 ")
    assert found[-1].startswith("error 29 ")
    assert all(len(line) == 20 for line in found)


# ---------------------------------------------------------------------- properties

_chars = st.sampled_from([*"ab \t\r\n\n\n", "é", "✓", "😀", "\u2028"])
_texts = st.one_of(
    st.text(alphabet=_chars, max_size=300),
    st.text(max_size=100),
    st.lists(st.sampled_from(["", "x", "line", "é✓😀", "y" * 40]), max_size=40).map("\n".join),
)
_policies = st.one_of(
    st.builds(TailLines, max_lines=st.integers(1, 30), max_bytes=st.integers(1, 200)),
    st.builds(ByteTail, max_bytes=st.integers(1, 200)),
    st.builds(CharCap, max_chars=st.integers(1, 200)),
    st.builds(Middle, max_bytes=st.integers(1, 200), keep_bytes=st.integers(1, 80)),
)


def _size(text: str, policy: Truncation) -> int:
    return len(text) if isinstance(policy, CharCap) else utf8_len(text)


@settings(max_examples=600, deadline=None)
@given(_texts, _policies)
def test_apply_properties(text: str, policy: Truncation) -> None:
    cut = apply(text, policy)
    info = cut.info
    shown = cut.text
    shown.encode("utf-8")  # never a split character
    # Totals describe the input, exactly.
    assert info.total_lines == count_lines(text)
    assert info.total_bytes == utf8_len(text)
    # Shown counts describe the shown text, and never exceed the totals.
    assert 0 <= info.shown_lines <= info.total_lines
    assert 0 <= info.shown_bytes <= info.total_bytes
    # Shown output stays under the policy's limit (middle's notice included in the bound).
    assert _size(shown, policy) <= shown_limit(policy)
    if not info.truncated:
        assert shown == text
        assert info.limit is None
        assert info.shown_lines == info.total_lines
        assert info.shown_bytes == info.total_bytes
        assert info.shown_ranges == (((1, info.total_lines),) if info.total_lines else ())
        assert not info.partial_line
        return
    assert info.limit is not None
    if info.direction == "tail":
        assert text.endswith(shown)
        assert shown != text
        assert info.shown_bytes == utf8_len(shown)
        assert info.shown_lines == count_lines(shown)
        if info.shown_lines:
            assert info.shown_ranges == (
                (info.total_lines - info.shown_lines + 1, info.total_lines),
            )
        else:
            assert info.shown_ranges == ()
    elif info.direction == "head":
        assert text.startswith(shown)
        assert shown != text
        assert info.shown_bytes == utf8_len(shown)
        assert info.shown_lines == count_lines(shown)
        assert info.shown_ranges == (((1, info.shown_lines),) if info.shown_lines else ())
    else:
        assert isinstance(policy, Middle)
        head, snip, tail = shown.partition(SNIP)
        assert snip == SNIP
        assert text.startswith(head)
        assert text.endswith(tail)
        assert len(head) + len(tail) < len(text)  # the two ends never overlap
        assert utf8_len(head) <= policy.keep_bytes
        assert utf8_len(tail) <= policy.keep_bytes
        assert info.shown_bytes == utf8_len(head) + utf8_len(tail)
        (h1, h2), (t1, t2) = info.shown_ranges
        assert (h1, h2) == (1, count_lines(head))
        assert (t1, t2) == (info.total_lines - count_lines(tail) + 1, info.total_lines)
        assert t1 >= h2  # at most one shared line


@settings(max_examples=400, deadline=None)
@given(_texts, st.integers(1, 12), st.integers(1, 120))
def test_tail_lines_properties(text: str, max_lines: int, max_bytes: int) -> None:
    cut = tail_lines(text, max_lines, max_bytes)
    info = cut.info
    shown = cut.text
    assert text.endswith(shown)
    assert utf8_len(shown) <= max_bytes
    assert info.shown_lines <= max_lines
    before = text[: len(text) - len(shown)]
    if not info.truncated:
        return
    if info.partial_line:
        # Only a single line larger than the byte limit is cut inside.
        assert info.limit == "bytes"
        assert "\n" not in shown.rstrip("\n")
        assert utf8_len(_lines_ref(text)[-1]) > max_bytes
    else:
        # Whole lines only: what is left out ends at a line break.
        assert before.endswith("\n")
        if info.limit == "lines":
            assert info.shown_lines == max_lines
        else:
            # The line before would not have fitted.
            previous = _lines_ref(before)[-1]
            assert utf8_len(previous) + utf8_len(shown) > max_bytes


@settings(max_examples=300, deadline=None)
@given(_texts, st.integers(1, 120))
def test_byte_tail_is_the_longest_fitting_run_of_whole_lines(text: str, max_bytes: int) -> None:
    cut = byte_tail(text, max_bytes)
    shown = cut.text
    assert text.endswith(shown)
    assert utf8_len(shown) <= max_bytes
    if shown == text:
        return
    before = text[: len(text) - len(shown)]
    assert cut.info.partial_line == (not before.endswith("\n"))
    lines = _lines_ref(text)
    if cut.info.partial_line:
        # Only a last line larger than the limit is shown in part: its longest tail.
        assert utf8_len(lines[-1]) > max_bytes
        assert shown == utf8_tail(text, max_bytes)
    else:
        # Whole lines, and the line before would not have fitted.
        assert utf8_len(_lines_ref(before)[-1]) + utf8_len(shown) > max_bytes
    # The notice's first line is the shown text's first line.
    if shown:
        assert cut.info.shown_ranges == ((len(lines) - count_lines(shown) + 1, len(lines)),)
    else:
        assert cut.info.shown_ranges == ()


@settings(max_examples=300, deadline=None)
@given(_texts, st.integers(1, 120))
def test_char_cap_is_a_plain_prefix(text: str, max_chars: int) -> None:
    cut = char_cap(text, max_chars)
    assert cut.text == text[:max_chars]
    assert cut.info.truncated == (len(text) > max_chars)


# Lone surrogates included: utf8_* encode them with surrogatepass.
_any_text = st.text(alphabet=st.characters(codec=None), max_size=60) | _texts


@settings(max_examples=500, deadline=None)
@given(_any_text, st.integers(0, 80))
def test_utf8_tail_and_head_are_longest_suffix_and_prefix(text: str, max_bytes: int) -> None:
    tail = utf8_tail(text, max_bytes)
    head = utf8_head(text, max_bytes)
    assert text.endswith(tail)
    assert text.startswith(head)
    assert utf8_len(tail) <= max_bytes
    assert utf8_len(head) <= max_bytes
    if tail != text:
        assert utf8_len(text[len(text) - len(tail) - 1 :]) > max_bytes
    if head != text:
        assert utf8_len(text[: len(head) + 1]) > max_bytes


@settings(max_examples=300, deadline=None)
@given(_texts, st.integers(0, 10))
def test_head_and_last_lines_match_line_counting(text: str, count: int) -> None:
    lines = _lines_ref(text)
    head = head_lines(text, count)
    last = last_lines(text, count)
    assert head == "".join(lines[:count])
    assert last == ("".join(lines[-count:]) if count else "")
    assert count_lines(head) == min(count, count_lines(text))
    assert count_lines(last) == min(count, count_lines(text))
    assert text.startswith(head)
    assert text.endswith(last)


def test_middle_info_counts_a_shared_line_once() -> None:
    # Head ends inside line 2, tail starts inside line 2: 3 distinct lines of 3.
    info = truncate.middle_info("a\nbb", "bb\nc\n", 3, 100, partial=True)
    assert info.shown_lines == 3
    assert info.shown_ranges == ((1, 2), (2, 3))
    assert info.shown_bytes == 4 + 5
    # Disjoint: lines 1-2 and 9-10 of 10.
    info = truncate.middle_info("a\nb\n", "c\nd\n", 10, 100, partial=False)
    assert info.shown_lines == 4
    assert info.shown_ranges == ((1, 2), (9, 10))
    assert not info.partial_line


# ---------------------------------------------------------- the pi dialect's head / tail

SEQ_10 = "".join(f"{n}\n" for n in range(1, 11))


@pytest.mark.parametrize(
    ("total", "head", "tail", "wanted"),
    [
        (10, 3, None, (1, 3)), (10, None, 3, (8, 10)), (10, 6, 2, (5, 6)), (10, 2, 6, (1, 2)),
        (10, 20, None, (1, 10)), (10, None, 20, (1, 10)), (10, 0, None, (1, 0)),
        (10, None, 0, (1, 0)), (0, 3, None, (1, 0)), (10, 10, 1, (10, 10)),
    ],
)
def test_wanted_lines(total: int, head: int | None, tail: int | None,
                      wanted: tuple[int, int]) -> None:
    assert wanted_lines(total, head, tail) == wanted


@pytest.mark.parametrize(
    ("asked", "expected"),
    [
        ((3, None), ("1\n2\n3\n", "head", ((1, 3),), "lines")),
        ((None, 3), ("8\n9\n10\n", "tail", ((8, 10),), "lines")),
        ((6, 2), ("5\n6\n", "middle", ((5, 6),), "lines")),
        ((10, 2), ("9\n10\n", "tail", ((9, 10),), "lines")),
        ((20, None), (SEQ_10, "tail", ((1, 10),), None)),  # all of it: not cut
        ((None, 10), (SEQ_10, "tail", ((1, 10),), None)),
        ((0, None), ("", "head", (), "lines")),
    ],
)
def test_line_range_shows_the_asked_lines_and_says_which(
    asked: tuple[int | None, int | None],
    expected: tuple[str, str, tuple[tuple[int, int], ...], str | None],
) -> None:
    (head, tail), (text, direction, ranges, limit) = asked, expected
    cut = line_range(SEQ_10, head, tail, 50 * 1024)
    assert cut.text == text
    assert cut.info.direction == direction
    assert cut.info.shown_ranges == ranges
    assert cut.info.limit == limit
    assert cut.info.truncated == (limit is not None)
    assert (cut.info.total_lines, cut.info.total_bytes) == (10, 21)
    assert (cut.info.shown_lines, cut.info.shown_bytes) == (count_lines(text), len(text))


def test_line_range_past_the_byte_limit_cuts_a_head_at_its_start_a_tail_at_its_end() -> None:
    text = "aaaa\nbbbb\ncccc\n"
    head = line_range(text, 3, None, 7)
    assert head.text == "aaaa\nbb"
    assert (head.info.limit, head.info.partial_line, head.info.shown_ranges) == (
        "bytes", True, ((1, 2),))
    tail = line_range(text, None, 3, 7)
    assert tail.text == "b\ncccc\n"
    assert (tail.info.limit, tail.info.partial_line, tail.info.shown_ranges) == (
        "bytes", True, ((2, 3),))
    exact = line_range(text, None, 3, 10)
    assert exact.text == "bbbb\ncccc\n" and not exact.info.partial_line


def test_line_range_of_a_window_numbers_the_streams_lines() -> None:
    window = "".join(f"{n}\n" for n in range(1, 6))
    cut = line_range(window, 3, None, 1000, total_lines=100_000)
    assert cut.text == "1\n2\n3\n"
    assert cut.info.shown_ranges == ((1, 3),) and cut.info.total_lines == 100_000


@given(st.lists(st.text(alphabet="ab", max_size=4), max_size=12),
       st.one_of(st.none(), st.integers(0, 14)), st.one_of(st.none(), st.integers(0, 14)))
def test_line_range_is_head_then_tail_of_the_whole_text(
    words: list[str], head: int | None, tail: int | None
) -> None:
    text = "".join(f"{w}\n" for w in words)
    expected = text
    if head is not None:
        expected = head_lines(expected, head)
    if tail is not None:
        expected = last_lines(expected, tail)
    cut = line_range(text, head, tail, 1 << 20)
    assert cut.text == expected
    assert cut.info.shown_lines == count_lines(expected)
    if cut.info.shown_ranges:
        ((first, last),) = cut.info.shown_ranges
        assert "".join(f"{w}\n" for w in words[first - 1:last]) == expected
