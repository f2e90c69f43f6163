"""Per-call resource limits and per-host command rules, with real processes (the calls
run in the engine's work directory, a workspace the test can look into)."""

from __future__ import annotations

import resource
from pathlib import Path

from bashfleet.worker.wire.models import CallResult

from .engine_helpers import (
    Engine,
    Janitor,
    _janitor_fixture,  # noqa: F401 - fixture
    engine_with,
    wait_until,
)


def test_cpu_limit_ends_a_busy_loop_and_says_so(tmp_path: Path, janitor: Janitor) -> None:
    with engine_with(tmp_path, janitor, limit_cpu_s=1) as engine:
        result = engine.run("while :; do :; done")
    assert result.limit_hit == "cpu_time"
    assert result.signal is not None or result.exit_code != 0
    # Ended by the limit, not by its timeout (a wall-clock bound fails on a busy machine).
    assert not result.timed_out, result


def test_file_size_limit(tmp_path: Path, janitor: Janitor) -> None:
    # The call writes in its workspace (the engine's work directory), where we look.
    with engine_with(tmp_path, janitor, limit_file_mb=1) as engine:
        result = engine.run("head -c 3000000 /dev/zero > big.bin")
        assert result.limit_hit == "file_size"
        assert (engine.tmp / "big.bin").stat().st_size <= 1024 * 1024


def test_a_sandboxed_calls_file_size_limit_is_set_by_its_keeper_with_no_script(
        tmp_path: Path, janitor: Janitor) -> None:
    """With the file size its only limit and no state to capture, a sandboxed call's bash
    sources no startup script: its keeper sets RLIMIT_FSIZE as `ulimit -f` would (soft
    and hard), and BASH_ENV is unset, as the script left it."""
    with engine_with(tmp_path, janitor, isolation="process", limit_file_mb=1) as engine:
        # `ls` not last: bash would exec it, and list its own descriptors.
        show = 'ulimit -Sf; ulimit -Hf; echo "[${BASH_ENV-unset}]"; ls /proc/$$/fd; :'
        plain = engine.run(show)
        assert plain.error is None, plain
        lines = plain.stdout.split()
        assert lines[:3] == ["1024", "1024", "[unset]"], plain.stdout
        assert sorted(lines[3:], key=int) == ["0", "1", "2"]  # no script's descriptor
        # The same call keeping its shell's state still sources its script (the effect
        # this test looks for could have happened): one descriptor more, same limits.
        kept = engine.run(show, capture_state=True)
        assert kept.stdout.split()[:3] == ["1024", "1024", "[unset]"], kept.stdout
        assert len(kept.stdout.split()) == len(lines) + 1, kept.stdout


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


def _nofile(result: CallResult) -> tuple[int, int]:
    soft, hard = result.stdout.split()
    return int(soft), int(hard)


def test_open_files_are_bounded_per_workspace_and_cannot_be_raised(
        tmp_path: Path, janitor: Janitor) -> None:
    """RLIMIT_NOFILE: the host's default for every call and job (the worker's own, 20,000
    on this machine, is not what a call gets), lower where a workspace asks, never
    higher; soft and hard, so a command cannot raise it back. Sandboxed (the keeper sets
    it) and not (the startup line does)."""
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[1] > 512  # else this proves nothing
    for isolation in ("process", "none"):
        with engine_with(tmp_path / isolation, janitor, isolation=isolation,
                         limit_open_files=512) as engine:
            _open_files_bounded(engine)


def _open_files_bounded(engine: Engine) -> None:
    show = "ulimit -Sn; ulimit -Hn"
    assert _nofile(engine.run(show, workspace=engine.workspace().id)) == (512, 512)
    assert engine.workspace(limits={"open_files": 100_000}).limits.open_files == 512
    low = engine.workspace(limits={"open_files": 64})
    assert low.limits.open_files == 64
    assert _nofile(engine.run(show, workspace=low.id)) == (64, 64)
    raised = engine.run("ulimit -n 4096 && echo raised", workspace=low.id)
    assert "raised" not in raised.stdout and raised.exit_code != 0
    # Fewer than 64 descriptors (bash holds a few), then EMFILE.
    opened = engine.run("python3 -c 'import os\nn = 0\ntry:\n while True:\n"
                        "  os.open(\"/dev/null\", os.O_RDONLY); n += 1\n"
                        "except OSError as e: print(n, e.errno)'", workspace=low.id)
    count, errno = opened.stdout.split()
    assert int(count) < 64 and int(errno) == 24, opened.stdout  # EMFILE
    job = engine.run(f"{{ {show}; }} > limits.txt", workspace=low.id, background=True)
    assert job.job is not None
    wait_until(lambda: engine.run("cat limits.txt", workspace=low.id).stdout == "64\n64\n",
               timeout=20, what="the job's limits")
