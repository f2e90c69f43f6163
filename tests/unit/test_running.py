"""bashfleet.worker.engine.running: running-call records are written whole and found again."""

from __future__ import annotations

import json
from pathlib import Path

from bashfleet.worker.engine import running
from bashfleet.worker.settings import Settings


def _entry(call_id: str = "c1") -> running.RunningCall:
    return running.RunningCall(
        call_id=call_id, pid=123, pgid=123, marker=call_id, start_time=1.5,
        worker_pid=99, instance="i1", kill_grace_s=0.5,
    )


def test_save_load_remove(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state", host="h")
    entry = _entry()
    running.save(settings, entry)  # the directory does not exist yet
    folder = running.directory(settings)
    assert folder.stat().st_mode & 0o777 == 0o700
    assert [p.name for p in folder.iterdir()] == ["c1.json"], "no temporary file left"
    assert json.loads((folder / "c1.json").read_text())["pid"] == 123
    assert running.load(settings, "c1") == entry
    assert running.all_calls(settings) == [entry]
    running.remove(settings, "c1")
    running.remove(settings, "c1")  # already gone: fine
    assert running.load(settings, "c1") is None
    assert list(folder.iterdir()) == []


def test_save_replaces_a_record_and_recreates_a_removed_directory(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, host="h")
    running.save(settings, _entry())
    changed = _entry().model_copy(update={"pid": 456})
    running.save(settings, changed)
    assert running.load(settings, "c1") == changed
    running.remove(settings, "c1")
    running.directory(settings).rmdir()
    running.save(settings, _entry("c2"))
    assert running.all_calls(settings) == [_entry("c2")]
