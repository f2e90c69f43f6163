"""What a fork's snapshot holds when it stands on the workspace's last fork's snapshot:
only what changed since (pure planning; `snapshots` copies what the plan names).

A workspace forked again and again between small steps (an agent's tree search, an
episode that forks after each action) changes a few files between two forks. The last
fork's snapshot holds a copy of every own layer as they were then (`fork_reuse`), and
its listing says what each entry was (`snapshots.Stamp`). The next snapshot can then be
a thin layer above it: the entries whose stamp differs, and a whiteout for each entry
gone since. Seen through an overlay, the thin layer over the last snapshot is the
workspace as it is now:

- an entry new or changed, not a directory: copied (it hides the older one beneath);
- a directory new, or where something else was: copied with all it holds (a directory
  over a non-directory hides it whole; nothing of the last snapshot is beneath it);
- a directory both had, changed or holding a change: made in the thin layer with its
  metadata as it is now, merged by the overlay with the one beneath;
- an entry gone: a whiteout, at the topmost place gone (what was beneath a directory
  gone is hidden with it; beneath an entry of another kind now, by that entry).

A directory both had must not be opaque, nor anything carry an overlay redirect: the
caller looks and takes a whole copy instead (`snapshots`). So does a plan bigger than
`MAX_ENTRIES` or `MAX_BYTES` (it is copied with the workspace frozen), and a chain of
thin layers `MAX_CHAIN` deep (each is a lower of every fork's overlays).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass

#: Entries a thin snapshot may copy (its directories and whiteouts counted in): it is
#: copied with the workspace frozen, so a bigger change takes a whole copy, which
#: copies while the workspace runs.
MAX_ENTRIES = 512
#: Bytes of file data a thin snapshot may copy (as the listing's blocks say).
MAX_BYTES = 32 * 2**20
#: Snapshots a fork's own layers may stack (the whole copy at the bottom counted).
MAX_CHAIN = 4

#: Relative path -> (stamp, blocks): one layer's listing (`snapshots._listing`).
Listing = Mapping[str, tuple[tuple[int, ...], int]]


@dataclass(frozen=True)
class LayerDelta:
    """What one own layer's thin snapshot holds, each a path relative to the layer."""

    copy: tuple[str, ...] = ()
    """Entries copied whole: files, links, devices, and new directories with all they
    hold."""
    dirs: tuple[str, ...] = ()
    """Directories the last snapshot had too, made here with their metadata as it is now
    (the parents of what is copied are made as well)."""
    whiteouts: tuple[str, ...] = ()
    """Entries gone since the last snapshot, hidden from it."""
    entries: int = 0
    """Entries the plan makes (everything a copy holds counted)."""
    bytes: int = 0
    """Bytes of the files it copies (their blocks)."""

    def empty(self) -> bool:
        return not (self.copy or self.dirs or self.whiteouts)


def _is_dir(entry: tuple[tuple[int, ...], int]) -> bool:
    return stat.S_ISDIR(entry[0][0])


def under(rel: str, tops: set[str]) -> bool:
    """Whether `rel` is one of `tops` or beneath one."""
    parts = rel.split("/")
    return any("/".join(parts[:end]) in tops for end in range(1, len(parts) + 1))


def layer_delta(old: Listing, new: Listing) -> LayerDelta:
    """The thin layer that, over a copy of what `old` lists, shows what `new` lists."""
    copy: list[str] = []
    dirs: list[str] = []
    whole: set[str] = set()
    entries = blocks = 0
    for rel in sorted(new):  # a directory before what it holds
        if not rel:
            continue  # the layer's own directory: always made, as it is now
        if under(rel, whole):
            entries += 1
            blocks += new[rel][1]
            continue
        now, before = new[rel], old.get(rel)
        if before is not None and before[0] == now[0]:
            continue
        if _is_dir(now) and before is not None and _is_dir(before):
            dirs.append(rel)
        else:
            copy.append(rel)
            if _is_dir(now):
                whole.add(rel)
            blocks += now[1]
        entries += 1
    whiteouts = []
    for rel in sorted(set(old) - set(new)):
        parent = os.path.dirname(rel)
        # Only where the parent is a directory both have: a parent gone has its own
        # whiteout, one of another kind now hides it (a directory where there was none is
        # copied whole, with nothing beneath it).
        if parent in new and _is_dir(new[parent]) and parent in old and _is_dir(old[parent]):
            whiteouts.append(rel)
    entries += len(whiteouts)
    return LayerDelta(tuple(copy), tuple(dirs), tuple(whiteouts), entries, blocks * 512)


def plan(old: Mapping[str, Listing], new: Mapping[str, Listing], *,
         max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES
         ) -> dict[str, LayerDelta] | None:
    """Each own layer's thin snapshot over the last fork's (`old`: what its copy holds,
    `new`: the workspace's layers now), or None when a whole copy is the way: the two
    list other layers, or the change is past `max_entries` or `max_bytes`."""
    if set(old) != set(new):
        return None
    deltas = {name: layer_delta(old[name], new[name]) for name in new}
    if sum(d.entries for d in deltas.values()) > max_entries or \
            sum(d.bytes for d in deltas.values()) > max_bytes:
        return None
    return deltas
