"""Malformed calls are refused with clear errors, through the real fleet, and nothing runs.

Command size, NUL bytes, invalid regular expressions, negative or huge timeouts, unknown
modes, unknown hosts and ids: each gets a typed error whose message says what is wrong.
"""

from __future__ import annotations

from typing import Any

import pytest

from bashfleet.client import CallNotRun, CallRejected, Fleet, HostUnavailable, UnknownJob
from bashfleet.worker.wire.models import MAX_COMMAND_BYTES, MAX_TIMEOUT_S, Policy

from .conftest import WorkerProcess

Hosts = tuple[WorkerProcess, WorkerProcess]


@pytest.mark.parametrize(
    ("command", "options", "says"),
    [
        ("x" * (MAX_COMMAND_BYTES + 1), {}, "the limit is"),
        ("echo a\x00b", {}, "NUL"),
        ("   ", {}, "empty"),
        ("echo hi", {"timeout": -1}, "timeout_s"),
        ("echo hi", {"timeout": 0}, "timeout_s"),
        ("echo hi", {"timeout": MAX_TIMEOUT_S * 2}, "timeout_s"),
        ("echo hi", {"mode": "turbo"}, "mode must be default, slow or background"),
        ("echo hi", {"env": {"A=B": "x"}}, "invalid environment variable"),
        ("echo hi", {"cwd": "relative\x00dir"}, "cwd"),
    ],
)
def test_malformed_calls_are_rejected_before_sending(
    two_hosts: Hosts, fleet: Fleet, command: str, options: dict[str, Any], says: str
) -> None:
    with pytest.raises(CallRejected) as caught:
        fleet.run(command, host=two_hosts[0].host, **options)
    assert says in caught.value.message


def test_timeout_above_the_dialect_maximum_is_a_clear_error(
    two_hosts: Hosts, fleet: Fleet
) -> None:
    with pytest.raises(CallNotRun) as caught:
        fleet.run("echo hi", host=two_hosts[0].host, timeout=601,
                  policy=Policy(max_timeout_s=600))
    assert caught.value.kind == "invalid"
    assert "above this dialect's maximum of 600s" in caught.value.message
    result = caught.value.result  # what `check=False` returns
    assert result.error is not None and result.error.kind == "invalid"


def test_unknown_host_and_ids(two_hosts: Hosts, fleet: Fleet) -> None:
    with pytest.raises(HostUnavailable) as host:
        fleet.run("echo hi", host="no-such-host")
    assert "no-such-host" in host.value.message and "live hosts" in host.value.message
    for action in (fleet.check, fleet.kill):
        with pytest.raises(UnknownJob):
            action("j000000000000000")
    with pytest.raises(UnknownJob):
        fleet.read_output("c-never-was")
    with pytest.raises(UnknownJob) as path_like:
        fleet.check("../../etc/passwd")
    assert "no such job" in path_like.value.message


def test_invalid_regular_expressions_are_refused(two_hosts: Hosts, fleet: Fleet) -> None:
    job = fleet.run("echo hi; sleep 30", host=two_hosts[0].host, mode="background").job
    assert job is not None
    try:
        with pytest.raises(CallRejected) as caught:
            fleet.check(job.id, grep="(unclosed")
        assert "invalid regular expression" in caught.value.message
        with pytest.raises(CallRejected):
            fleet.read_output(job.id, grep="[z-a]")
        with pytest.raises(CallRejected):
            fleet.read_output(job.id, offset=-1)
    finally:
        fleet.kill(job.id)
