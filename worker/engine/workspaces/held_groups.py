"""A workspace's cgroup that still held a process when a restore needed its name: set
aside under a name of its own, with a note naming it, for the reaper to remove once it
is empty.

A restore ends the workspace's keeper, removes its cgroup and makes the same group
again for the new keeper (`ws-<id>`: the name a restore keeps). A process the keeper's
end did not take (one still in the kernel's hands, or one a host's root moved in) keeps
the old directory from going; the new group could not take its name, and the old one,
named by no record once the restore saved its new one, would stay for good.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path

from bashfleet.worker.engine import cgroups
from bashfleet.worker.settings import Settings

#: The notes' ending, in the host's workspaces directory.
NOTE_SUFFIX = ".held-cgroup"


def set_aside(settings: Settings, ws_id: str, paths: list[str]) -> list[str]:
    """Rename `paths` (one group's directories, one a hierarchy) out of the workspace's
    name; the new paths. The note naming them is written first: a process that dies
    between the two leaves a note the reaper drops (its paths do not exist), never a
    group no note names."""
    tag = secrets.token_hex(4)
    moved = [f"{path}-held-{tag}" for path in paths]
    note = settings.workspaces_dir / f"ws-{ws_id}-{tag}{NOTE_SUFFIX}"
    note.write_text(json.dumps({"cgroup": moved}), encoding="utf-8")
    for path, target in zip(paths, moved, strict=True):
        with contextlib.suppress(FileNotFoundError):  # emptied and removed meanwhile
            os.rename(path, target)
    return moved


def remove_emptied(settings: Settings, timeout: float = 0.0) -> int:
    """Remove the groups set aside that no process holds any more, each note once its
    group is gone; how many groups went. `timeout`: how long each may wait for its
    last processes."""
    removed = 0
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(settings.workspaces_dir):
            if not entry.name.endswith(NOTE_SUFFIX):
                continue
            note = Path(entry.path)
            try:
                paths = json.loads(note.read_text("utf-8"))["cgroup"]
            except FileNotFoundError:
                continue  # another reaper's
            except (OSError, ValueError, KeyError, TypeError):
                note.unlink(missing_ok=True)  # not one of ours to act on: names nothing
                continue
            if cgroups.Group("v2", [(str(p), ()) for p in paths]).remove(timeout=timeout):
                note.unlink(missing_ok=True)
                removed += 1
    return removed
