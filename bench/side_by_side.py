"""Two trees of the worker side by side: a small difference in a call's cost, measured.

This 2-CPU VM's speed drifts through the day by ±10%, on both sides of a benchmark
alike; a change worth 2-5% is lost in that between two runs. Here both trees run at
once, each a worker on its own host of one Redis: A is the worker and client of a git
commit (`--base`, default HEAD: unpacked with `git archive` and found first on its
worker's PYTHONPATH), B this checkout as it is. Calls alternate between the two in
blocks (`true`, p50) and in 16-caller bursts (calls/s), A first in one round and B first
in the next, so drift falls on both.

    python -m bench.side_by_side                   # HEAD against the working tree
    python -m bench.side_by_side --base 87d87c6    # a commit against the working tree
    python -m bench.side_by_side --base HEAD       # on a clean tree: A/A, the spread

An A/A run (both sides the same tree) shows what the harness cannot tell apart. On this
VM, 8 rounds: p50 within ±1.5%, calls/s within ±3%.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bashfleet.client import Fleet
from bashfleet.client.redis_server import RedisServer
from bench import cleanup
from bench.bench_fleet import _process, _wait, worker_env

REPO = Path(__file__).resolve().parents[1]
HOSTS = {"A": "side-a", "B": "side-b"}
CALLERS = 16


def unpack(ref: str, into: Path) -> Path:
    """The worker and client of commit `ref` under `into`, and a directory that, first
    on PYTHONPATH, makes `bashfleet` that tree: the returned path."""
    tree = into / "tree"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "worker", "client"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    shim = into / "shim" / "bashfleet"
    shim.mkdir(parents=True)
    # A regular package found before the installed one; its subpackages come from the tree.
    (shim / "__init__.py").write_text(f"__path__ = [{str(tree)!r}]\n")
    found = subprocess.run(
        [sys.executable, "-c", "import bashfleet.worker; print(*bashfleet.worker.__path__)"],
        env={**os.environ, "PYTHONPATH": str(shim.parent)}, capture_output=True, text=True,
        check=True).stdout.strip()
    if found != str(tree / "worker"):
        raise SystemExit(f"side A would import bashfleet from {found}, not {tree}")
    return shim.parent


def burst(url: str, host: str, seconds: float) -> float:
    """Calls a second of CALLERS callers, each with its own client, for `seconds`."""
    stop = time.monotonic() + seconds

    def loop(_: int) -> int:
        fleet, count = Fleet(url), 0
        while time.monotonic() < stop:
            result = fleet.run(f"echo {count}", host=host)
            # A side that answers wrongly must not pass for a fast one.
            assert result.stdout == f"{count}\n", result
            count += 1
        return count

    started = time.monotonic()
    with ThreadPoolExecutor(CALLERS) as pool:
        total = sum(pool.map(loop, range(CALLERS)))
    return total / (time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="HEAD", help="the commit side A runs (default HEAD)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="2 short rounds, for a smoke run")
    args = parser.parse_args(argv)
    rounds, blocks, burst_s = (2, 4, 1.0) if args.quick else (args.rounds, 20, 4.0)
    root = Path(tempfile.mkdtemp(prefix="bashfleet-side-by-side-"))
    print(f"bashfleet side by side: A = {args.base}, B = {REPO} as it is")
    print(f"python {sys.version.split()[0]}, cpus {os.cpu_count()}, {rounds} rounds")
    latencies: dict[str, list[float]] = {"A": [], "B": []}
    rates: dict[str, list[float]] = {"A": [], "B": []}
    try:
        shim = unpack(args.base, root / "base")
        with cleanup.hosts_ended(root / "a"), cleanup.hosts_ended(root / "b"), \
                RedisServer(root / "redis") as server:
            env_a = worker_env(server.url, root / "a") | {"PYTHONPATH": str(shim)}
            env_b = worker_env(server.url, root / "b")
            env_b.pop("PYTHONPATH", None)

            def worker(side: str) -> list[str]:
                return [sys.executable, "-m", "bashfleet.worker.fleet.supervisor", "--host",
                        HOSTS[side], "--concurrency", "4"]

            with _process(worker("A"), env_a, root / "a.log"), \
                    _process(worker("B"), env_b, root / "b.log"):
                fleet = Fleet(server.url)
                _wait(lambda: {h.host for h in fleet.hosts() if h.alive and h.ready}
                      >= set(HOSTS.values()), "both workers")
                for _ in range(30):
                    for host in HOSTS.values():
                        fleet.run("true", host=host)
                for number in range(rounds):
                    order = ["A", "B"] if number % 2 == 0 else ["B", "A"]
                    for block in range(blocks):
                        for side in order if block % 2 == 0 else order[::-1]:
                            for _ in range(10):
                                start = time.perf_counter()
                                fleet.run("true", host=HOSTS[side])
                                latencies[side].append(time.perf_counter() - start)
                    for side in order:
                        rates[side].append(burst(server.url, HOSTS[side], burst_s))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    p50 = {side: statistics.median(values) * 1e3 for side, values in latencies.items()}
    rate = {side: statistics.mean(values) for side, values in rates.items()}
    print()
    print(f"{'row':<34} {'A':>10} {'B':>10} {'B/A':>7}")
    print("-" * 64)
    print(f"{'`true` end to end, p50 (ms)':<34} {p50['A']:>10.3f} {p50['B']:>10.3f} "
          f"{p50['B'] / p50['A']:>7.3f}")
    print(f"{'`echo`, 16 callers (calls/s)':<34} {rate['A']:>10.0f} {rate['B']:>10.0f} "
          f"{rate['B'] / rate['A']:>7.3f}")
    print("\ncalls/s by round, A | B: "
          + " ".join(f"{a:.0f}" for a in rates["A"]) + " | "
          + " ".join(f"{b:.0f}" for b in rates["B"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
