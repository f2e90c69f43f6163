"""No spill file possible (unusable or full directory): the call still returns its output.

A call's spill files go to its workspace's output directory; here that directory is
made unusable (a file in its place, as a broken disk or a careless clean-up would leave
it), or the host's free-space floor is set above any disk's."""

from __future__ import annotations

import threading
from pathlib import Path

import psutil

from bashfleet.worker import Policy
from bashfleet.worker.wire.models import WorkspaceRecord

from .engine_helpers import (
    Engine,
    Janitor,
    _engine_fixture,  # noqa: F401 - fixture
    _janitor_fixture,  # noqa: F401 - fixture
    engine_with,
    spill_files,
    survivors,
)


def _broken_workspace(engine: Engine) -> WorkspaceRecord:
    """A session workspace whose output directory is a file: unusable even for root."""
    record = engine.workspace()
    out = Path(record.out_dir)
    out.rmdir()
    out.write_text("not a directory")
    return record


def test_unusable_spill_directory_still_returns_the_output(engine: Engine) -> None:
    broken = _broken_workspace(engine)
    result = engine.run("seq 1 100000; echo oops >&2; exit 2", workspace=broken.id)
    assert result.exit_code == 2
    assert result.stdout.endswith("99999\n100000\n")
    assert result.stderr == "oops\n"
    assert result.stdout_truncation is not None
    assert result.stdout_truncation.total_lines == 100_000
    assert result.stdout_truncation.shown_lines == 2000
    assert result.spill is not None and result.spill.stdout_path is None
    assert result.spill.error is not None and "spill directory unusable" in result.spill.error


def test_nearly_full_spill_directory_keeps_small_output_whole(
    tmp_path: Path, janitor: Janitor
) -> None:
    with engine_with(tmp_path, janitor, spill_min_free_bytes=10**18) as engine:
        result = engine.run("echo 1; echo 2 >&2; echo 3", policy=Policy(streams="combined"))
        assert (result.exit_code, result.stdout, result.spill) == (0, "1\n2\n3\n", None)
        assert spill_files(engine.settings, result.call_id) == []


def test_memory_stays_bounded_without_spill_files(engine: Engine) -> None:
    broken = _broken_workspace(engine)
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
        result = engine.run("yes abcdefghij | head -c 200000000", workspace=broken.id)
    finally:
        done.set()
        sampler.join()
    assert result.spill is not None and result.spill.stdout_path is None, "no file was used"
    assert result.stdout_truncation is not None
    assert result.stdout_truncation.total_bytes == 200_000_000
    assert result.stdout_truncation.total_lines == 200_000_000 // 11 + 1
    assert (peak[0] - before) < 32 * 1024 * 1024


def test_timeout_kills_instead_of_backgrounding_and_the_engine_keeps_serving(
    engine: Engine,
) -> None:
    broken = _broken_workspace(engine)
    result = engine.run("echo started; sleep 30", workspace=broken.id, timeout_s=0.5,
                        policy=Policy(on_timeout="background", kill_grace_s=0.2))
    assert result.timed_out and not result.backgrounded and result.job is None
    assert result.signal == 15 and result.stdout == "started\n"
    assert survivors(result.call_id) == []
    # The next call, with a usable spill directory, uses files again.
    again = engine.run("seq 5000")
    assert (again.exit_code, again.stdout.endswith("5000\n")) == (0, True)
    assert again.spill is not None and again.spill.stdout_path is not None
    assert Path(again.spill.stdout_path).stat().st_size == again.spill.stdout_bytes
