"""`bashfleet down` leaves nothing running: a local host's workspaces (their keepers
outlive a worker by design, so that a restarted worker takes them up again) and its
background jobs end with the local fleet."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from bashfleet.worker.engine import teardown

from .test_local_fleet import LocalCli


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalCli]:
    cli = LocalCli(tmp_path / "state")
    try:
        yield cli
    finally:
        cli.end()


def test_down_ends_the_hosts_workspaces_and_jobs(local: LocalCli) -> None:
    up = local("up", "--hosts", "solo", "--no-flower", "--detach")
    assert up.returncode == 0, up.stderr + up.stdout
    made = local("workspace", "create", "--json")
    assert made.returncode == 0, made.stderr
    ws_id = json.loads(made.stdout)["id"]
    job = local("run", "--workspace", ws_id, "--mode", "background", "sleep 600")
    assert job.returncode == 0, job.stderr
    session = local("run", "--session", "s-down", "sleep 600 & echo started")
    assert session.stdout == "started\n", session.stderr
    host_state = local.state_dir / "hosts" / "solo" / "workspace-state"
    keepers = teardown.keepers_under(host_state)
    assert len(keepers) >= 2  # the named workspace's, the session's (and pool ones)
    down = local("down")
    assert down.returncode == 0, down.stderr
    assert "ended" in down.stdout and "workspace(s)" in down.stdout, down.stdout
    alive = [pid for pid in keepers if psutil.pid_exists(pid)
             and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert alive == []
    assert teardown.keepers_under(host_state) == []
    assert not list(host_state.glob("*.json"))  # no workspace record left
