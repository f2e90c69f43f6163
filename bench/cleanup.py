"""What a benchmark leaves running once its workers stopped: the workspaces (and their
keepers) of every host state directory under its temporary root. Workspaces outlive a
worker by design; a benchmark's hosts are gone for good, so nothing else would end them."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from bashfleet.worker.engine import teardown


def end_hosts_under(root: Path) -> int:
    """`teardown.end_host` for every host state directory under `root` (those holding a
    `workspace-state` directory); how many workspaces and stray keepers were ended."""
    return teardown.end_hosts_under(root, _own_workspace_root)


def _own_workspace_root(state_dir: Path) -> Path | None:
    own = workspace_root(state_dir)
    return own if own.is_dir() else None


def workspace_root(state_dir: Path) -> Path:
    """A benchmark worker's workspace root: beside its state directory, in the run's own
    temporary root (a root worker's default, /var/lib/bashfleet/workspaces, is the
    host's: output directories a run left there would outlive the state directory whose
    markers name them)."""
    return state_dir.with_name(f"{state_dir.name}-workspaces")


@contextlib.contextmanager
def hosts_ended(root: Path, *, remove: bool = False) -> Iterator[None]:
    """`end_hosts_under(root)` when the block ends (its workers stopped by then).
    `remove`: `root` is the run's own temporary directory, removed too once the block
    ended well; one that failed keeps it, its logs to look at."""
    try:
        yield
    finally:
        end_hosts_under(root)
    if remove:
        shutil.rmtree(root, ignore_errors=True)
