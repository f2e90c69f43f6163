"""Per-call resource limits and per-host command rules, with real processes (the calls
run in the engine's work directory, a workspace the test can look into)."""

from __future__ import annotations

import time
from pathlib import Path

from .engine_helpers import (
    Janitor,
    _janitor_fixture,  # noqa: F401 - fixture
    engine_with,
)


def test_cpu_limit_ends_a_busy_loop_and_says_so(tmp_path: Path, janitor: Janitor) -> None:
    with engine_with(tmp_path, janitor, limit_cpu_s=1) as engine:
        started = time.monotonic()
        result = engine.run("while :; do :; done")
    assert result.limit_hit == "cpu_time"
    assert result.signal is not None or result.exit_code != 0
    assert time.monotonic() - started < 10


def test_file_size_limit(tmp_path: Path, janitor: Janitor) -> None:
    # The call writes in its workspace (the engine's work directory), where we look.
    with engine_with(tmp_path, janitor, limit_file_mb=1) as engine:
        result = engine.run("head -c 3000000 /dev/zero > big.bin")
        assert result.limit_hit == "file_size"
        assert (engine.tmp / "big.bin").stat().st_size <= 1024 * 1024


def test_memory_limit(tmp_path: Path, janitor: Janitor) -> None:
    with engine_with(tmp_path, janitor, limit_memory_mb=300) as engine:
        result = engine.run("python3 -c 'x = bytearray(800 * 1024 * 1024)'")
    assert result.exit_code != 0
    assert result.limit_hit == "memory"


def test_limits_leave_ordinary_calls_alone(tmp_path: Path, janitor: Janitor) -> None:
    with engine_with(tmp_path, janitor, limit_cpu_s=5, limit_memory_mb=500,
                 limit_file_mb=10) as engine:
        result = engine.run("echo fine")
    assert (result.exit_code, result.stdout, result.limit_hit) == (0, "fine\n", None)


def test_deny_rule_blocks_and_names_the_rule(tmp_path: Path, janitor: Janitor) -> None:
    with engine_with(tmp_path, janitor, command_deny=(r"\bshutdown\b",)) as engine:
        marker = engine.tmp / "ran"  # in the call's workspace: it could write there
        result = engine.run(f"touch {marker}; shutdown -h now")
        assert result.error is not None and result.error.kind == "blocked"
        assert r"\bshutdown\b" in result.error.message
        assert not marker.exists()


def test_allow_rules_admit_only_matching_commands(tmp_path: Path, janitor: Janitor) -> None:
    with engine_with(tmp_path, janitor, command_allow=(r"^echo\b", r"^touch\b")) as engine:
        assert engine.run("echo ok").stdout == "ok\n"
        refused = engine.run("uname")
        assert refused.error is not None and "allow rules" in refused.error.message
        # What the rules refuse does not run: the same `touch` runs when allowed.
        marker = engine.tmp / "ran"
        assert engine.run(f"uname; touch {marker}").error is not None
        assert not marker.exists()
        assert engine.run(f"touch {marker}").error is None
        assert marker.exists()
