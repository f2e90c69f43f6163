"""Small text helpers shared by the dialects: durations, signals, lines, cut summaries."""

from __future__ import annotations

import re
import signal

from bashfleet.client import exit_status
from bashfleet.worker.wire.models import (
    CallResult,
    CheckResult,
    ProcessInfo,
    SystemError_,
    TruncationInfo,
)

#: The line the engine appends to every job's output file when the job ends (the modes
#: dialect's `[background process completed]` / `[background process failed: STATUS]`).
_COMPLETION_LINE = re.compile(r"\n\n\[background process (?:completed|failed: [^\]\n]*)\]\n\Z")


def seconds(value: float) -> str:
    """`120s`, `1.5s`: a duration as the dialects' texts print it (no trailing `.0`)."""
    return f"{value:g}s"


def signal_label(number: int) -> str:
    """`SIGKILL` for 9; `signal 99` for a number Python does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def shell_status(exit_code: int | None, signal_number: int | None) -> int | None:
    """The status bash reports (`$?`): the exit code, or 128+N for a signal."""
    if exit_code is None and signal_number is None:
        return None
    return exit_status.of_process(exit_code, signal_number)


def chomp(text: str) -> str:
    """`text` without one trailing newline: the stream's last newline is not content."""
    return text[:-1] if text.endswith("\n") else text


def count_lines(text: str) -> int:
    """Lines in `text`, a last line without newline included (the engine's convention)."""
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def shown_lines_phrase(info: TruncationInfo) -> str:
    """Which lines are shown: `the last 2000 of 8500 lines`, `lines 1-80 and 9000-9100 of 9100`."""
    match info.direction:
        case "middle" if len(info.shown_ranges) == 2:
            (a, b), (c, d) = info.shown_ranges
            return f"lines {a}-{b} and {c}-{d} of {info.total_lines}"
        case "middle" if len(info.shown_ranges) == 1:  # a `head` then `tail` range
            ((a, b),) = info.shown_ranges
            return f"lines {a}-{b} of {info.total_lines}"
        case "head":
            return f"the first {info.shown_lines} of {info.total_lines} lines"
    return f"the last {info.shown_lines} of {info.total_lines} lines"


def cut_summary(info: TruncationInfo) -> str:
    """Exact counts of a cut: lines and bytes shown of the total, the limit that cut it."""
    text = (
        f"showing {shown_lines_phrase(info)} "
        f"({info.shown_bytes} of {info.total_bytes} bytes"
        + (f", {info.limit} limit" if info.limit else "")
        + ")"
    )
    if info.partial_line:
        text += "; a line at the cut is shown in part"
    return text


def system_failure(result: CallResult) -> SystemError_ | None:
    """The system error of a call that never ran (bad cwd, blocked, spawn failure...).

    A result can carry an error *and* an outcome (survivors of a timeout kill, a
    cancelled call): that error is a note on the outcome, not a failure to run, so
    None is returned for it.
    """
    ran = result.exit_code is not None or result.signal is not None
    if result.error is None or ran or result.timed_out or result.backgrounded:
        return None
    return result.error


def process_line(process: ProcessInfo) -> str:
    """`pid 4242 sleeping, 29.5s CPU: make -j8`: one process of a call, as notices list it."""
    return f"pid {process.pid} {process.state}, {process.cpu_s:.1f}s CPU: {process.command}"


def output_age(age_s: float | None) -> str:
    """How long ago a call last printed: `last output 12.3s ago`, or `no output yet`."""
    if age_s is None:
        return "no output yet"
    return f"last output {age_s:.1f}s ago"


def sentence(text: str) -> str:
    """`text` as a sentence: capitalized, with a full stop."""
    return text[:1].upper() + text[1:] + "."


def activity(result: CallResult) -> tuple[list[str], str] | None:
    """What a timed-out call was doing: its processes' lines and the age of its output.

    None when the worker said nothing about it (no process listed, no output age): an
    older worker, or a call that never timed out. Each dialect words the heading.
    """
    if not result.processes and result.last_output_age_s is None:
        return None
    return [process_line(p) for p in result.processes], output_age(result.last_output_age_s)


def _without_last_lines(
    ranges: tuple[tuple[int, int], ...], lines: int
) -> tuple[tuple[int, int], ...]:
    """Shown line ranges once the last `lines` lines of the stream are gone."""
    if not ranges:
        return ranges
    first, last = ranges[-1]
    end = last - lines
    return (*ranges[:-1], (first, end)) if end >= first else ranges[:-1]


def without_completion_line(result: CheckResult) -> CheckResult:
    """A check's result without the completion line at the end of the job's output.

    The modes dialect wants that line in the output file, and the engine writes it for
    every job; the other dialects say how a job ended in their own words, so they leave
    it out, and out of the counts too (a notice must count the lines it shows).
    """
    output = _COMPLETION_LINE.sub("", result.output)
    if output == result.output:
        return result
    update: dict[str, object] = {"output": output}
    info = result.output_truncation
    if info is not None:
        lines = count_lines(result.output) - count_lines(output)
        size = len(result.output.encode()) - len(output.encode())
        update["output_truncation"] = info.model_copy(update={
            "total_lines": max(0, info.total_lines - lines),
            "shown_lines": max(0, info.shown_lines - lines),
            "total_bytes": max(0, info.total_bytes - size),
            "shown_bytes": max(0, info.shown_bytes - size),
            "shown_ranges": _without_last_lines(info.shown_ranges, lines),
        })
    return result.model_copy(update=update)
