"""A call's result printed for a person: what `bashfleet run` and its interactive forms
(`--tty`, piped stdin, `attach`) show once a call ends."""

from __future__ import annotations

import sys

from bashfleet.worker.wire.models import CallResult, TruncationInfo


def _notice(name: str, info: TruncationInfo | None, path: str | None, host: str) -> str | None:
    if info is None or not info.truncated:
        return None
    where = f" Full output: {path} on {host}" if path else ""
    return (
        f"[{name}: showing {info.shown_lines} of {info.total_lines} lines "
        f"({info.shown_bytes} of {info.total_bytes} bytes).{where}]"
    )


def print_result(result: CallResult, *, job_id_on_stdout: bool = True) -> None:
    """Print a call's result for a person: output on its streams, notices on stderr.

    A call that started a background job (`--mode background`, or one that went to the
    background) prints the job's id alone on stdout, last, so `X=$(bashfleet run --mode
    background CMD)` holds it: its output so far and how to check and kill it go to
    stderr. Not when the job's output is followed on stdout (`job_id_on_stdout=False`)."""
    id_only = result.job is not None and job_id_on_stdout
    if result.stdout:
        out = sys.stderr if id_only else sys.stdout
        out.write(result.stdout if result.stdout.endswith("\n") else result.stdout + "\n")
    if result.stderr:
        sys.stderr.write(result.stderr if result.stderr.endswith("\n") else result.stderr + "\n")
    spill = result.spill
    for name, info, path in (
        ("stdout", result.stdout_truncation, spill.stdout_path if spill else None),
        ("stderr", result.stderr_truncation, spill.stderr_path if spill else None),
    ):
        line = _notice(name, info, path, result.host)
        if line:
            print(line, file=sys.stderr)
    if result.error_digest:
        print("[errors in the cut part:]", file=sys.stderr)
        for line in result.error_digest:
            print(f"  {line}", file=sys.stderr)
    if result.cancelled:
        print("[call cancelled; its processes were killed]", file=sys.stderr)
    elif result.error is not None:
        print(f"bashfleet: {result.error.kind}: {result.error.message}", file=sys.stderr)
    if result.timed_out and not result.backgrounded:
        print(f"[timed out after {result.duration_s:.1f}s; processes killed. More time: "
              "--timeout S or --mode slow; to leave it running instead: "
              "--background-on-timeout]", file=sys.stderr)
    if result.job is not None:
        job = result.job
        print(
            f"[job {job.id} running on {job.host} (pid {job.pid}); "
            f"output: {job.output_path}; `bashfleet check {job.id}`, `bashfleet kill {job.id}`]",
            file=sys.stderr, flush=True,
        )
        if job_id_on_stdout:
            print(job.id, flush=True)
