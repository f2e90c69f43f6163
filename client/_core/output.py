"""A call's whole output, for `run(..., output="full")`.

A result carries the output as the call's policy shaped it: for the Python API (the
native policy) the last 2000 lines / 50 KB of each stream, the rest in the call's spill
files on its host (`result.spill`, counts in `stdout_truncation`). `output="full"`
reads the spill files back through `read_output` and puts all of it in the result, up
to a maximum the caller sets (FULL_OUTPUT_MAX_BYTES by default): past it, OutputTooLarge,
which holds the result as it came.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from bashfleet.client.errors import OutputTooLarge, WorkerError
from bashfleet.worker.wire.models import CallResult, TruncationInfo

OutputMode = Literal["tail", "full"]
Stream = Literal["stdout", "stderr"]


@dataclass(frozen=True)
class FullRead:
    """One stream to read back whole: its name and its size in its spill file."""

    stream: Stream
    size: int


def full_reads(result: CallResult, max_bytes: int) -> list[FullRead]:
    """The streams of a result to read back whole (none when nothing was cut); WorkerError
    when cut output was not kept whole, OutputTooLarge past `max_bytes` altogether.

    A call that went on as a background job is left as it is: its output is still being
    written (read it with `read_output` / `check`).
    """
    if result.job is not None or result.backgrounded:
        return []
    streams: tuple[tuple[Stream, TruncationInfo | None], ...] = (
        ("stdout", result.stdout_truncation), ("stderr", result.stderr_truncation))
    cut = [name for name, info in streams if info is not None and info.truncated]
    if not cut:
        return []
    spill = result.spill
    if spill is None or spill.error:
        why = spill.error if spill is not None and spill.error else "no spill file"
        raise WorkerError(f"call {result.call_id}: its whole output was not kept ({why})")
    sizes = {"stdout": spill.stdout_bytes, "stderr": spill.stderr_bytes}
    total = sum(sizes[name] for name in cut)
    if total > max_bytes:
        raise OutputTooLarge(
            f"call {result.call_id} wrote {total} bytes of output, more than "
            f"max_output_bytes={max_bytes}; its full output stays on {spill.host} "
            f"({spill.stdout_path}{', ' + spill.stderr_path if spill.stderr_path else ''})",
            result, total, max_bytes,
        )
    return [FullRead(name, sizes[name]) for name in cut]


def _whole(info: TruncationInfo) -> TruncationInfo:
    lines = info.total_lines
    return info.model_copy(update={
        "truncated": False, "limit": None, "shown_lines": lines,
        "shown_bytes": info.total_bytes, "partial_line": False,
        "shown_ranges": ((1, lines),) if lines else (), "long_lines_cut": 0,
    })


def with_full_output(result: CallResult, texts: Mapping[Stream, str]) -> CallResult:
    """The result with these streams' whole text in place of their tails (their counts
    say nothing is left out; the error digest of the cut part goes: nothing is cut)."""
    update: dict[str, object] = {"error_digest": ()}
    for name, text in texts.items():
        info = result.stdout_truncation if name == "stdout" else result.stderr_truncation
        update[name] = text
        if info is not None:
            update[f"{name}_truncation"] = _whole(info)
    return result.model_copy(update=update)
