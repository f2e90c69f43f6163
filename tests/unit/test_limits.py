"""bashfleet.worker.engine.limits:
the ulimit line, which limit ended a call, and per-host command rules."""

from __future__ import annotations

import signal

import pytest

from bashfleet.worker.engine.limits import (
    ResourceLimits,
    host_rule_violation,
    limit_hit,
    ulimit_prefix,
)

ALL = ResourceLimits(memory_mb=100, cpu_s=2, file_mb=1, procs=50)


def test_no_limits_no_prefix() -> None:
    assert ulimit_prefix(ResourceLimits()) == ""


def test_prefix_sets_every_limit_and_refuses_on_failure() -> None:
    line = ulimit_prefix(ALL)
    assert line.endswith("\n") and line.count("\n") == 1
    assert "ulimit -v 102400" in line
    # Soft CPU limit before the hard one: lowering the hard limit below an unlimited
    # soft one is EINVAL.
    assert line.index("ulimit -S -t 2") < line.index("ulimit -H -t 3")
    assert "ulimit -f 1024" in line and "ulimit -u 50" in line
    assert "exit 126" in line


@pytest.mark.parametrize(
    ("exit_code", "signum", "output", "expected"),
    [
        (None, signal.SIGXCPU, "", "cpu_time"),
        (0, None, "bash: line 1: 42 CPU time limit exceeded  yes", "cpu_time"),
        (None, signal.SIGXFSZ, "", "file_size"),
        (0, None, "line 2: 7 File size limit exceeded  head -c 9M", "file_size"),
        (1, None, "OSError: [Errno 27] File too large", "file_size"),
        (1, None, "MemoryError", "memory"),
        (1, None, "x: Cannot allocate memory", "memory"),
        (0, None, "MemoryError", None),  # printed, but the call succeeded
        (254, None, "bash: fork: retry: Resource temporarily unavailable", "processes"),
        (0, None, "all fine", None),
        (1, None, "ordinary failure", None),
    ],
)
def test_limit_hit(
    exit_code: int | None, signum: int | None, output: str, expected: str | None
) -> None:
    assert limit_hit(ALL, exit_code, signum, output) == expected


def test_limit_hit_needs_the_limit_set() -> None:
    assert limit_hit(ResourceLimits(), None, signal.SIGXCPU, "") is None
    assert limit_hit(ResourceLimits(), 1, None, "MemoryError") is None


@pytest.mark.parametrize(
    ("command", "deny", "allow", "blocked"),
    [
        ("rm -rf /", [r"rm\s+-rf\s+/"], [], "deny rule"),
        ("rm -rf ./build", [r"rm\s+-rf\s+/$"], [], None),
        ("make test", [], [r"^make\b", r"^pytest\b"], None),
        ("curl evil", [], [r"^make\b"], "allow rules"),
        ("make; shutdown", ["shutdown"], [r"^make\b"], "deny rule"),  # deny wins
    ],
)
def test_host_rules(command: str, deny: list[str], allow: list[str], blocked: str | None) -> None:
    reason = host_rule_violation(command, deny, allow)
    if blocked is None:
        assert reason is None
    else:
        assert reason is not None and blocked in reason
        assert (deny and deny[0] in reason) or (allow and allow[0] in reason)
