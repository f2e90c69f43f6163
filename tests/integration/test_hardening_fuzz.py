"""Fuzz every dialect's tool-call arguments through the real fleet.

Each generated call must come back as a tool result (an error text or a valid result):
never an exception out of the dialect, never a stuck worker. Commands are passed to the
worker as data (`printf %s <quoted>`) so that arbitrary text reaches every layer (size
and NUL checks, JSON on Redis, sanitizing) without bash executing it. After the run a
plain `echo` still works and no command slot is left busy.

BASHFLEET_FUZZ_CASES sets the cases per dialect: 2,000 each, 10,000 per run.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bashfleet.client import Fleet
from bashfleet.client.dialects import DIALECTS, get_dialect
from bashfleet.client.dialects.base import SessionState, ToolText
from bashfleet.worker.wire.control import (
    CheckRequest,
    KillRequest,
    ReadOutputRequest,
    SessionOutput,
    WriteStdinRequest,
)
from bashfleet.worker.wire.models import CallResult, CheckResult, OutputChunk, Policy, RunRequest

from .conftest import WorkerProcess, wait_for

CASES = int(os.environ.get("BASHFLEET_FUZZ_CASES", "2000"))
counted: dict[str, int] = {}


class DataOnlyRunner:
    """A Fleet whose commands print their own text instead of running it, on one host."""

    def __init__(self, fleet: Fleet, host: str) -> None:
        self.fleet = fleet
        self.host = host

    def execute(self, request: RunRequest) -> CallResult:
        # Keep runs short whatever the fuzzer asked for: the point is the path, not sleep.
        timeout = None if request.timeout is None else min(request.timeout, 5.0)
        printed = f"printf %s {shlex.quote(request.command)}"
        # An interactive session costs a supervisor of its own (~0.1 s): the fuzz covers
        # the dialects' paths, the sessions' own tests cover them.
        return self.fleet.execute(request.model_copy(update={
            "command": printed, "host": self.host, "timeout": timeout, "stdin": "null",
        }))

    def check_job(self, request: CheckRequest) -> CheckResult:
        return self.fleet.check_job(request)

    def kill_job(self, request: KillRequest) -> CheckResult:
        return self.fleet.kill_job(request)

    def read_chunk(self, request: ReadOutputRequest) -> OutputChunk:
        return self.fleet.read_chunk(request)

    def write_stdin_request(self, request: WriteStdinRequest) -> SessionOutput:
        return self.fleet.write_stdin_request(request)


_scalar = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=True)
    | st.text(max_size=300) | st.sampled_from(["", "\x00", "a\x00b", "(", "*", "-1", "1e309"])
)


def _nested(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)


_value = st.recursive(_scalar, _nested, max_leaves=6)


def _args_for(names: Sequence[str]) -> st.SearchStrategy[dict[str, Any]]:
    key = st.sampled_from(list(names)) | st.text(max_size=12)
    return st.dictionaries(key, _value, max_size=len(names) + 1)


def _call_strategy(dialect_name: str) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    dialect = get_dialect(dialect_name)
    tools = dialect.tools(None)
    per_tool = [
        st.tuples(st.just(spec.name), _args_for(list(spec.input_schema.get("properties", {}))))
        for spec in tools
    ]
    unknown = st.tuples(st.text(max_size=12), st.dictionaries(st.text(max_size=5), _value))
    return st.one_of(*per_tool, unknown)


@pytest.mark.parametrize("dialect_name", sorted(DIALECTS))
def test_fuzzed_tool_calls_never_crash(
    dialect_name: str, two_hosts: tuple[WorkerProcess, WorkerProcess], fleet: Fleet,
    capsys: pytest.CaptureFixture[str],
) -> None:
    runner = DataOnlyRunner(fleet, two_hosts[0].host)
    dialect = get_dialect(dialect_name)

    @settings(
        max_examples=CASES, deadline=None, database=None, derandomize=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(_call_strategy(dialect_name))
    def fuzz(call: tuple[str, dict[str, Any]]) -> None:
        tool, args = call
        result = dialect.call(tool, args, runner, SessionState())
        assert isinstance(result, ToolText)
        assert isinstance(result.text, str)
        counted[dialect_name] = counted.get(dialect_name, 0) + 1

    fuzz()
    with capsys.disabled():  # the figure belongs in the CI output
        print(f"\nfuzz {dialect_name}: {counted.get(dialect_name, 0)} cases, no crash")
    assert counted.get(dialect_name, 0) >= min(CASES, 100)
    # The worker is not stuck: a plain call answers, and no slot stays busy.
    assert fleet.run("echo ok", host=runner.host, policy=Policy()).stdout == "ok\n"
    wait_for(
        lambda: all(h.busy == 0 for h in fleet.hosts() if h.host == runner.host),
        timeout=30, what="every command slot to be free again",
    )
