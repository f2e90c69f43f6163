"""What the sandbox's tests share: this host's probe and the marks it gives, a
policy that backgrounds, the session workspaces a test makes, a job's end."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bashfleet import worker
from bashfleet.worker.engine import sandbox, workspaces
from bashfleet.worker.engine.jobs.jobs import check_job, load_record
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import CheckResult, Policy, WorkspaceRecord, WorkspaceSpec

from .engine_helpers import Engine, wait_until

PROBE = sandbox.probe(Settings(host="probe"))
needs_bubblewrap = pytest.mark.skipif(
    PROBE.isolation == "none", reason=f"no working bubblewrap here: {PROBE.problem}"
)
needs_cgroups = pytest.mark.skipif(PROBE.cgroup is None, reason="no cgroups for calls here")

AUTO = Policy(on_timeout="background", kill_grace_s=0.5)


class Workspaces:
    """Session workspaces a test makes, deleted at teardown."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.made: list[WorkspaceRecord] = []

    def new(self, **spec: Any) -> WorkspaceRecord:
        record = workspaces.create(WorkspaceSpec(**spec), self.engine.settings)
        self.made.append(record)
        return record

    def run(self, record: WorkspaceRecord, command: str, **fields: Any) -> CallResultT:
        return self.engine.run(command, workspace=record.id, cwd=None, **fields)

    def end(self) -> None:
        for record in self.made:
            workspaces.delete(record.id, self.engine.settings)


CallResultT = worker.CallResult


@pytest.fixture(name="spaces")
def _spaces_fixture(engine: Engine) -> Iterator[Workspaces]:
    made = Workspaces(engine)
    try:
        yield made
    finally:
        made.end()


def _job_end(engine: Engine, job_id: str) -> CheckResult:
    def ended() -> CheckResult | None:
        check = check_job(load_record(job_id, engine.settings), settings=engine.settings)
        return check if not check.running else None

    return wait_until(ended, what=f"job {job_id} to end")
