"""The benchmarks in bench/ still run: each one's smoke mode (`--quick`) as a process.

They are not timed here (these machines are noisy; the tables say how fast). They
start real Redis servers and workers, so a change that stops them (a worker that now
wants a signing key, a listing that now filters by owner) shows here rather than the
next time someone wants the numbers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import wait_for

REPO = Path(__file__).resolve().parents[2]

#: Each benchmark and the first words of rows its table must hold.
BENCHMARKS = {
    "bench_cli": ["python -c pass", "bashfleet --help", "bashfleet run --workspace W true",
                  "  the same, W's keeper asleep",
                  "bashfleet run --image REF true"],
    "bench_control": ["`check` p99, 16 hostile file ops", "`write` p99, 16 hostile file ops",
                      "`kill` p99, 16 hostile file ops", "`cancel` p99, 16 hostile file ops"],
    "bench_engine": ["`true` per call", "`true` in a warm workspace",
                     "`true` in a throwaway workspace", "workspace ready for its first call",
                     "1 GiB output wall time"],
    "bench_fleet": ["`true` end to end, p50", "`echo` calls, 16 callers", "`check` p99",
                    "same, the least a queued call can"],
    "bench_idle": ["idle workspaces, keepers awake", "idle workspaces, asleep (holder)",
                   "idle workspaces, asleep: PSS", "first `true` after sleep"],
    "bench_images": ["cold pull to a rootfs", "cold pull vs skopeo copy alone",
                     "cached ensure, p50"],
    "bench_snapshots": ["snapshot of", "snapshot: its source paused", "fork (n=1) ready",
                        "fork n=16 from a snapshot", "16 forks that each change 1 MiB",
                        "workspace from a snapshot on another host",
                        "fleet: fork(1) returned", "fleet: fork(1) just after a change",
                        "fleet: fork(16) returned",
                        "fleet: delete of a fork"],
    "bench_containers": ["host-root workspace ready", "workspace from a cached image ready",
                         "`true` in a warm image workspace", "workspaces on one image: disk",
                         "idle image workspaces: memory"],
    "bench_snapshot_registry": ["push + pull of a 50 MB layer", "push + pull vs skopeo copy alone",
                                "archive + unpack: zstd -3 vs gzip -6"],
    "bench_network": ["100 MB download, egress vs host", "100 MB download, allow",
                      "egress workspace ready"],
    "bench_placement": ["32 workspaces on 4 hosts: spread",
                        "16 workspaces on a label of 2 of the 4 hosts: spread",
                        "keepers left after 3 worker SIGKILLs under load"],
    "bench_interactive": ["line through `cat` in a PTY, p50", "live sessions: memory"],
    "bench_transfer": ["upload of one large file", "download of one large file",
                       "directory of 64 files up", "write_file in 4 MiB calls"],
    "bench_environments": ["time to interactive, p50", "time to interactive, p99",
                           "environments at once: wall", "environments at once: failures"],
    "side_by_side": ["`true` end to end, p50", "`echo`, 16 callers"],
    "trace_call": ["message read (BRPOP)", "CLAIM script sent", "CLAIM script answered",
                   "FINISH script", "end to end"],
    "bench_scale": ["1 host(s) x 4 slots", "8 host(s) x 4 slots", "calls in flight, one AsyncFleet",
                    "job records: published", "`jobs()` / `bashfleet ps`",
                    "Redis memory per job record"],
}


#: Benchmarks that drive a framework run where it is installed: the frameworks'
#: environment (./scripts/frameworks.sh makes it; ./scripts/test.sh runs that beside
#: pytest, and these tests run last and wait for it).
FRAMEWORK_PYTHON = {"bench_environments": REPO / ".venv-frameworks" / "bin" / "python"}

#: A file ./scripts/test.sh writes scripts/frameworks.sh's exit status to when it ends
#: (tests/conftest.py keeps this variable for the session).
FRAMEWORKS_STATUS_VAR = "BASHFLEET_TEST_FRAMEWORKS_STATUS"
#: How long a test of FRAMEWORK_PYTHON waits for scripts/frameworks.sh to end, at most.
FRAMEWORKS_WAIT_S = 1200


def _frameworks_ready() -> None:
    """Wait for the frameworks' environment where ./scripts/test.sh is making it beside
    pytest (it names the file the script's exit status lands in); fail if it failed."""
    status_file = os.environ.get(FRAMEWORKS_STATUS_VAR)
    if not status_file:
        return
    status = Path(status_file)
    wait_for(status.exists, FRAMEWORKS_WAIT_S, "./scripts/frameworks.sh to end")
    if status.read_text().strip() != "0":
        pytest.fail("./scripts/frameworks.sh failed: ./scripts/test.sh shows its output "
                    "after pytest")


def _run_quick(module: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    if module in FRAMEWORK_PYTHON:
        _frameworks_ready()
    python = FRAMEWORK_PYTHON.get(module, Path(sys.executable))
    if not python.exists():
        pytest.skip(f"{module} runs in {python.parents[1].name}: ./scripts/frameworks.sh "
                    "makes it")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BASHFLEET_")}
    env |= {"TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [str(python), "-m", f"bench.{module}", "--quick"], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=240, check=False,
    )


def _benchmark_param(module: str) -> object:
    """A bench's test, 300 s at most; one in the frameworks' environment runs last and
    may first wait for that environment to be made."""
    if module in FRAMEWORK_PYTHON:
        return pytest.param(module, marks=[pytest.mark.frameworks_venv,
                                           pytest.mark.timeout(300 + FRAMEWORKS_WAIT_S)])
    return pytest.param(module, marks=pytest.mark.timeout(300))


@pytest.mark.slow
@pytest.mark.parametrize("module", [_benchmark_param(module) for module in sorted(BENCHMARKS)])
def test_benchmark_runs_and_prints_its_table(module: str, tmp_path: Path) -> None:
    done = _run_quick(module, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("row") for line in lines), done.stdout
    for row in BENCHMARKS[module]:
        found = [line for line in lines if row in line]
        assert found, f"{module}: no row {row!r} in\n{done.stdout}"
        assert "nan" not in found[0].split(), found[0]
