"""Commands longer than one argv string (128 KiB) and up to the wire's 1 MiB run exactly,
in the foreground and as background jobs, sandboxed or not."""

from __future__ import annotations

import pytest

from bashfleet.client import Fleet
from bashfleet.worker import CheckResult, check_job, load_record
from bashfleet.worker.engine.isolate.command_line import ARGUMENT_MAX
from bashfleet.worker.wire.models import MAX_COMMAND_BYTES

from .conftest import WorkerProcess
from .engine_helpers import (
    Engine,
    _engine_fixture,  # noqa: F401 - fixture
    _janitor_fixture,  # noqa: F401 - fixture
    _plain_engine_fixture,  # noqa: F401 - fixture
    wait_until,
)

_HEAD = "cat > big.txt <<'BIG_EOF'\n"
# What the command reports: the file it wrote, bash's $0 and $#, and that neither the
# reader's variable nor its descriptor reached the command.
_TAIL = ("\nBIG_EOF\nwc -c < big.txt; sha256sum < big.txt | cut -c1-16; "
         'echo "[$0] $# [${BASHFLEET_COMMAND-unset}]"; '
         "{ [ -e /proc/self/fd/202 ] && echo open || echo closed; }; "
         "exit 3")


def heredoc_command(size: int) -> tuple[str, str]:
    """A command of exactly `size` bytes that writes a file with a heredoc; the body."""
    filler = size - len(_HEAD) - len(_TAIL)
    line = "0123456789abcdefghijklmnopqrstuvwxyz ~$`'\"\\ {}[]()<>|&;*?\n"
    body = (line * (filler // len(line) + 1))[:filler - 1] + "z"
    command = _HEAD + body + _TAIL
    assert len(command.encode()) == size
    return command, body


def expected_output(body: str) -> str:
    import hashlib  # noqa: PLC0415

    digest = hashlib.sha256((body + "\n").encode()).hexdigest()[:16]
    return f"{len(body) + 1}\n{digest}\n[bash] 0 [unset]\nclosed\n"


@pytest.fixture(params=["sandboxed", "plain"])
def any_engine(request: pytest.FixtureRequest) -> Engine:
    name = "engine" if request.param == "sandboxed" else "plain_engine"
    return request.getfixturevalue(name)  # type: ignore[no-any-return]


@pytest.mark.parametrize("size", [1_000_000, MAX_COMMAND_BYTES, ARGUMENT_MAX + 1, ARGUMENT_MAX])
def test_long_command_runs_in_the_foreground(any_engine: Engine, size: int) -> None:
    command, body = heredoc_command(size)
    result = any_engine.run(command)
    assert result.error is None, result.error
    assert (result.exit_code, result.stdout, result.stderr) == (3, expected_output(body), "")


def test_long_command_runs_as_a_background_job(any_engine: Engine) -> None:
    command, body = heredoc_command(1_000_000)
    result = any_engine.run(command, background=True)
    assert result.error is None and result.job is not None, result
    record = load_record(result.job.id, any_engine.settings)

    def ended() -> CheckResult | None:
        check = check_job(record, settings=any_engine.settings)
        return None if check.running else check

    final = wait_until(ended, what="the job to end")
    assert final.exit_code == 3
    ended_line = "\n\n[background process failed: exit status: 3]\n"
    assert final.output == expected_output(body) + ended_line


def test_long_command_runs_as_an_interactive_job(any_engine: Engine) -> None:
    """An interactive job (stdin a pipe) starts under its own supervisor."""
    command, body = heredoc_command(1_000_000)
    result = any_engine.run(command, background=True, stdin="pipe")
    assert result.error is None and result.job is not None, result
    record = load_record(result.job.id, any_engine.settings)

    def ended() -> CheckResult | None:
        check = check_job(record, settings=any_engine.settings)
        return None if check.running else check

    final = wait_until(ended, what="the job to end")
    assert final.exit_code == 3
    assert final.output.startswith(expected_output(body))


# ---------------------------------------------------------------------- through a fleet


def test_long_command_runs_through_a_fleet(
    two_hosts: tuple[WorkerProcess, WorkerProcess], fleet: Fleet,
) -> None:
    command, body = heredoc_command(1_000_000)
    result = fleet.run(command, host="alpha", check=False)
    assert result.error is None, result.error
    assert (result.exit_code, result.stdout, result.stderr) == (3, expected_output(body), "")

    started = fleet.run(command, host="alpha", mode="background")
    assert started.job is not None
    view = fleet.wait(started.job.id, timeout=60)
    assert view.exit_code == 3
    chunk = fleet.read_output(started.job.id)
    assert chunk.text.startswith(expected_output(body))
