"""Regular expressions a caller sends (`grep` of check and read_output), run in RE2.

Python's `re` backtracks: `(a+)+$` over a line of 26 `a` and a `b` took a control
consumer 7.4 s (hours for longer lines), and every check and kill of that host waited
behind it. RE2 matches in time linear in the text whatever the pattern, so a caller's
pattern can cost no more than reading the text. Its syntax is Python's minus
backreferences and lookaround; a pattern using them is refused with RE2's reason.
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


def grep_lines(text: str, pattern: Pattern) -> str:
    """The lines of `text` (their newlines kept) that `pattern` finds something in."""
    return "".join(line for line in text.splitlines(keepends=True) if pattern.search(line))
