"""Capture a stream into a file, count it while it grows, and shape what is shown.

Commands write straight into their spill file (the kernel does the copying, so a
command printing a gigabyte costs what a redirect costs). The engine follows the
file as it grows to count lines, so counts stay exact and memory stays bounded
whatever the command prints; at the end it reads only the windows a policy shows.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from worker import truncate
from worker.models import ByteTail, CharCap, Middle, TailLines, Truncation, TruncationInfo
from worker.sanitize import redact, sanitize

#: Chunk read while following a file: bounds the memory a huge output costs.
CHUNK = 4 * 1024 * 1024
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
    _handle: object = field(default=None, repr=False)

    def catch_up(self, budget: int | None = None) -> int:
        """Count what was appended since the last call; return the bytes read.

        `budget` caps the bytes read in this call so a caller can interleave other work.
        """
        read_total = 0
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                while budget is None or read_total < budget:
                    chunk = handle.read(CHUNK)
                    if not chunk:
                        break
                    self.newlines += chunk.count(b"\n")
                    self.last_byte = chunk[-1]
                    self.offset += len(chunk)
                    read_total += len(chunk)
        except FileNotFoundError:
            pass
        return read_total

    @property
    def lines(self) -> int:
        """Lines counted so far, a last line without newline included."""
        partial = self.last_byte is not None and self.last_byte != ord("\n")
        return self.newlines + (1 if partial else 0)


def _pread(path: Path, offset: int, size: int) -> bytes:
    with open(path, "rb") as handle:
        handle.seek(max(0, offset))
        return handle.read(size)


def _clean(data: bytes, secrets: re.Pattern[str] | None) -> str:
    return redact(sanitize(data), secrets)


@dataclass(frozen=True)
class Shaped:
    """What is shown of one stream, with its counts and the error digest of the cut."""

    text: str
    info: TruncationInfo
    digest: tuple[str, ...] = ()


def shape(
    path: Path,
    size: int,
    total_lines: int,
    policy: Truncation,
    secrets: re.Pattern[str] | None,
    *,
    digest: bool = False,
) -> Shaped:
    """Shape the first `size` bytes of a file by a policy.

    Small outputs are read whole and cut exactly. Huge ones are read in windows:
    the shown text is exact, totals are the file's own byte and line counts.
    """
    if size <= WHOLE_READ_LIMIT:
        text = _clean(_pread(path, 0, size), secrets)
        cut = truncate.apply(text, policy)
        cut_part = _cut_part(text, cut) if digest and cut.info.truncated else ""
        return Shaped(cut.text, cut.info, truncate.error_digest(cut_part) if cut_part else ())
    match policy:
        case TailLines() | ByteTail():
            return _shape_tail(path, size, total_lines, policy, secrets, digest)
        case CharCap():
            return _shape_head(path, size, total_lines, policy, secrets)
        case Middle():
            return _shape_middle(path, size, total_lines, policy, secrets)
    raise TypeError(f"unknown truncation policy {policy!r}")  # pragma: no cover


def _cut_part(text: str, cut: truncate.Cut) -> str:
    if cut.info.direction == "tail":
        return text[: len(text) - len(cut.text)]
    if cut.info.direction == "head":
        return text[len(cut.text) :]
    return text


def _shape_tail(
    path: Path,
    size: int,
    total_lines: int,
    policy: TailLines | ByteTail,
    secrets: re.Pattern[str] | None,
    digest: bool,
) -> Shaped:
    window = 2 * policy.max_bytes + 64 * 1024
    while True:
        start = max(0, size - window)
        text = _clean(_pread(path, start, size - start), secrets)
        if start > 0 and isinstance(policy, TailLines):
            # The window's first line is probably partial: drop it when others remain.
            newline = text.find("\n")
            if 0 <= newline < len(text) - 1:
                text = text[newline + 1 :]
        cut = truncate.apply(text, policy)
        if cut.info.truncated or start == 0 or window >= MAX_WINDOW:
            break
        window *= 4  # Sanitizing removed much of the window: look further back.
    info = _tail_totals(cut.info, size, total_lines)
    found: tuple[str, ...] = ()
    if digest:
        shown_raw = len(cut.text.encode("utf-8", "surrogatepass"))
        end = max(0, size - shown_raw)
        scan_from = max(0, end - DIGEST_SCAN)
        found = truncate.error_digest(_clean(_pread(path, scan_from, end - scan_from), secrets))
    return Shaped(cut.text, info, found)


def _tail_totals(info: TruncationInfo, size: int, total_lines: int) -> TruncationInfo:
    first = total_lines - info.shown_lines + 1
    return info.model_copy(
        update={
            "truncated": True,
            "limit": info.limit or "bytes",
            "total_lines": total_lines,
            "total_bytes": size,
            "shown_ranges": ((first, total_lines),) if info.shown_lines else (),
        }
    )


def _shape_head(
    path: Path,
    size: int,
    total_lines: int,
    policy: CharCap,
    secrets: re.Pattern[str] | None,
) -> Shaped:
    window = 4 * policy.max_chars + 64 * 1024
    text = _clean(_pread(path, 0, min(size, window)), secrets)
    cut = truncate.char_cap(text, policy.max_chars)
    info = cut.info.model_copy(
        update={
            "truncated": True,
            "limit": "chars",
            "total_lines": total_lines,
            "total_bytes": size,
        }
    )
    return Shaped(cut.text, info)


def _shape_middle(
    path: Path,
    size: int,
    total_lines: int,
    policy: Middle,
    secrets: re.Pattern[str] | None,
) -> Shaped:
    if size <= 2 * policy.max_bytes:
        # Sanitizing may bring it under the limit: decide on the clean text.
        text = _clean(_pread(path, 0, size), secrets)
        cut = truncate.middle(text, policy.max_bytes, policy.keep_bytes)
        return Shaped(cut.text, cut.info)
    window = 2 * policy.keep_bytes + 4096
    head = truncate.utf8_head(_clean(_pread(path, 0, window), secrets), policy.keep_bytes)
    tail = truncate.utf8_tail(_clean(_pread(path, size - window, window), secrets),
                              policy.keep_bytes)
    head_lines, tail_lines = truncate.count_lines(head), truncate.count_lines(tail)
    info = TruncationInfo(
        direction="middle",
        truncated=True,
        limit="bytes",
        total_lines=total_lines,
        total_bytes=size,
        shown_lines=head_lines + tail_lines,
        shown_bytes=truncate.utf8_len(head) + truncate.utf8_len(tail),
        partial_line=True,
        shown_ranges=((1, head_lines), (total_lines - tail_lines + 1, total_lines)),
    )
    return Shaped(head + truncate.SNIP + tail, info)


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
        else:
            data = data[: _utf8_boundary(data)]
    return _clean(data, secrets), offset + len(data), size


def _utf8_boundary(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a character."""
    end = len(data)
    back = 0
    while back < 4 and end - back - 1 >= 0 and (data[end - back - 1] & 0xC0) == 0x80:
        back += 1
    if end - back - 1 >= 0:
        lead = data[end - back - 1]
        need = 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 1
        if need > back + 1:
            return end - back - 1
    return end
