"""No spill file possible (unusable or full directory): the call still returns its output."""

from __future__ import annotations

import threading
from pathlib import Path

import psutil

from worker import Call, Policy, Settings, run_call

from .engine_helpers import (
    Engine,
    _engine_fixture,  # noqa: F401 - fixture
    _janitor_fixture,  # noqa: F401 - fixture
    survivors,
)


def _broken(tmp_path: Path) -> Settings:
    # A file where the spill directory should be: unusable even for root.
    state = tmp_path / "broken-state"
    state.mkdir()
    (state / "spill").write_text("not a directory")
    return Settings(state_dir=state, host="t")


def test_unusable_spill_directory_still_returns_the_output(tmp_path: Path) -> None:
    settings = _broken(tmp_path)
    result = run_call(
        Call(call_id="fallback-1", command="seq 1 100000; echo oops >&2; exit 2"),
        settings=settings,
    )
    assert result.exit_code == 2
    assert result.stdout.endswith("99999\n100000\n")
    assert result.stderr == "oops\n"
    assert result.stdout_truncation is not None
    assert result.stdout_truncation.total_lines == 100_000
    assert result.stdout_truncation.shown_lines == 2000
    assert result.spill is not None and result.spill.stdout_path is None
    assert result.spill.error is not None and "spill directory unusable" in result.spill.error


def test_nearly_full_spill_directory_keeps_small_output_whole(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, host="t", spill_min_free_bytes=10**18)
    result = run_call(
        Call(call_id="fallback-2", command="echo 1; echo 2 >&2; echo 3",
             policy=Policy(streams="combined")),
        settings=settings,
    )
    assert (result.exit_code, result.stdout, result.spill) == (0, "1\n2\n3\n", None)
    assert not (tmp_path / "spill" / "fallback-2.log").exists()


def test_memory_stays_bounded_without_spill_files(tmp_path: Path) -> None:
    settings = _broken(tmp_path)
    me = psutil.Process()
    before = me.memory_info().rss
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], me.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = run_call(
            Call(call_id="fallback-3", command="yes abcdefghij | head -c 200000000"),
            settings=settings,
        )
    finally:
        done.set()
        sampler.join()
    assert result.stdout_truncation is not None
    assert result.stdout_truncation.total_bytes == 200_000_000
    assert result.stdout_truncation.total_lines == 200_000_000 // 11 + 1
    assert (peak[0] - before) < 32 * 1024 * 1024


def test_timeout_kills_instead_of_backgrounding_and_the_engine_keeps_serving(
    engine: Engine, tmp_path: Path
) -> None:
    settings = _broken(tmp_path)
    marker = engine.janitor.new_call_id()
    engine.janitor.markers.add(marker)
    result = run_call(
        Call(call_id=marker, command="echo started; sleep 30", timeout_s=0.5,
             policy=Policy(on_timeout="background", kill_grace_s=0.2)),
        settings=settings,
    )
    assert result.timed_out and not result.backgrounded and result.job is None
    assert result.signal == 15 and result.stdout == "started\n"
    assert survivors(marker) == []
    # The next call, with a usable spill directory, uses files again.
    again = engine.run("echo fine")
    assert (again.exit_code, again.stdout) == (0, "fine\n")
