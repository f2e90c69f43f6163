"""Which workspace a call without one gets from its cwd: the project (the allowed root's
child) its cwd is in, whether or not the cwd itself exists (then the call says so)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bashfleet.worker.engine.workspaces import project_dir
from bashfleet.worker.settings import Settings


@pytest.mark.parametrize(
    ("cwd", "project"),
    [
        ("src/app", "src/app"),
        ("src/app/lib/deep", "src/app"),
        ("src/app/missing/dir", "src/app"),  # a missing cwd: the call reports it from there
        ("src/app/file.txt", "src/app"),  # not a directory: the same
        ("src", "src"),  # the root itself
        ("src/nowhere/x", None),  # no such project: a fresh workspace
        ("elsewhere/app", None),  # not under an allowed root
        ("via-link/app", "src/app"),  # a symlink to the root: its real path
    ],
)
def test_project_dir(tmp_path: Path, cwd: str, project: str | None) -> None:
    (tmp_path / "src" / "app" / "lib" / "deep").mkdir(parents=True)
    (tmp_path / "src" / "app" / "file.txt").write_text("x")
    (tmp_path / "elsewhere" / "app").mkdir(parents=True)
    (tmp_path / "via-link").symlink_to(tmp_path / "src")
    settings = Settings(state_dir=tmp_path / "state", workspace_allow=(str(tmp_path / "src"),))
    found = project_dir(str(tmp_path / cwd), settings)
    assert found == (None if project is None else str(tmp_path / project))


def test_a_relative_or_missing_cwd_gets_a_fresh_workspace(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state", workspace_allow=(str(tmp_path),))
    assert project_dir("relative/dir", settings) is None
    assert project_dir(None, settings) is None


@pytest.mark.parametrize(
    ("state", "root", "accepted"),
    [
        # A root worker's defaults: /var/lib/bashfleet and its workspaces beside the
        # state the keepers keep (they once were the same directory: every workspace's
        # directory collided with its keeper's private files).
        ("/var/lib/bashfleet", None, True),
        ("/var/lib/bashfleet", "/var/lib/bashfleet", True),
        ("/srv/state", "/srv/state/workspace-state", False),
        ("/srv/state", "/srv/state/workspace-state/ws", False),
        ("/srv/state", "/srv/ws", True),
    ],
)
def test_the_workspace_root_lies_apart_from_the_keepers_files(
    state: str, root: str | None, accepted: bool
) -> None:
    if accepted:
        settings = Settings(state_dir=state, workspace_root=root)
        assert not settings.workspace_root_dir().is_relative_to(settings.workspaces_dir)
    else:
        with pytest.raises(ValueError, match="must lie apart"):
            Settings(state_dir=state, workspace_root=root)
