"""A background job of a separate-stream call keeps its stderr in a file of its own
(its path in the job's record, handle and view), in every way a job starts; a
combined-stream call's job writes both streams to one file, as its dialect shows it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bashfleet.worker import CheckResult, Policy, check_job, load_record

from .engine_helpers import (
    Engine,
    _engine_fixture,  # noqa: F401 - fixture
    _janitor_fixture,  # noqa: F401 - fixture
    _plain_engine_fixture,  # noqa: F401 - fixture
    wait_until,
)

COMMAND = "echo out1; echo err1 >&2; echo out2; echo err2 >&2; exit 5"
ENDED = "\n\n[background process failed: exit status: 5]\n"


@pytest.fixture(params=["sandboxed", "plain"])
def any_engine(request: pytest.FixtureRequest) -> Engine:
    name = "engine" if request.param == "sandboxed" else "plain_engine"
    return request.getfixturevalue(name)  # type: ignore[no-any-return]


def _final(engine: Engine, job_id: str) -> CheckResult:
    record = load_record(job_id, engine.settings)

    def ended() -> CheckResult | None:
        check = check_job(record, settings=engine.settings)
        return None if check.running else check

    return wait_until(ended, what=f"job {job_id} to end")


def test_a_separate_stream_job_keeps_its_stderr_apart(any_engine: Engine) -> None:
    result = any_engine.run(COMMAND, background=True)
    assert result.job is not None, result
    record = load_record(result.job.id, any_engine.settings)
    assert record.stderr_path is not None
    assert result.job.stderr_path == record.stderr_path
    final = _final(any_engine, result.job.id)
    assert final.exit_code == 5
    # The completion line goes with stdout; stderr holds only what the job wrote there.
    assert (final.output, final.stderr_output) == ("out1\nout2\n" + ENDED, "err1\nerr2\n")
    assert Path(record.stderr_path).read_text() == "err1\nerr2\n"


def test_a_combined_stream_job_writes_one_file(any_engine: Engine) -> None:
    result = any_engine.run(COMMAND, background=True, policy=Policy(streams="combined"))
    assert result.job is not None, result
    assert load_record(result.job.id, any_engine.settings).stderr_path is None
    final = _final(any_engine, result.job.id)
    assert (final.output, final.stderr_output) == ("out1\nerr1\nout2\nerr2\n" + ENDED, "")


def test_an_interactive_job_writes_one_file(any_engine: Engine) -> None:
    result = any_engine.run(COMMAND, background=True, stdin="pipe")
    assert result.job is not None, result
    assert load_record(result.job.id, any_engine.settings).stderr_path is None
    final = _final(any_engine, result.job.id)
    assert final.output.startswith("out1\nerr1\nout2\nerr2\n")
