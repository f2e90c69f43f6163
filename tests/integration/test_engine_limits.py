"""Per-call resource limits and per-host command rules, with real processes."""

from __future__ import annotations

import time
from pathlib import Path

from worker import Call, Settings, run_call


def _settings(tmp_path: Path, **limits: object) -> Settings:
    return Settings(state_dir=tmp_path / "state", host="lim", **limits)  # type: ignore[arg-type]


def test_cpu_limit_ends_a_busy_loop_and_says_so(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_call(Call(call_id="cpu-1", command="while :; do :; done"),
                      settings=_settings(tmp_path, limit_cpu_s=1))
    assert result.limit_hit == "cpu_time"
    assert result.signal is not None or result.exit_code != 0
    assert time.monotonic() - started < 10


def test_file_size_limit(tmp_path: Path) -> None:
    result = run_call(
        Call(call_id="fsz-1", command="head -c 3000000 /dev/zero > big.bin", cwd=str(tmp_path)),
        settings=_settings(tmp_path, limit_file_mb=1),
    )
    assert result.limit_hit == "file_size"
    assert (tmp_path / "big.bin").stat().st_size <= 1024 * 1024


def test_memory_limit(tmp_path: Path) -> None:
    result = run_call(
        Call(call_id="mem-1", command="python3 -c 'x = bytearray(800 * 1024 * 1024)'"),
        settings=_settings(tmp_path, limit_memory_mb=300),
    )
    assert result.exit_code != 0
    assert result.limit_hit == "memory"


def test_limits_leave_ordinary_calls_alone(tmp_path: Path) -> None:
    result = run_call(
        Call(call_id="ok-1", command="echo fine"),
        settings=_settings(tmp_path, limit_cpu_s=5, limit_memory_mb=500, limit_file_mb=10),
    )
    assert (result.exit_code, result.stdout, result.limit_hit) == (0, "fine\n", None)


def test_deny_rule_blocks_and_names_the_rule(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    result = run_call(
        Call(call_id="deny-1", command=f"touch {marker}; shutdown -h now"),
        settings=_settings(tmp_path, command_deny=(r"\bshutdown\b",)),
    )
    assert result.error is not None and result.error.kind == "blocked"
    assert r"\bshutdown\b" in result.error.message
    assert not marker.exists()


def test_allow_rules_admit_only_matching_commands(tmp_path: Path) -> None:
    settings = _settings(tmp_path, command_allow=(r"^echo\b",))
    assert run_call(Call(call_id="allow-1", command="echo ok"), settings=settings).stdout == "ok\n"
    refused = run_call(Call(call_id="allow-2", command="uname"), settings=settings)
    assert refused.error is not None and "allow rules" in refused.error.message
