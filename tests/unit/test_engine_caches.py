"""The engine's per-call checks that are cached: spill directory space, bash's path."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from bashfleet.worker.engine import call
from bashfleet.worker.engine.memo import TimedMemo
from bashfleet.worker.settings import Settings


@pytest.fixture(name="statvfs_calls")
def _statvfs_calls_fixture(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = os.statvfs

    def counting(path: str | os.PathLike[str]) -> os.statvfs_result:
        calls.append(str(path))
        return real(path)

    monkeypatch.setattr(call, "_spill_verdicts", TimedMemo(ttl_s=1.0))
    monkeypatch.setattr(os, "statvfs", counting)
    return calls


def test_spill_check_is_reused_within_its_ttl(tmp_path: Path, statvfs_calls: list[str]) -> None:
    settings = Settings(state_dir=tmp_path, host="h")
    assert call.spill_problem(settings, settings.spill_dir) is None
    assert call.spill_problem(settings, settings.spill_dir) is None
    assert len(statvfs_calls) == 1


def test_spill_check_is_per_directory_and_threshold(
    tmp_path: Path, statvfs_calls: list[str]
) -> None:
    roomy = Settings(state_dir=tmp_path, host="h")
    roomy.spill_dir.mkdir()
    full = Settings(state_dir=tmp_path, host="h", spill_min_free_bytes=10**18)
    other = Settings(state_dir=tmp_path / "other", host="h")
    assert call.spill_problem(roomy, roomy.spill_dir) is None
    problem = call.spill_problem(full, full.spill_dir)
    assert problem is not None and "nearly full" in problem
    assert call.spill_problem(other, other.spill_dir) is None  # missing: the first call creates it
    assert call.spill_problem(roomy, roomy.spill_dir) is None
    assert len(statvfs_calls) == 3


def test_spill_check_runs_again_after_its_ttl(
    tmp_path: Path, statvfs_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(state_dir=tmp_path, host="h")
    monkeypatch.setattr(call._spill_verdicts, "ttl_s", 0.0)
    call.spill_problem(settings, settings.spill_dir)
    call.spill_problem(settings, settings.spill_dir)
    assert len(statvfs_calls) == 2


def test_bash_path_is_what_a_path_search_finds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(call, "_bash_paths", TimedMemo(ttl_s=10.0))
    path = os.environ["PATH"]
    assert call._bash_path({"PATH": path}) == shutil.which("bash", path=path)
    assert call._bash_path({"PATH": "/nonexistent-bin"}) is None
    # Without PATH, Popen searches os.defpath.
    assert call._bash_path({}) == shutil.which("bash", path=os.defpath)


@pytest.mark.parametrize("path", ["bin:/usr/bin", "/usr/bin::/bin", ""])
def test_relative_path_entries_leave_the_search_to_popen(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    monkeypatch.setattr(call, "_bash_paths", TimedMemo(ttl_s=10.0))
    assert call._bash_path({"PATH": path}) is None


def test_bash_path_is_searched_once_per_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    searches: list[str | None] = []

    def which(name: str, path: str | None = None) -> str:
        searches.append(path)
        return "/found/bash"

    monkeypatch.setattr(call, "_bash_paths", TimedMemo(ttl_s=10.0))
    monkeypatch.setattr(shutil, "which", which)
    env = {"PATH": "/a:/b"}
    assert call._bash_path(env) == call._bash_path(env) == "/found/bash"
    assert searches == ["/a:/b"]
    monkeypatch.setattr(call._bash_paths, "ttl_s", 0.0)
    call._bash_path(env)
    assert searches == ["/a:/b", "/a:/b"]
