"""Per-call resource limits and per-host command rules: pure functions.

Limits are set by bash itself (`ulimit`, hard and soft) on a line before the command,
so they cost no extra process and bind every process the command starts. Which limit
ended a call is read from how it ended: SIGXCPU / SIGXFSZ for CPU time and file size,
the usual allocation and fork failure messages for memory and process count.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass

_MEMORY_FAILURE = re.compile(
    r"cannot allocate memory|memoryerror|out of memory|bad_alloc|memory exhausted", re.I
)
_FORK_FAILURE = re.compile(r"fork: (retry: )?resource temporarily unavailable|cannot fork", re.I)
# What bash prints when a child died of SIGXCPU / SIGXFSZ, and EFBIG's message (Python
# and others ignore SIGXFSZ and see the write fail instead).
_CPU_KILLED = re.compile(r"cpu time limit exceeded", re.I)
_FILE_TOO_BIG = re.compile(r"file size limit exceeded|file too large", re.I)


@dataclass(frozen=True)
class ResourceLimits:
    """Per-call limits; None means unlimited."""

    memory_mb: int | None = None
    cpu_s: int | None = None
    file_mb: int | None = None
    procs: int | None = None
    open_files: int | None = None

    def any(self) -> bool:
        """True when at least one limit is set."""
        return any(v is not None for v in (self.memory_mb, self.cpu_s, self.file_mb, self.procs,
                                           self.open_files))


def ulimit_prefix(limits: ResourceLimits) -> str:
    """The bash line that sets the limits, refusing to run the command if one fails."""
    if not limits.any():
        return ""
    parts: list[str] = []
    if limits.memory_mb is not None:
        parts.append(f"ulimit -v {limits.memory_mb * 1024}")  # KiB
    if limits.cpu_s is not None:
        # Soft limit first (SIGXCPU, reported), the hard one a second later (SIGKILL).
        parts.append(f"ulimit -S -t {limits.cpu_s} && ulimit -H -t {limits.cpu_s + 1}")
    if limits.file_mb is not None:
        parts.append(f"ulimit -f {limits.file_mb * 1024}")  # 1 KiB blocks in bash
    if limits.procs is not None:
        parts.append(f"ulimit -u {limits.procs}")
    if limits.open_files is not None:
        parts.append(f"ulimit -n {limits.open_files}")  # soft and hard
    failed = "{ echo 'bashfleet: could not set resource limits' >&2; exit 126; }"
    return f"{' && '.join(parts)} || {failed}\n"


def limit_hit(
    limits: ResourceLimits, exit_code: int | None, signum: int | None, output: str
) -> str | None:
    """Which limit ended the call, if one did: memory, cpu_time, file_size or processes."""
    if limits.cpu_s is not None and (signum == signal.SIGXCPU or _CPU_KILLED.search(output)):
        return "cpu_time"
    if limits.file_mb is not None and (signum == signal.SIGXFSZ or _FILE_TOO_BIG.search(output)):
        return "file_size"
    failed = signum is not None or (exit_code is not None and exit_code != 0)
    if limits.memory_mb is not None and failed and _MEMORY_FAILURE.search(output):
        return "memory"
    if limits.procs is not None and failed and _FORK_FAILURE.search(output):
        return "processes"
    return None


def host_rule_violation(
    command: str, deny: Sequence[str], allow: Sequence[str]
) -> str | None:
    """Why this host refuses `command` (naming the rule), or None when it may run."""
    for rule in deny:
        if re.search(rule, command):
            return f"Blocked by this host's deny rule /{rule}/"
    if allow and not any(re.search(rule, command) for rule in allow):
        listed = ", ".join(f"/{rule}/" for rule in allow)
        return f"Blocked: the command matches none of this host's allow rules ({listed})"
    return None
