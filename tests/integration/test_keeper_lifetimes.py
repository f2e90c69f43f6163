"""How long a workspace's keeper (and so everything in the workspace) lives when the
worker process that made it is gone: a blank or throwaway workspace's ends with it; a
leased one's at its lease, even if no worker of its host ever comes back; a background
job's outlives it (as jobs outlive their worker)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bashfleet.worker.engine import workspaces
from bashfleet.worker.wire.models import WorkspaceSpec

from .engine_helpers import (
    Engine,
    _engine_fixture,  # noqa: F401 - the `engine` fixture
    _janitor_fixture,  # noqa: F401 - the `janitor` fixture
    alive,
    keepers_under,
    wait_until,
)

#: A process that runs calls in throwaway workspaces in-process (docs/api.md's `run_call`
#: example), says so, waits for a line, then dies without any cleanup, as a crash or an
#: OOM kill ends a worker.
IN_PROCESS = textwrap.dedent("""
    import os, sys
    from bashfleet.worker import Call, run_call
    from bashfleet.worker.settings import Settings
    settings = Settings(state_dir=sys.argv[1], host="in-process",
                        workspace_root=sys.argv[2])
    mode = sys.argv[3]
    call = Call(call_id="ip-" + os.urandom(4).hex(), background=mode == "job",
                command="sleep 300" if mode == "job" else "echo hi")
    result = run_call(call, settings=settings)
    print(result.job.host_pid if result.job else 0, flush=True)
    sys.stdin.readline()
    os._exit(0)
""")


def _start(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", IN_PROCESS, str(tmp_path / "state"), str(tmp_path / "ws"),
         mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the in-process caller ended early"
    return proc, int(line)


def test_a_processs_throwaway_workspaces_end_with_it(tmp_path: Path) -> None:
    proc, _ = _start(tmp_path, "call")
    try:
        # Positive control: while it lives, its ready workspaces' keepers are there.
        assert wait_until(lambda: keepers_under(tmp_path / "state"), what="its keepers")
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
        wait_until(lambda: not keepers_under(tmp_path / "state"),
                   what="its throwaway workspaces' keepers to end with it")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_background_job_outlives_the_process_that_started_it(tmp_path: Path) -> None:
    proc, job_pid = _start(tmp_path, "job")
    try:
        assert job_pid > 0 and alive(job_pid)
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
        time.sleep(1.0)  # long enough for a keeper bound to its maker to have gone
        assert alive(job_pid), "the job ended with the process that started it"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in keepers_under(tmp_path / "state"):
            os.kill(pid, 9)


def test_a_leased_workspace_ends_at_its_lease_with_no_worker_to_reap_it(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workspaces.store, "LEASE_LOOK_S", 0.2)
    monkeypatch.setattr(workspaces.store, "LEASE_GRACE_S", 0.5)
    expiring = workspaces.create(WorkspaceSpec(ttl_s=1.0), engine.settings)
    renewed = workspaces.create(WorkspaceSpec(ttl_s=1.0), engine.settings)
    deleted = workspaces.create(WorkspaceSpec(ttl_s=3600.0), engine.settings)
    try:
        pids = {name: record.keeper_pid for name, record in
                (("expiring", expiring), ("renewed", renewed), ("deleted", deleted))}
        assert all(pid is not None and alive(pid) for pid in pids.values())
        # No worker reaps here: the record of one goes as a dead worker's cleanup would.
        workspaces.record_path(engine.settings, deleted.id).unlink()
        started = time.monotonic()
        while time.monotonic() - started < 4.0:
            workspaces.touch(renewed, engine.settings)  # its caller uses it
            time.sleep(0.1)
        assert not alive(int(pids["expiring"] or 0)), "past its TTL and grace it lived on"
        assert not alive(int(pids["deleted"] or 0)), "its record gone, it lived on"
        assert alive(int(pids["renewed"] or 0)), "a workspace in use ended"
    finally:
        workspaces.save(deleted, engine.settings)  # its files go with it
        for record in (expiring, renewed, deleted):
            workspaces.delete(record.id, engine.settings)
