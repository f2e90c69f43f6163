"""What a benchmark leaves running once its workers stopped: the workspaces (and their
keepers) of every host state directory under its temporary root. Workspaces outlive a
worker by design; a benchmark's hosts are gone for good, so nothing else would end them."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from bashfleet.worker.engine import teardown
from bashfleet.worker.settings import Settings


def end_hosts_under(root: Path) -> int:
    """`teardown.end_host` for every host state directory under `root` (those holding a
    `workspace-state` directory); how many workspaces and stray keepers were ended."""
    ended = 0
    for folder, dirs, _ in os.walk(root):
        if "workspace-state" in dirs:
            own = workspace_root(Path(folder))
            done = teardown.end_host(Settings(state_dir=Path(folder),
                                              workspace_root=own if own.is_dir() else None))
            ended += done.workspaces + done.keepers
            dirs.remove("workspace-state")
    return ended


def workspace_root(state_dir: Path) -> Path:
    """A benchmark worker's workspace root: beside its state directory, in the run's own
    temporary root (a root worker's default, /var/lib/bashfleet/workspaces, is the
    host's: output directories a run left there would outlive the state directory whose
    markers name them)."""
    return state_dir.with_name(f"{state_dir.name}-workspaces")


@contextlib.contextmanager
def hosts_ended(root: Path) -> Iterator[None]:
    """`end_hosts_under(root)` when the block ends (its workers stopped by then)."""
    try:
        yield
    finally:
        end_hosts_under(root)
