"""/proc/self/mountinfo read as text: which mount holds a path, and what it is.

Pure: the callers read the file (`/proc/self/mountinfo`, or their own namespace's)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from bashfleet.worker.engine.layout import inside


@dataclass(frozen=True)
class MountEntry:
    """One line of mountinfo, the fields used here."""

    point: str
    """Where it is mounted."""
    root: str
    """The directory of its file system mounted there (`/` but for a bind mount)."""
    fs_type: str


def unescape(text: str) -> str:
    """A path as mountinfo writes it (space, tab, newline and backslash in octal)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def entries(text: str) -> list[MountEntry]:
    """Every well-formed line, in the file's order (a garbled one is skipped)."""
    found = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if sep and len(fields) >= 5 and tail:
            found.append(MountEntry(unescape(fields[4]), unescape(fields[3]), tail[0]))
    return found


def holding(text: str, path: str) -> MountEntry | None:
    """The mount `path` (absolute, links resolved) lies on: the deepest mount point that
    is `path` or one of its parents, the last listed there (it hides the earlier ones)."""
    best: MountEntry | None = None
    for entry in entries(text):
        if inside(path, entry.point) and (best is None or len(entry.point) >= len(best.point)):
            best = entry
    return best
