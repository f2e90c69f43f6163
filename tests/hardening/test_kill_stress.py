"""1,000 timeout kills of commands that spawn children, setsid escapes and double forks.

The figure that matters: survivors after every kill. Eight calls run at a time (as a
worker's slots would); each command starts a plain child, a `setsid` escape, a `nohup`
child and a double fork, then outlives its timeout. After all of them, no process
carrying any of the 1,000 markers is alive.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from integration.engine_helpers import (
    Janitor,
    _janitor_fixture,  # noqa: F401 - fixture
)

from bashfleet.worker import Call, CallResult, Policy, Settings, run_call
from bashfleet.worker.engine.procs import find_call_processes

ROUNDS = int(os.environ.get("BASHFLEET_KILL_ROUNDS", "1000"))
ESCAPES = (
    "sleep 300 & setsid sleep 300 & nohup sleep 300 >/dev/null 2>&1 & "
    "( (sleep 300 &) & ); echo ready; sleep 300"
)
KILL = Policy(on_timeout="kill", kill_grace_s=0.05)


def _one(settings: Settings, call_id: str) -> tuple[CallResult, list[int]]:
    result = run_call(
        Call(call_id=call_id, command=ESCAPES, timeout_s=0.3, policy=KILL), settings=settings
    )
    return result, find_call_processes(None, call_id)


def test_a_thousand_timeout_kills_leave_zero_survivors(
    tmp_path: Path, janitor: Janitor, capsys: pytest.CaptureFixture[str]
) -> None:
    # Its workspaces (a throwaway one per call) of its own, not the machine's default root.
    settings = Settings(state_dir=tmp_path / "state", host="stress",
                        workspace_root=tmp_path / "workspaces")
    ids = [janitor.new_call_id("k") for _ in range(ROUNDS)]
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda call_id: _one(settings, call_id), ids))
    timed_out = sum(1 for result, _ in outcomes if result.timed_out)
    errors = [result.error for result, _ in outcomes if result.error is not None]
    left_after_each = sum(len(left) for _, left in outcomes)
    left_at_end = sum(len(find_call_processes(None, call_id)) for call_id in ids)
    with capsys.disabled():  # the figure belongs in the CI output
        print(
            f"\nkill stress: {ROUNDS} timeout kills, {timed_out} timed out, "
            f"{left_after_each} survivors right after a kill, {left_at_end} at the end"
        )
    assert timed_out == ROUNDS
    assert errors == []
    assert left_after_each == 0
    assert left_at_end == 0
