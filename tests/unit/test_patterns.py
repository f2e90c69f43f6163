"""Caller patterns (`grep` of check, read_output and every dialect's filter): lines are
matched as grep matches them, `^` and `$` at the line's start and end (a pattern ending in
`$` once never matched: lines kept their newline)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bashfleet.worker.engine.output.patterns import (
    caller_pattern,
    grep_lines,
    line_body,
    split_lines,
)

SEQ_1_30 = "".join(f"{n}\n" for n in range(1, 31))


@pytest.mark.parametrize(
    ("pattern", "text", "expected"),
    [
        # The newcomer's case: `output J --grep '0$'` on `seq 1 30`.
        ("0$", SEQ_1_30, "10\n20\n30\n"),
        ("^3", SEQ_1_30, "3\n30\n"),
        ("^2.$", SEQ_1_30, "20\n21\n22\n23\n24\n25\n26\n27\n28\n29\n"),
        ("^$", "a\n\nb\n", "\n"),
        # A last line without a newline is a line like the others.
        ("0$", "10\n20", "10\n20"),
        ("^b$", "a\nb", "b"),
        # CRLF: the `\r` is part of the ending, not of the line; the line is kept whole.
        ("0$", "10\r\n11\r\n20\r\n", "10\r\n20\r\n"),
        ("^x$", "x\r\ny\r\n", "x\r\n"),
        # A lone CR (a progress bar) or a form feed is inside a line, as grep sees it.
        ("^b", "a\rb\n", ""),
        ("b$", "a\rb\n", "a\rb\n"),
        ("^b", "a\x0cb\n", ""),
        # Multi-line input, a pattern in the middle of lines.
        ("err", "ok\nan error here\nfine\nerrors: 2\n", "an error here\nerrors: 2\n"),
        ("(?i)warning", "WARNING: x\nnote\nwarning: y\n", "WARNING: x\nwarning: y\n"),
        # Nothing in, nothing out; no match, nothing out.
        ("x", "", ""),
        ("zzz", SEQ_1_30, ""),
        # `\n` never occurs in a line searched.
        ("\\n", "a\nb\n", ""),
    ],
)
def test_grep_lines_matches_lines_as_grep_does(pattern: str, text: str, expected: str) -> None:
    assert grep_lines(text, caller_pattern(pattern)) == expected


@pytest.mark.parametrize(
    ("line", "body"),
    [("a\n", "a"), ("a\r\n", "a"), ("a", "a"), ("a\r", "a"), ("\n", ""), ("", ""),
     ("a\rb\n", "a\rb")],
)
def test_line_body_drops_only_the_ending(line: str, body: str) -> None:
    assert line_body(line) == body


@pytest.mark.parametrize(
    ("text", "lines"),
    [("", []), ("a", ["a"]), ("a\n", ["a\n"]), ("a\nb", ["a\n", "b"]),
     ("\n\n", ["\n", "\n"]), ("a\rb\x0cc\n", ["a\rb\x0cc\n"])],
)
def test_split_lines_cuts_after_each_newline_only(text: str, lines: list[str]) -> None:
    assert split_lines(text) == lines


@given(st.text(alphabet="ab\n\r0", max_size=60))
def test_split_lines_loses_and_adds_nothing(text: str) -> None:
    assert "".join(split_lines(text)) == text
    assert grep_lines(text, caller_pattern("")) == text  # the empty pattern keeps all


@given(st.lists(st.text(alphabet="ab0 ", max_size=8), max_size=10), st.sampled_from(
    ["0$", "^a", "^$", "a.b", "^b+$", "0"]))
def test_grep_lines_agrees_with_python_re_per_line(lines: list[str], pattern: str) -> None:
    """Python's `re.search` on a line without its newline is grep's meaning (and the
    reference here: these patterns mean the same in both engines)."""
    text = "".join(f"{line}\n" for line in lines)
    expected = "".join(f"{line}\n" for line in lines if re.search(pattern, line))
    assert grep_lines(text, caller_pattern(pattern)) == expected


def test_a_pattern_re2_refuses_says_why() -> None:
    with pytest.raises(ValueError, match="RE2 syntax"):
        caller_pattern(r"(a)\1")
