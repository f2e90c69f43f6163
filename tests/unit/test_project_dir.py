"""Which workspace a call without one gets from its cwd: the project (the allowed root's
child) its cwd is in, whether or not the cwd itself exists (then the call says so)."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.engine.workspaces import project_dir
from worker.settings import Settings


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
