"""What the repository holds (a 590 KB wheel of google-re2 once sat at its root, used by
nothing)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def tracked(pattern: str) -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (the installed package's tests run outside one)")
    done = subprocess.run(["git", "ls-files", "--", pattern], cwd=ROOT, capture_output=True,
                          text=True, check=True, timeout=30)
    return done.stdout.split()


@pytest.mark.parametrize("pattern", ["*.whl", "*.tar.gz", "*.egg", "*.pyc"])
def test_no_built_artifact_is_checked_in(pattern: str) -> None:
    assert tracked(pattern) == []
