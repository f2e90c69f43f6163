"""Cut shown output by a policy, with exact counts: pure functions over text.

Every function takes the whole (sanitized) text of one stream and returns a `Cut`:
the shown text and a `TruncationInfo`. Counting conventions, used everywhere:

- a line is a run of characters ended by `\\n`; a last run without `\\n` is a line too;
- bytes are bytes of UTF-8;
- shown counts describe the shown text; totals describe the whole text, so
  `total - shown` is what was left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from bashfleet.worker.wire.models import (
    ByteTail,
    CharCap,
    HeadTailTokens,
    Middle,
    TailLines,
    Truncation,
    TruncationInfo,
)

SNIP = "\n\n[snip]\n\n"

_Direction = Literal["tail", "head", "middle"]
_Limit = Literal["lines", "bytes", "chars"]

#: Lines from a cut part that look like errors, for the native digest.
_ERRORISH = re.compile(
    r"error|fail|panic|traceback|exception|fatal|\bwarnings?\b.*\b(?:summary|generated)\b"
    r"|\d+ (?:failed|errors?)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Cut:
    """Shown text of one stream with its counts."""

    text: str
    info: TruncationInfo


def count_lines(text: str) -> int:
    """Lines in `text`: newlines, plus one for a last line without newline."""
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def utf8_len(text: str) -> int:
    """Bytes of `text` in UTF-8 (lone surrogates count as 3, as they encode)."""
    return len(text.encode("utf-8", "surrogatepass"))


def utf8_tail(text: str, max_bytes: int) -> str:
    """The longest suffix of `text` of at most `max_bytes` UTF-8 bytes."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= max_bytes:
        return text
    tail = data[len(data) - max_bytes :]
    # Skip continuation bytes so the cut never lands inside a character.
    start = 0
    while start < len(tail) and (tail[start] & 0xC0) == 0x80:
        start += 1
    return tail[start:].decode("utf-8", "surrogatepass")


def utf8_head(text: str, max_bytes: int) -> str:
    """The longest prefix of `text` of at most `max_bytes` UTF-8 bytes."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= max_bytes:
        return text
    # Back off from continuation bytes so the cut never lands inside a character.
    # (Decoding with errors="ignore" would also drop lone surrogates before the cut,
    # and the result would no longer be a prefix.)
    end = max(0, max_bytes)
    while end > 0 and (data[end] & 0xC0) == 0x80:
        end -= 1
    return data[:end].decode("utf-8", "surrogatepass")


def _whole(text: str, direction: _Direction) -> Cut:
    lines = count_lines(text)
    return Cut(
        text,
        TruncationInfo(
            direction=direction,
            truncated=False,
            limit=None,
            total_lines=lines,
            total_bytes=utf8_len(text),
            shown_lines=lines,
            shown_bytes=utf8_len(text),
            shown_ranges=((1, lines),) if lines else (),
        ),
    )


def _tail_info(text: str, shown: str, limit: _Limit | None, partial: bool) -> TruncationInfo:
    total = count_lines(text)
    shown_lines = count_lines(shown)
    first = total - shown_lines + 1
    return TruncationInfo(
        direction="tail",
        truncated=shown != text,
        limit=limit if shown != text else None,
        total_lines=total,
        total_bytes=utf8_len(text),
        shown_lines=shown_lines,
        shown_bytes=utf8_len(shown),
        partial_line=partial,
        shown_ranges=((first, total),) if shown_lines else (),
    )


def tail_lines(text: str, max_lines: int, max_bytes: int) -> Cut:
    """Keep whole lines from the end until `max_lines` or `max_bytes` would be passed.

    When even the last line alone is larger than `max_bytes`, its tail is shown and
    the cut is flagged as a partial line (the pipe dialect's single huge line).
    """
    if count_lines(text) <= max_lines and utf8_len(text) <= max_bytes:
        return _whole(text, "tail")
    body = text[:-1] if text.endswith("\n") else text
    parts = body.split("\n")
    ending = "\n" if text.endswith("\n") else ""
    kept: list[str] = []
    size = len(ending.encode())
    limit: _Limit = "lines"
    for part in reversed(parts):
        if len(kept) == max_lines:
            limit = "lines"
            break
        cost = utf8_len(part) + (1 if kept else 0)
        if size + cost > max_bytes:
            limit = "bytes"
            break
        kept.append(part)
        size += cost
    if not kept:
        # A single line larger than the byte limit: show its tail.
        shown = utf8_tail(parts[-1] + ending, max_bytes)
        return Cut(shown, _tail_info(text, shown, "bytes", partial=True))
    shown = "\n".join(reversed(kept)) + ending
    return Cut(shown, _tail_info(text, shown, limit, partial=False))


def byte_tail(text: str, max_bytes: int) -> Cut:
    """Keep the end of `text` within `max_bytes` bytes, from a line's start (pi's tail).

    The cut never splits a UTF-8 character. When the last `max_bytes` bytes start inside
    a line, the shown text starts at the next whole line instead, so its first line is
    the one the "Showing lines A-B" notice names (pi's `truncateTail` never shows a line
    in part otherwise). Only a last line larger than `max_bytes` on its own is shown in
    part: its tail, flagged as a partial line.
    """
    shown = utf8_tail(text, max_bytes)
    if shown == text:
        return _whole(text, "tail")
    if not text[: len(text) - len(shown)].endswith("\n"):
        newline = shown.find("\n")
        if 0 <= newline < len(shown) - 1:
            shown = shown[newline + 1 :]
    partial = not text[: len(text) - len(shown)].endswith("\n")
    return Cut(shown, _tail_info(text, shown, "bytes", partial=partial))


def char_cap(text: str, max_chars: int) -> Cut:
    """Keep the first `max_chars` characters (the claude dialect's 30,000-character cap)."""
    if len(text) <= max_chars:
        return _whole(text, "head")
    shown = text[:max_chars]
    shown_lines = count_lines(shown)
    return Cut(
        shown,
        TruncationInfo(
            direction="head",
            truncated=True,
            limit="chars",
            total_lines=count_lines(text),
            total_bytes=utf8_len(text),
            shown_lines=shown_lines,
            shown_bytes=utf8_len(shown),
            partial_line=not shown.endswith("\n"),
            shown_ranges=((1, shown_lines),) if shown_lines else (),
        ),
    )


def middle(text: str, max_bytes: int, keep_bytes: int) -> Cut:
    """Past `max_bytes`, keep the first and last `keep_bytes` joined by `[snip]` (modes).

    A text no larger than both ends together is shown whole: there is nothing to snip
    (and head and tail would overlap).
    """
    size = utf8_len(text)
    if size <= max(max_bytes, 2 * keep_bytes):
        return _whole(text, "middle")
    head = utf8_head(text, keep_bytes)
    tail = utf8_tail(text, keep_bytes)
    partial = not head.endswith("\n") or not text[: len(text) - len(tail)].endswith("\n")
    info = middle_info(head, tail, count_lines(text), size, partial=partial)
    return Cut(head + SNIP + tail, info)


def middle_info(
    head: str, tail: str, total_lines: int, total_bytes: int, *, partial: bool
) -> TruncationInfo:
    """Counts of a middle cut showing `head` and `tail` of a text with the given totals.

    The snip notice is not counted in the shown bytes. When the cut falls inside one
    line, that line's start ends the head and its end starts the tail: it is counted
    once in `shown_lines`, and the two ranges share it.
    """
    head_lines, tail_lines_ = count_lines(head), count_lines(tail)
    first_tail = total_lines - tail_lines_ + 1
    shared = max(0, head_lines - first_tail + 1)
    return TruncationInfo(
        direction="middle",
        truncated=True,
        limit="bytes",
        total_lines=total_lines,
        total_bytes=total_bytes,
        shown_lines=min(total_lines, head_lines + tail_lines_ - shared),
        shown_bytes=utf8_len(head) + utf8_len(tail),
        partial_line=partial,
        shown_ranges=((1, head_lines), (first_tail, total_lines)),
    )


#: Bytes per token, for head_tail_tokens (codex counts ~4 bytes a token, rounded up).
TOKEN_BYTES = 4


def tokens(size: int) -> int:
    """Tokens of `size` bytes: a token is 4 bytes, rounded up."""
    return -(-size // TOKEN_BYTES)


def head_tail_tokens(text: str, max_tokens: int) -> Cut:
    """Past `max_tokens` tokens, keep half the byte budget from the head and half from
    the tail (UTF-8 boundaries) around `…N tokens truncated…`, N the tokens left out."""
    size = utf8_len(text)
    budget = max_tokens * TOKEN_BYTES
    if size <= budget:
        return _whole(text, "middle")
    head = utf8_head(text, budget // 2)
    tail = utf8_tail(text, budget - budget // 2) if budget - budget // 2 else ""
    removed = size - utf8_len(head) - utf8_len(tail)
    partial = not head.endswith("\n") or not text[: len(text) - len(tail)].endswith("\n")
    info = middle_info(head, tail, count_lines(text), size, partial=partial)
    return Cut(f"{head}…{tokens(removed)} tokens truncated…{tail}", info)


def apply(text: str, policy: Truncation) -> Cut:
    """Cut `text` by a policy."""
    match policy:
        case TailLines(max_lines=lines, max_bytes=size):
            return tail_lines(text, lines, size)
        case ByteTail(max_bytes=size):
            return byte_tail(text, size)
        case CharCap(max_chars=chars):
            return char_cap(text, chars)
        case Middle(max_bytes=size, keep_bytes=keep):
            return middle(text, size, keep)
        case HeadTailTokens(max_tokens=count):
            return head_tail_tokens(text, count)
    raise TypeError(f"unknown truncation policy {policy!r}")  # pragma: no cover


def shown_limit(policy: Truncation) -> int:
    """Upper bound of the shown text's size under a policy, in UTF-8 bytes or characters."""
    match policy:
        case TailLines(max_bytes=size) | ByteTail(max_bytes=size):
            return size
        case CharCap(max_chars=chars):
            return chars
        case Middle(max_bytes=size, keep_bytes=keep):
            return max(size, 2 * keep + len(SNIP))
        case HeadTailTokens(max_tokens=count):
            return count * TOKEN_BYTES + 64  # the marker
    raise TypeError(f"unknown truncation policy {policy!r}")  # pragma: no cover


def _split_lines(text: str) -> list[str]:
    """Lines ended by a newline only, ends kept, as `head -n` and `count_lines` count.

    (str.splitlines also splits on CR, form feeds, U+2028 and more.)
    """
    lines = text.split("\n")
    last = lines.pop()
    return [line + "\n" for line in lines] + ([last] if last else [])


def head_lines(text: str, count: int) -> str:
    """The first `count` lines of `text` (the pi dialect's `head` limit)."""
    if count <= 0:
        return ""
    return "".join(_split_lines(text)[:count])


def last_lines(text: str, count: int) -> str:
    """The last `count` lines of `text` (the pi dialect's `tail` limit)."""
    if count <= 0:
        return ""
    return "".join(_split_lines(text)[-count:])


def wanted_lines(total: int, head: int | None, tail: int | None) -> tuple[int, int]:
    """The 1-based inclusive range of lines `head` / `tail` ask for in a stream of
    `total` lines, as pi applies them: head first, then tail of what head kept.
    An empty range is (1, 0)."""
    last = total if head is None else min(max(head, 0), total)
    first = 1 if tail is None else max(1, last - max(tail, 0) + 1)
    if tail is not None and tail <= 0:
        first = last + 1
    return (first, last) if first <= last else (1, 0)


def line_range(
    text: str, head: int | None, tail: int | None, max_bytes: int, *, first_line: int = 1,
    total_lines: int | None = None,
) -> Cut:
    """The lines of the whole `text` that `head` / `tail` ask for (`wanted_lines`), at
    most `max_bytes` of them (UTF-8-safe: from their start for a head alone, else from
    their end, as the tail policy cuts), with counts that say exactly which lines are
    shown (without this, the head of a 100,000-line output showed lines of its last
    50 KB, under a notice about those).

    `text` may be a window of a longer stream that starts at line `first_line` and holds
    every wanted line; `total_lines` is then the stream's count (shown ranges are the
    stream's line numbers; the byte totals stay the window's, for the caller to set).
    """
    lines = _split_lines(text)
    offset = first_line - 1
    total = len(lines) + offset if total_lines is None else total_lines
    first, last = wanted_lines(total, head, tail)
    chosen = "".join(lines[max(0, first - 1 - offset): max(0, last - offset)])
    # A head is cut to its start; a tail (also head then tail) to its end.
    from_start = tail is None
    shown = utf8_head(chosen, max_bytes) if from_start else utf8_tail(chosen, max_bytes)
    count = count_lines(shown)
    if not shown:
        ranges: tuple[tuple[int, int], ...] = ()
    elif from_start:
        ranges = ((first, first + count - 1),)
    else:
        ranges = ((last - count + 1, last),)
    byte_cut = shown != chosen
    cut_lines = (first, last) != (1, total)
    direction: _Direction = "tail"
    if (byte_cut or cut_lines) and from_start:
        direction = "head"
    elif (byte_cut or cut_lines) and last < total:
        direction = "middle"  # one range inside the output: lines A-B of T
    partial = byte_cut and (not shown.endswith("\n") if from_start
                            else not chosen[: len(chosen) - len(shown)].endswith("\n"))
    return Cut(shown, TruncationInfo(
        direction=direction,
        truncated=byte_cut or cut_lines,
        limit="bytes" if byte_cut else "lines" if cut_lines else None,
        total_lines=total,
        total_bytes=utf8_len(text),
        shown_lines=count,
        shown_bytes=utf8_len(shown),
        partial_line=partial,
        shown_ranges=ranges,
    ))


def error_digest(cut_text: str, limit: int = 20, width: int = 300) -> tuple[str, ...]:
    """Up to `limit` error-looking lines of a cut part, last ones kept, each shortened."""
    found = [line.strip()[:width] for line in cut_text.splitlines() if _ERRORISH.search(line)]
    return tuple(found[-limit:])
