"""Regular expressions a caller sends (`grep` of check and read_output), run in RE2.

Python's `re` backtracks: `(a+)+$` over a line of 26 `a` and a `b` took a control
consumer 7.4 s (hours for longer lines), and every check and kill of that host waited
behind it. RE2 matches in time linear in the text whatever the pattern, so a caller's
pattern can cost no more than reading the text. Its syntax is Python's minus
backreferences and lookaround; a pattern using them is refused with RE2's reason.

Lines are matched as grep matches them: split at `\n` only, each searched without its
line ending (`\n`, or `\r\n` from a CRLF file), so `^` is the start of the line and `$`
its end. Searched with its newline, a line never matched `0$` (RE2's `$` is the end of
the text, not before a final newline as in Python's `re`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol

import re2


class Pattern(Protocol):
    """What the callers use of a compiled pattern."""

    def search(self, text: str) -> object:
        """A match (truthy) or None."""
        ...


def _options() -> object:
    options = re2.Options()
    options.log_errors = False  # a bad pattern is the caller's error, not a log line
    return options


_OPTIONS = _options()


@lru_cache(maxsize=256)
def caller_pattern(pattern: str) -> Pattern:
    """`pattern` compiled in RE2; ValueError (saying why) when RE2 cannot take it."""
    try:
        compiled: Pattern = re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise ValueError(f"{reason} (RE2 syntax: no backreferences or lookaround)") from None
    return compiled


def line_body(line: str) -> str:
    """A line without its ending (`\n` or `\r\n`): what `^` and `$` see."""
    if line.endswith("\n"):
        line = line[:-1]
    return line[:-1] if line.endswith("\r") else line


def split_lines(text: str) -> list[str]:
    """`text` cut after each `\n` (kept), as grep reads lines: a form feed or a lone CR
    (a progress bar's) is inside a line, not the end of one."""
    lines = text.split("\n")
    ends = [line + "\n" for line in lines[:-1]]
    return [*ends, lines[-1]] if lines[-1] else ends


def grep_lines(text: str, pattern: Pattern) -> str:
    """The lines of `text` (their endings kept) in which `pattern` finds something,
    the line searched without its ending (`0$` finds `10\n`)."""
    return "".join(line for line in split_lines(text) if pattern.search(line_body(line)))
