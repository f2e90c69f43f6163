"""Capture a stream into a file, count it while it grows, and shape what is shown.

Commands write straight into their spill file (the kernel does the copying, so a
command printing a gigabyte costs what a redirect costs). The engine follows the
file as it grows to count lines, so counts stay exact and memory stays bounded
whatever the command prints; at the end it reads only the windows a policy shows.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from bashfleet.worker.engine.output import truncate
from bashfleet.worker.engine.output.sanitize import (
    BINARY_SNIFF,
    cap_lines,
    last_frames,
    looks_binary,
    redact,
    reveal_invisible,
    sanitize,
    utf8_boundary,
)
from bashfleet.worker.wire.models import (
    ByteTail,
    CharCap,
    HeadTailTokens,
    Middle,
    Policy,
    TailLines,
    Truncation,
    TruncationInfo,
)

#: Chunk read while following a file: bounds the memory a huge output costs.
CHUNK = 4 * 1024 * 1024
#: First reads of a followed file: most commands print less than this.
SMALL_CHUNK = 64 * 1024
#: Outputs up to this size are read whole and cut by the pure functions directly.
WHOLE_READ_LIMIT = 1024 * 1024
#: Largest window read from a huge file to find the shown part.
MAX_WINDOW = 16 * 1024 * 1024
#: How much of the cut part of a huge output is searched for error lines.
DIGEST_SCAN = 4 * 1024 * 1024


@dataclass
class FollowedFile:
    """A file some process appends to, counted as it grows."""

    path: Path
    offset: int = 0
    newlines: int = 0
    last_byte: int | None = None
    # Reused for large outputs: a fresh 4 MiB bytes object per chunk costs a page fault
    # per 4 KiB, which showed as 10-20% of the wall time of a 1 GiB command.
    _buffer: bytearray | None = field(default=None, repr=False)
    # Every byte read so far, while they fit in SMALL_CHUNK: shaping a small output
    # then needs no second open and read of the file.
    _content: bytearray | None = field(default_factory=bytearray, repr=False)

    def catch_up(self, budget: int | None = None) -> int:
        """Count what was appended since the last call; return the bytes read.

        `budget` caps the bytes read in this call so a caller can interleave other work.
        """
        try:
            size = os.stat(self.path).st_size
            if size == self.offset:
                return 0  # nothing new: a stat is cheaper than open, read and close
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return 0
        read_total = 0
        try:
            while budget is None or read_total < budget:
                count, wanted = self._read_once(fd)
                read_total += count
                # A short read past the size just seen is the end, for now: no read
                # that returns nothing is needed to tell.
                if count == 0 or (count < wanted and self.offset >= size):
                    break
        finally:
            os.close(fd)
        return read_total

    def _read_once(self, fd: int) -> tuple[int, int]:
        """Read and count the next chunk; return (bytes read, bytes asked for)."""
        if self._buffer is None:
            data: bytes | bytearray = os.pread(fd, SMALL_CHUNK, self.offset)
            count, wanted = len(data), SMALL_CHUNK
            if count == SMALL_CHUNK:
                self._buffer = bytearray(CHUNK)  # a big output: switch to the reused buffer
        else:
            data = self._buffer
            count, wanted = os.preadv(fd, [self._buffer], self.offset), CHUNK
        if count:
            self._keep(data, count)
            self.newlines += data.count(b"\n", 0, count)
            self.last_byte = data[count - 1]
            self.offset += count
        return count, wanted

    def _keep(self, data: bytes | bytearray, count: int) -> None:
        if self._content is None:
            return
        if self.offset + count > SMALL_CHUNK:
            self._content = None  # too big to keep: shaping reads the file
        else:
            self._content += data[:count]

    @property
    def lines(self) -> int:
        """Lines counted so far, a last line without newline included."""
        partial = self.last_byte is not None and self.last_byte != ord("\n")
        return self.newlines + (1 if partial else 0)

    def source(self) -> Source:
        """Where shaping reads what was counted: the bytes themselves when they were
        kept, else the file."""
        if self._content is not None and len(self._content) == self.offset:
            return bytes(self._content)
        return self.path


class MemoryStream:
    """A stream kept in memory when no spill file can be written.

    Holds the first `head_cap` bytes and (about) the last `tail_cap` bytes, with exact
    byte and line counts, so memory stays bounded whatever the command prints while
    every policy can still shape its shown part (their windows fit in 1 MiB).
    """

    def __init__(self, head_cap: int = WHOLE_READ_LIMIT, tail_cap: int = WHOLE_READ_LIMIT) -> None:
        self.head_cap = head_cap
        self.tail_cap = tail_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.newlines = 0
        self.last_byte: int | None = None
        self.last_write = 0.0

    def append(self, data: bytes) -> None:
        """Take the next bytes of the stream."""
        if not data:
            return
        self.total += len(data)
        self.newlines += data.count(b"\n")
        self.last_byte = data[-1]
        self.last_write = time.time()
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
        self.tail += data
        if len(self.tail) > 2 * self.tail_cap:
            del self.tail[: len(self.tail) - self.tail_cap]  # amortized trim

    @property
    def lines(self) -> int:
        """Lines so far, a last line without newline included."""
        partial = self.last_byte is not None and self.last_byte != ord("\n")
        return self.newlines + (1 if partial else 0)

    def read(self, offset: int, size: int) -> bytes:
        """Bytes `offset` to `offset + size` of the stream, as far as they are kept.

        A range inside the head is exact; otherwise only its part inside the kept
        tail is returned (the middle of a huge output is gone: that is the point).
        """
        offset = max(0, offset)
        end = min(self.total, offset + size)
        if end <= len(self.head):
            return bytes(self.head[offset:end])
        tail_start = self.total - len(self.tail)
        start = max(offset, tail_start)
        if start >= end:
            return b""
        return bytes(self.tail[start - tail_start : end - tail_start])


Source = Path | MemoryStream | bytes
"""Where a stream's bytes are: its spill file, memory when no file could be written, or
the whole (small) output as read while following its file."""


def _pread(path: Source, offset: int, size: int) -> bytes:
    offset = max(0, offset)
    if isinstance(path, MemoryStream):
        return path.read(offset, size)
    if isinstance(path, bytes):
        return path[offset : offset + size]
    # os calls, not a file object: that would cost an fstat, an ioctl and two lseeks.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks: list[bytes] = []
        while size > 0:
            chunk = os.pread(fd, size, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
            size -= len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Extras:
    """What a policy asks on top of plain sanitizing; all off, the text of the dialects
    that reproduce an existing tool (pipe, modes, pi, claude)."""

    detect_binary: bool = False
    reveal_invisible: bool = False
    last_frame: bool = False
    max_line_chars: int | None = None

    @classmethod
    def of(cls, policy: Policy) -> Extras:
        """The extras a dialect's policy turns on."""
        return cls(
            detect_binary=policy.detect_binary,
            reveal_invisible=policy.reveal_invisible,
            last_frame=policy.last_frame,
            max_line_chars=policy.max_line_chars,
        )


PLAIN = Extras()


def _clean(data: bytes, secrets: re.Pattern[str] | None, extras: Extras = PLAIN) -> str:
    text = sanitize(data)
    if extras.reveal_invisible:
        text = reveal_invisible(text)
    if extras.last_frame:
        text = last_frames(text)
    # Redaction last: nothing after it may rebuild a secret from pieces.
    return redact(text, secrets)


def _capped(text: str, extras: Extras) -> tuple[str, tuple[int, ...]]:
    """`text` with its long lines cut by the policy, and the numbers of the lines cut."""
    if extras.max_line_chars is None:
        return text, ()
    return cap_lines(text, extras.max_line_chars)


def _long_shown(cut_lines: tuple[int, ...], ranges: tuple[tuple[int, int], ...]) -> int:
    """How many of the (0-based) cut lines fall in the (1-based) shown ranges."""
    return sum(1 for number in cut_lines if any(a <= number + 1 <= b for a, b in ranges))


def _with_long_lines(info: TruncationInfo, shown_cut: int) -> TruncationInfo:
    """`info` counting `shown_cut` shown lines cut to the width cap (characters left out)."""
    if not shown_cut:
        return info
    return info.model_copy(update={"long_lines_cut": shown_cut, "truncated": True})


def _direction(policy: Truncation) -> str:
    match policy:
        case CharCap():
            return "head"
        case Middle() | HeadTailTokens():
            return "middle"
    return "tail"


def _binary(path: Source, size: int, total_lines: int, policy: Truncation) -> Shaped:
    """A binary stream: nothing shown, everything counted as left out (in the spill)."""
    if size <= WHOLE_READ_LIMIT:
        total_lines = _raw_lines(_pread(path, 0, size))
    info = TruncationInfo.model_validate(
        {
            "direction": _direction(policy),
            "truncated": True,
            "limit": None,
            "total_lines": total_lines,
            "total_bytes": size,
            "shown_lines": 0,
            "shown_bytes": 0,
            "binary": True,
        }
    )
    return Shaped("", info)


LineLimits = tuple[int | None, int | None]
"""A call's `head` and `tail` (None: not asked)."""
NO_LINE_LIMITS: LineLimits = (None, None)


def _shape_lines(
    path: Source, size: int, total_lines: int, lines: LineLimits, *, max_bytes: int,
    secrets: re.Pattern[str] | None, extras: Extras,
) -> Shaped | None:
    """The pi dialect's `head` / `tail`: the lines they ask for of the *whole* output (head
    first, then tail of what it kept), at most `max_bytes` of them, with counts that say
    which lines those are. A huge output's lines are read where they are in its file,
    never from the tail the policy keeps in view. None when they cannot be read (the
    middle of an output kept in memory is gone): the policy shapes it then."""
    head, tail = lines
    if size <= WHOLE_READ_LIMIT:
        raw = _pread(path, 0, size)
        text, _ = _capped(_clean(raw, secrets, extras), extras)
        cut = truncate.line_range(text, head, tail, max_bytes, total_lines=_raw_lines(raw))
        return Shaped(cut.text, cut.info.model_copy(update={"total_bytes": size}))
    first, last = truncate.wanted_lines(total_lines, head, tail)
    if first > last:  # `head: 0` or `tail: 0`
        return _nothing_shown(size, total_lines)
    if tail is None:
        return _shape_head_lines(path, size, total_lines, last, max_bytes=max_bytes,
                                 secrets=secrets, extras=extras)
    # The last lines of the first `last` lines: a tail of the file's first bytes.
    end = size if last == total_lines else _end_of_line(path, size, last)
    if end is None:
        return None
    policy = TailLines(max_lines=last - first + 1, max_bytes=max_bytes)
    shaped = _shape_tail(path, end, last, policy, secrets, digest=False, extras=extras)
    info = shaped.info.model_copy(update={
        "total_lines": total_lines, "total_bytes": size,
        "truncated": shaped.info.truncated or last < total_lines or first > 1,
        "limit": shaped.info.limit or "lines",
        "direction": "tail" if last == total_lines else "middle",
    })
    return Shaped(shaped.text, info)


def _shape_head_lines(
    path: Source, size: int, total_lines: int, head: int, *, max_bytes: int,
    secrets: re.Pattern[str] | None, extras: Extras,
) -> Shaped:
    """The first `head` lines of a huge output, at most `max_bytes` of them."""
    window = 2 * max_bytes + 64 * 1024
    while True:
        read = min(size, window)
        text, _ = _capped(_clean(_pread(path, 0, read), secrets, extras), extras)
        # Enough: every wanted line is whole in the window, or the window fills the cap.
        complete = text.count("\n") >= head
        if complete or read == size or truncate.utf8_len(text) > max_bytes or \
                window >= MAX_WINDOW:
            break
        window *= 4  # sanitizing removed much of the window: read further
    cut = truncate.line_range(text, head, None, max_bytes, total_lines=total_lines)
    return Shaped(cut.text, cut.info.model_copy(update={"total_bytes": size}))


def _nothing_shown(size: int, total_lines: int) -> Shaped:
    """`head: 0` or `tail: 0`: no line asked for."""
    info = TruncationInfo(direction="tail", truncated=total_lines > 0,
                          limit="lines" if total_lines else None, total_lines=total_lines,
                          total_bytes=size, shown_lines=0, shown_bytes=0)
    return Shaped("", info)


#: Bytes scanned at a time for newlines.
SCAN_CHUNK = 1024 * 1024


def _end_of_line(path: Source, size: int, line: int) -> int | None:
    """The offset just past line `line` (1-based) of the first `size` bytes (`size` when
    the stream has fewer lines); None when a part of it is not kept (memory)."""
    seen, offset = 0, 0
    while offset < size:
        chunk = _pread(path, offset, min(SCAN_CHUNK, size - offset))
        if not chunk:
            return None
        found = chunk.count(b"\n")
        if seen + found >= line:
            at = -1
            for _ in range(line - seen):
                at = chunk.index(b"\n", at + 1)
            return offset + at + 1
        seen += found
        offset += len(chunk)
    return size


@dataclass(frozen=True)
class Shaped:
    """What is shown of one stream, with its counts and the error digest of the cut."""

    text: str
    info: TruncationInfo
    digest: tuple[str, ...] = ()


def shape(  # noqa: PLR0911 - one return per policy
    path: Source,
    size: int,
    total_lines: int,
    policy: Truncation,
    secrets: re.Pattern[str] | None,
    *,
    digest: bool = False,
    extras: Extras = PLAIN,
    lines: LineLimits = NO_LINE_LIMITS,
) -> Shaped:
    """Shape the first `size` bytes of a file by a policy.

    Small outputs are read whole and cut exactly. Huge ones are read in windows: the
    shown text is exact. Totals are always those of the raw bytes (as the command wrote
    them); shown counts are those of the shown text. `total_lines` (the caller's count
    of the first `size` bytes) is used for huge outputs; small ones are counted here.
    `extras` are the policy's additions to sanitizing (native). `lines`: the call's
    `head` / `tail` (the pi dialect's), which pick lines of the whole output, within the
    policy's size (`_shape_lines`).
    """
    if size == 0:
        # Most streams of most calls are empty: no file read.
        cut = truncate.apply("", policy)
        return Shaped(cut.text, cut.info)
    if extras.detect_binary and looks_binary(_pread(path, 0, min(size, BINARY_SNIFF))):
        return _binary(path, size, total_lines, policy)
    if lines != NO_LINE_LIMITS:
        shaped = _shape_lines(path, size, total_lines, lines,
                              max_bytes=truncate.shown_limit(policy), secrets=secrets,
                              extras=extras)
        if shaped is not None:
            return shaped
    if size <= WHOLE_READ_LIMIT:
        return _shape_whole(path, size, policy, secrets, digest=digest, extras=extras)
    match policy:
        case TailLines() | ByteTail():
            return _shape_tail(
                path, size, total_lines, policy, secrets, digest=digest, extras=extras
            )
        case CharCap():
            return _shape_head(path, size, total_lines, policy, secrets, extras=extras)
        case Middle():
            return _shape_middle(path, size, total_lines, policy, secrets, extras=extras)
        case HeadTailTokens(max_tokens=count):
            # Only interactive reads (which cut their text whole) use it; a huge stream
            # shows its tail within the same budget.
            budget = TailLines(max_lines=1 << 30, max_bytes=max(1, count * 4))
            return _shape_tail(
                path, size, total_lines, budget, secrets, digest=digest, extras=extras
            )
    raise TypeError(f"unknown truncation policy {policy!r}")  # pragma: no cover


def _shape_whole(
    path: Source,
    size: int,
    policy: Truncation,
    secrets: re.Pattern[str] | None,
    *,
    digest: bool,
    extras: Extras,
) -> Shaped:
    """A small output, read whole and cut exactly."""
    raw = _pread(path, 0, size)
    text, cut_lines = _capped(_clean(raw, secrets, extras), extras)
    cut = truncate.apply(text, policy)
    cut_part = _cut_part(text, cut) if digest and cut.info.truncated else ""
    info = _with_long_lines(cut.info, _long_shown(cut_lines, cut.info.shown_ranges))
    # Totals are those of the raw bytes, as for huge outputs (sanitizing drops escape
    # sequences, so the clean text is smaller than what the command wrote).
    info = _raw_totals(info, len(raw), _raw_lines(raw))
    return Shaped(cut.text, info, truncate.error_digest(cut_part) if cut_part else ())


def _cut_part(text: str, cut: truncate.Cut) -> str:
    if cut.info.direction == "tail":
        return text[: len(text) - len(cut.text)]
    if cut.info.direction == "head":
        return text[len(cut.text) :]
    head, _, tail = cut.text.partition(truncate.SNIP)
    return text[len(head) : len(text) - len(tail)]


def _raw_lines(raw: bytes) -> int:
    """Lines of raw bytes, counted as `truncate.count_lines` counts text."""
    if not raw:
        return 0
    return raw.count(b"\n") + (0 if raw.endswith(b"\n") else 1)


def _raw_totals(
    info: TruncationInfo, size: int, total_lines: int, *, truncated: bool | None = None
) -> TruncationInfo:
    """`info` with the raw stream's totals; shown ranges re-anchored on them.

    Shown counts stay those of the shown text. `truncated` (when given) overrides the
    cut's own flag: a window of a huge file may fit the policy while the file does not.
    """
    ranges = info.shown_ranges
    if info.direction == "tail" and info.shown_lines:
        ranges = ((total_lines - info.shown_lines + 1, total_lines),)
    elif info.direction == "middle" and len(ranges) == 2:
        tail_count = ranges[1][1] - ranges[1][0] + 1
        ranges = (ranges[0], (total_lines - tail_count + 1, total_lines))
    update: dict[str, object] = {
        "total_lines": total_lines,
        "total_bytes": size,
        "shown_ranges": ranges,
    }
    if truncated is not None:
        update["truncated"] = truncated
        update["limit"] = (info.limit or "bytes") if truncated else None
    return info.model_copy(update=update)


def _shape_tail(
    path: Source,
    size: int,
    total_lines: int,
    policy: TailLines | ByteTail,
    secrets: re.Pattern[str] | None,
    *,
    digest: bool,
    extras: Extras,
) -> Shaped:
    window = 2 * policy.max_bytes + 64 * 1024
    while True:
        start = max(0, size - window)
        text = _clean(_pread(path, start, size - start), secrets, extras)
        if start > 0 and isinstance(policy, TailLines):
            # The window's first line is probably partial: drop it when others remain.
            newline = text.find("\n")
            if 0 <= newline < len(text) - 1:
                text = text[newline + 1 :]
        text, cut_lines = _capped(text, extras)
        cut = truncate.apply(text, policy)
        if cut.info.truncated or start == 0 or window >= MAX_WINDOW:
            break
        window *= 4  # Sanitizing removed much of the window: look further back.
    info = _with_long_lines(cut.info, _long_shown(cut_lines, cut.info.shown_ranges))
    # From the file's start the cut is exact; from a window, the file holds more.
    info = _raw_totals(info, size, total_lines, truncated=start > 0 or info.truncated)
    found: tuple[str, ...] = ()
    if digest:
        shown_raw = len(cut.text.encode("utf-8", "surrogatepass"))
        end = max(0, size - shown_raw)
        scan_from = max(0, end - DIGEST_SCAN)
        found = truncate.error_digest(_clean(_pread(path, scan_from, end - scan_from), secrets))
    return Shaped(cut.text, info, found)


def _shape_head(
    path: Source,
    size: int,
    total_lines: int,
    policy: CharCap,
    secrets: re.Pattern[str] | None,
    *,
    extras: Extras,
) -> Shaped:
    window = 4 * policy.max_chars + 64 * 1024
    read = min(size, window)
    text, cut_lines = _capped(_clean(_pread(path, 0, read), secrets, extras), extras)
    cut = truncate.char_cap(text, policy.max_chars)
    info = _with_long_lines(cut.info, _long_shown(cut_lines, cut.info.shown_ranges))
    info = _raw_totals(info, size, total_lines, truncated=read < size or info.truncated)
    if info.truncated:
        info = info.model_copy(update={"limit": "chars"})
    return Shaped(cut.text, info)


def _shape_middle(
    path: Source,
    size: int,
    total_lines: int,
    policy: Middle,
    secrets: re.Pattern[str] | None,
    *,
    extras: Extras,
) -> Shaped:
    window = 2 * policy.keep_bytes + 4096
    if size <= max(2 * policy.max_bytes, 2 * window):
        # Sanitizing may bring it under the limit: decide on the clean text. (Below two
        # windows, the head and tail windows would overlap.)
        raw = _pread(path, 0, size)
        text, cut_lines = _capped(_clean(raw, secrets, extras), extras)
        cut = truncate.middle(text, policy.max_bytes, policy.keep_bytes)
        info = _with_long_lines(cut.info, _long_shown(cut_lines, cut.info.shown_ranges))
        return Shaped(cut.text, _raw_totals(info, len(raw), _raw_lines(raw)))
    start, head_cut = _capped(_clean(_pread(path, 0, window), secrets, extras), extras)
    end, end_cut = _capped(_clean(_pread(path, size - window, window), secrets, extras), extras)
    head = truncate.utf8_head(start, policy.keep_bytes)
    tail = truncate.utf8_tail(end, policy.keep_bytes)
    partial = not head.endswith("\n") or not end[: len(end) - len(tail)].endswith("\n")
    info = truncate.middle_info(head, tail, total_lines, size, partial=partial)
    end_lines = truncate.count_lines(end)
    long_cut = _long_shown(head_cut, ((1, truncate.count_lines(head)),)) + _long_shown(
        end_cut, ((end_lines - truncate.count_lines(tail) + 1, end_lines),)
    )
    return Shaped(head + truncate.SNIP + tail, _with_long_lines(info, long_cut))


def read_slice(
    path: Path, offset: int, limit: int, secrets: re.Pattern[str] | None
) -> tuple[str, int, int]:
    """Read up to `limit` bytes from `offset`, ending on a line boundary when possible.

    Returns the clean text, the offset just past what was consumed, and the file size.
    A slice never ends inside a UTF-8 character, so consecutive slices lose nothing.
    """
    size = os.stat(path).st_size
    offset = min(max(0, offset), size)
    data = _pread(path, offset, min(limit, size - offset))
    if offset + len(data) < size:
        newline = data.rfind(b"\n")
        if newline >= 0:
            data = data[: newline + 1]
        elif (cut := utf8_boundary(data)) > 0:
            data = data[: escape_boundary(data[:cut])]
        elif data:
            # `limit` is smaller than the character at `offset`: return that one
            # character rather than nothing, so a reader always moves on.
            data = _pread(path, offset, min(4, size - offset))
            data = data[: utf8_boundary(data) or len(data)]
    return _clean(data, secrets), offset + len(data), size


# A terminal escape that `data` ends inside of: a control string still waiting for its
# terminator (its ESC \\ perhaps begun), a CSI or nF sequence still waiting for its final
# byte, a lone ESC, or an `ESC digit` that may yet be a status report. (C1 controls are
# two bytes in UTF-8, C2 80 to C2 9F.) Anchored at the end and possessive, so each
# candidate is scanned once.
_UNFINISHED = re.compile(
    rb"(?:(?:\x1b\]|\xc2\x9d)(?:[^\x07\x1b\xc2\n]|\xc2[^\x80-\x9f]|\x1b\x1b)*+\x1b?"
    rb"|(?:\x1b[PX^_]|\xc2[\x90\x98\x9e\x9f])"
    rb"(?:[^\x1b\xc2\n]|\xc2[^\x80-\x9f]|\x1b\x1b)*+\x1b?"
    rb"|(?:\x1b\[|\xc2\x9b)[0-?]*+[ -/]*+"
    rb"|\x1b[ -/]*+"
    rb"|\x1b[0-9])\Z"
)
#: How far back a slice's end is searched for an escape sequence it cuts in two.
_ESCAPE_LOOKBACK = 4096


def escape_boundary(data: bytes) -> int:
    """Length of `data` without a terminal escape cut off at its end.

    A slice that ends inside an escape sequence would show its pieces as text (the
    sanitizer removes a lone introducer, not what follows it): the next slice starts at
    the sequence instead. A sequence that fills the whole slice is kept, so a reader
    always moves on.
    """
    start = max(0, len(data) - _ESCAPE_LOOKBACK)
    found = _UNFINISHED.search(data, start)
    if found is None or found.start() == 0:
        return len(data)
    return found.start()
