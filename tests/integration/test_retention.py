"""Retention on a real host's files: live jobs and running calls kept, the rest aged out.

Jobs and calls are real (`worker.run_call` in a private state dir and workspace root);
their files are made old with `os.utime`, so no test waits for days. Every job is ended
with `worker.kill_job` (and the janitor sweeps whatever a failing test leaves).

The files a host keeps: job records in the state directory, and, since workspaces, the
kept spill files of calls and the output of jobs in each workspace's output directory
(`<workspace root>/.out/<workspace id>/`), which outlives a throwaway workspace.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from bashfleet.worker import CallResult, JobRecord, Policy, kill_job, load_record
from bashfleet.worker.engine.jobs.jobs import read_status
from bashfleet.worker.engine.running import RunningCall, remove, save
from bashfleet.worker.engine.watcher import Spawned
from bashfleet.worker.retention import RetentionPolicy, execute, plan, scan

from .engine_helpers import (
    DEADLINE_S,
    Engine,
    Watch,
    _engine_fixture,  # noqa: F401 - fixture
    _janitor_fixture,  # noqa: F401 - fixture
    output_dirs,
    spill_files,
    wait_until,
)

DAY = 86400.0
#: The defaults: seven days, 10 GiB, one hour.
LIMITS = RetentionPolicy(max_age_s=7 * DAY, max_bytes=10 * 1024**3, min_age_s=3600.0)
AUTO = Policy(on_timeout="background", kill_grace_s=0.5)


def _age(paths: list[Path], days: float) -> None:
    stamp = time.time() - days * DAY
    for path in paths:
        os.utime(path, (stamp, stamp))


def _state_files(engine: Engine) -> list[Path]:
    """Every file the host keeps for calls and jobs: spill files and job output in the
    workspaces' output directories, job records and statuses in the state directory."""
    found: list[Path] = []
    for folder in (engine.settings.spill_dir, engine.settings.jobs_dir):
        if folder.is_dir():
            found += sorted(p for p in folder.iterdir() if p.is_file())
    found += sorted(p for p in output_dirs(engine.settings).glob("*/*") if p.is_file())
    return found


def _job_paths(record: JobRecord, engine: Engine) -> list[Path]:
    """Every file of the job that exists: record, output (in its workspace's output
    directory), status."""
    named = [record.output_path, record.status_path, record.stderr_path,
             str(engine.settings.jobs_dir / f"{record.id}.json")]
    return [Path(p) for p in named if p and Path(p).exists()]


def _record(engine: Engine, result: CallResult) -> JobRecord:
    assert result.job is not None, result
    return load_record(result.job.id, engine.settings)


def _finished_call_with_spill(engine: Engine) -> CallResult:
    # Output past the tail limit keeps its spill file (the full output's only copy).
    result = engine.run("seq 1 5000")
    assert result.exit_code == 0 and result.spill is not None, result
    return result


def test_live_jobs_are_kept_then_removed_once_ended_and_old(engine: Engine) -> None:
    auto = engine.run("echo up; echo err >&2; sleep 300", timeout_s=0.3, policy=AUTO)
    assert auto.backgrounded, auto
    detached = engine.run("echo bg; sleep 300", background=True)
    assert detached.backgrounded, detached
    auto_job, bg_job = _record(engine, auto), _record(engine, detached)
    # The auto-backgrounded job goes on writing its spill files, in its workspace's
    # output directory.
    assert auto.job is not None and auto.job.workspace is not None
    assert Path(auto_job.output_path).parent == output_dirs(engine.settings) / auto.job.workspace
    assert auto_job.stderr_path is not None
    finished = _finished_call_with_spill(engine)
    assert finished.spill is not None and finished.spill.stdout_path is not None
    old_call = Path(finished.spill.stdout_path)

    files = _state_files(engine)
    _age(files, days=30)
    live = plan(scan(engine.settings), LIMITS)
    removing = {Path(r.path) for r in live.removals}
    for record in (auto_job, bg_job):
        assert not removing & set(_job_paths(record, engine)), record.id
    assert {h.group: h.reason for h in live.held} == {
        f"job {auto_job.id}": "live_job", f"job {bg_job.id}": "live_job",
    }
    assert old_call in removing and all(r.reason == "max_age" for r in live.removals)
    outcome = execute(live)
    assert not outcome.errors and not outcome.skipped
    assert not old_call.exists()
    for record in (auto_job, bg_job):
        assert all(p.exists() for p in _job_paths(record, engine))

    # Ended, but just now: their last writes (completion line, status) are too young.
    for record in (auto_job, bg_job):
        killed = kill_job(record, grace_s=0.5, settings=engine.settings)
        assert not killed.running, killed
    wait_until(lambda: all(read_status(r) for r in (auto_job, bg_job)),
               what="both jobs' end recorded")
    young = plan(scan(engine.settings), LIMITS)
    assert young.removals == ()
    assert {h.reason for h in young.held} == {"min_age"}

    ended_files = [p for r in (auto_job, bg_job) for p in _job_paths(r, engine)]
    _age(ended_files, days=8)
    ended = plan(scan(engine.settings), LIMITS)
    assert {Path(r.path) for r in ended.removals} == set(ended_files)
    assert {r.group for r in ended.removals} == {f"job {auto_job.id}", f"job {bg_job.id}"}
    outcome = execute(ended)
    assert not outcome.errors and not outcome.skipped
    assert _state_files(engine) == []


def test_a_running_foreground_calls_spill_files_are_kept(engine: Engine) -> None:
    # What the fleet's exec task does: record the call on disk as soon as its bash exists.
    gate = engine.tmp / "gate"
    call = engine.call(f"echo started; until [ -e {gate} ]; do sleep 0.01; done")
    spawned = threading.Event()

    class RecordOnDisk(Watch):
        def spawned(self, process: Spawned) -> None:
            save(engine.settings, RunningCall(
                call_id=call.call_id, pid=process.pid, pgid=process.pgid,
                marker=process.marker, start_time=time.time(), worker_pid=os.getpid(),
                instance="test",
            ))
            spawned.set()

    results: list[CallResult] = []
    runner = threading.Thread(
        target=lambda: results.append(engine.run(call.command, call_id=call.call_id,
                                                 watcher=RecordOnDisk())),
    )
    runner.start()
    try:
        assert spawned.wait(DEADLINE_S)
        spill = wait_until(lambda: spill_files(engine.settings, call.call_id),
                           what="the call's spill files")
        stdout = next(p for p in spill if p.suffix == ".out")
        wait_until(lambda: stdout.stat().st_size > 0, what="the call's first output")
        _age(spill, days=30)
        result = plan(scan(engine.settings), RetentionPolicy(max_age_s=0, max_bytes=0, min_age_s=0))
        assert result.removals == ()
        assert {h.group: h.reason for h in result.held} == {
            f"call {call.call_id}": "running_call"
        }
    finally:
        gate.touch()
        runner.join(DEADLINE_S)
        remove(engine.settings, call.call_id)
    assert not runner.is_alive() and results and results[0].exit_code == 0


def test_dry_run_removes_nothing_and_the_cli_lists_the_same_plan(engine: Engine) -> None:
    finished = [_finished_call_with_spill(engine) for _ in range(2)]
    live = engine.run("sleep 300", background=True)
    live_job = _record(engine, live)
    files = _state_files(engine)
    _age(files, days=9)
    expected = plan(scan(engine.settings), LIMITS)
    assert expected.removals and expected.held

    env = {k: v for k, v in os.environ.items() if not k.startswith("BASHFLEET_")}
    env["BASHFLEET_STATE_DIR"] = str(engine.settings.state_dir)
    done = subprocess.run(
        [sys.executable, "-m", "bashfleet.client.cli", "gc", "--dry-run", "--json"],
        capture_output=True, text=True, env=env, timeout=DEADLINE_S * 4, check=False,
    )
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["dry_run"] is True and shown["removed"] == []
    assert shown["state_dir"] == str(engine.settings.state_dir)
    assert [(r["path"], r["size"], r["reason"], r["group"]) for r in shown["remove"]] == [
        (r.path, r.size, r.reason, r.group) for r in expected.removals
    ]
    assert [(h["group"], h["reason"]) for h in shown["held"]] == [
        (h.group, h.reason) for h in expected.held
    ] == [(f"job {live_job.id}", "live_job")]
    assert all(p.exists() for p in files), "a dry run removes nothing"
    for result in finished:
        assert result.spill is not None
        assert result.spill.stdout_path in {r["path"] for r in shown["remove"]}

    # Without --dry-run the same command removes them; the live job stays.
    done = subprocess.run(
        [sys.executable, "-m", "bashfleet.client.cli", "gc", "--max-age", str(7 * DAY)],
        capture_output=True, text=True, env=env, timeout=DEADLINE_S * 4, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "older than the age limit" in done.stdout
    assert sorted(_state_files(engine)) == sorted(_job_paths(live_job, engine))
    kill_job(live_job, grace_s=0.5, settings=engine.settings)
