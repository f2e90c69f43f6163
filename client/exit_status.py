"""The exit status a command of the fleet gives its shell: written once, used by every
CLI command that turns a result into a status (`run`, `run --tty`, `attach`, `wait`,
`run --follow`), as bash and coreutils' `timeout(1)` give theirs.

| status | when |
|---|---|
| the command's own | it exited |
| 128 + N | signal N ended it (`kill -9`: 137) |
| 124 | its timeout killed it (as `timeout(1)`) |
| 125 | a system error: it did not run, or how it ended is unknown (`timeout(1)`'s own failure) |
| 130 | the person pressed Ctrl-C (128 + SIGINT) |
| 141 | the reader of `bashfleet`'s output went away (128 + SIGPIPE, as `yes \\| head` gives) |
| 143 | SIGTERM stopped `bashfleet run` (128 + SIGTERM) |
| 2 | a usage error |
"""

from __future__ import annotations

import signal
from collections.abc import Mapping

#: `typing.TYPE_CHECKING` without loading `typing` (`bashfleet --help` does not need it).
TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

    from bashfleet.worker.wire.models import CallResult

USAGE = 2
TIMEOUT = 124
SYSTEM_ERROR = 125
SIGNAL_BASE = 128
INTERRUPTED = SIGNAL_BASE + signal.SIGINT
BROKEN_PIPE = SIGNAL_BASE + signal.SIGPIPE
TERMINATED = SIGNAL_BASE + signal.SIGTERM


def of_process(exit_code: int | None, signal_number: int | None) -> int:
    """How a process ended, as a status: the signal's 128+N, else its exit code, else
    125 (nothing says how it ended)."""
    if signal_number is not None:
        return SIGNAL_BASE + signal_number
    return exit_code if exit_code is not None else SYSTEM_ERROR


def of_call(result: CallResult) -> int:
    """A call's status (`of_result`, of the model)."""
    return of_result(result.model_dump(mode="json", include=_STATUS_FIELDS))


#: The fields of a call's result its status is read from.
_STATUS_FIELDS = {"error", "exit_code", "signal", "backgrounded", "timed_out"}


def of_result(result: Mapping[str, Any]) -> int:
    """A call's status, from its result as JSON data: 125 when it never ran (a system
    error and no outcome) or its worker was lost (the signal that ended it was the
    stopping worker's, not the command's story), 0 when it went on as a background job,
    124 when its timeout killed it, else how it ended."""
    error = result.get("error")
    exit_code, signal_number = result.get("exit_code"), result.get("signal")
    if error is not None and (error["kind"] == "worker_lost" or (
            exit_code is None and signal_number is None)):
        return SYSTEM_ERROR
    if result.get("backgrounded"):
        return 0
    if result.get("timed_out"):
        return TIMEOUT
    return of_process(exit_code, signal_number)
