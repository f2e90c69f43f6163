"""A call's result printed for a person: what `bashfleet run` and its interactive forms
(`--tty`, piped stdin, `attach`) show once a call ends."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bashfleet.worker.wire.models import CallResult


def _notice(name: str, info: Mapping[str, Any] | None, path: str | None, host: str
            ) -> str | None:
    if info is None or not info["truncated"]:
        return None
    where = f" Full output: {path} on {host}" if path else ""
    return (
        f"[{name}: showing {info['shown_lines']} of {info['total_lines']} lines "
        f"({info['shown_bytes']} of {info['total_bytes']} bytes).{where}]"
    )


def print_result(result: CallResult | Mapping[str, Any], *, job_id_on_stdout: bool = True
                 ) -> None:
    """Print a call's result for a person: output on its streams, notices on stderr.

    A call that started a background job (`--mode background`, or one that went to the
    background) prints the job's id alone on stdout, last, so `X=$(bashfleet run --mode
    background CMD)` holds it: its output so far and how to check and kill it go to
    stderr. Not when the job's output is followed on stdout (`job_id_on_stdout=False`)."""
    data = result if isinstance(result, Mapping) else result.model_dump(mode="json")
    job = data.get("job")
    id_only = job is not None and job_id_on_stdout
    stdout, stderr = data.get("stdout", ""), data.get("stderr", "")
    if stdout:
        out = sys.stderr if id_only else sys.stdout
        out.write(stdout if stdout.endswith("\n") else stdout + "\n")
    if stderr:
        sys.stderr.write(stderr if stderr.endswith("\n") else stderr + "\n")
    spill = data.get("spill")
    for name, info, path in (
        ("stdout", data.get("stdout_truncation"), spill["stdout_path"] if spill else None),
        ("stderr", data.get("stderr_truncation"), spill["stderr_path"] if spill else None),
    ):
        line = _notice(name, info, path, data["host"])
        if line:
            print(line, file=sys.stderr)
    if data.get("error_digest"):
        print("[errors in the cut part:]", file=sys.stderr)
        for line in data["error_digest"]:
            print(f"  {line}", file=sys.stderr)
    error = data.get("error")
    if data.get("cancelled"):
        print("[call cancelled; its processes were killed]", file=sys.stderr)
    elif error is not None:
        print(f"bashfleet: {error['kind']}: {error['message']}", file=sys.stderr)
    if data.get("timed_out") and not data.get("backgrounded"):
        print(f"[timed out after {data.get('duration_s', 0.0):.1f}s; processes killed. More "
              "time: --timeout S or --mode slow; to leave it running instead: "
              "--background-on-timeout]", file=sys.stderr)
    if job is not None:
        print(
            f"[job {job['id']} running on {job['host']} (pid {job['pid']}); "
            f"output: {job['output_path']}; `bashfleet check {job['id']}`, "
            f"`bashfleet kill {job['id']}`]",
            file=sys.stderr, flush=True,
        )
        if job_id_on_stdout:
            print(job["id"], flush=True)
