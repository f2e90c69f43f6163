"""Interactive sessions benchmark: a keystroke's round trip through the fleet, and 100
live sessions on one host.

Starts its own Redis server and one bashfleet worker (sandboxed where bubblewrap works),
and measures, side by side in one run:

- round trip of one line through `cat` in a PTY (echo off, so the line that comes back
  is cat's): `write_stdin` through the fleet (client -> Redis -> the host's control
  consumer -> the session's supervisor -> the PTY, and back as soon as the output is
  there) against the same `cat` on a PTY of this process (write to the master, read the
  line back). Goal: p50 at most 5 ms above the local one;
- 100 concurrent interactive sessions on the host: memory per session (proportional set
  size of its supervisor, its sandbox runner and its `cat`), and the round trip at p99
  with all of them alive, one client and four.

    python -m bench.bench_interactive [--quick]

Never fails on a miss: it reports.
"""

from __future__ import annotations

import argparse
import os
import pty
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from bashfleet.client import Fleet
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.engine import isolate
from bashfleet.worker.wire.control import Collect
from bench import cleanup
from bench.bench_fleet import _pct, _process, _wait, worker_env

HOST = "bench-inter"
#: Echo off: what comes back is cat's copy of the line, not the terminal's echo.
CAT = "stty -echo; exec cat"
FIRST_OUTPUT = Collect(wait_s=5, settle_s=0)


def local_round_trips(count: int) -> list[float]:
    """`cat` on a PTY of ours: write a line to the master, read it back."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(["bash", "-c", CAT], stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    times = []
    try:
        _local_line(master, b"warm\n")
        for n in range(count):
            line = f"ping {n}\n".encode()
            started = time.perf_counter()
            _local_line(master, line)
            times.append(time.perf_counter() - started)
    finally:
        proc.kill()
        proc.wait()
        os.close(master)
    return times


def _local_line(master: int, line: bytes) -> None:
    os.write(master, line)
    want = line.replace(b"\n", b"\r\n")
    seen = b""
    while want not in seen:
        select.select([master], [], [], 5)
        seen += os.read(master, 65536)


def start_cat(fleet: Fleet) -> str:
    """A `cat` session, echo off, ready (its stty ran)."""
    result = fleet.run(CAT, host=HOST, stdin="pty", mode="background")
    assert result.job is not None, result
    job = result.job.id
    fleet_line(fleet, job, "ready\n")
    return job


def fleet_line(fleet: Fleet, job: str, line: str) -> float:
    """One line's round trip through the fleet: write it, return once it came back."""
    started = time.perf_counter()
    out = fleet.write_stdin(job, line, collect=FIRST_OUTPUT)
    seen = out.output
    while line not in seen:  # the rare case of a line read in two pieces
        seen += fleet.read(job, collect=FIRST_OUTPUT).output
    return time.perf_counter() - started


def fleet_round_trips(fleet: Fleet, jobs: list[str], count: int, workers: int = 1) -> list[float]:
    """`count` round trips spread over `jobs` (each job used by one thread at a time)."""
    lock = threading.Lock()
    times: list[float] = []

    def run(part: list[str], n: int) -> None:
        for i in range(n):
            took = fleet_line(fleet, part[i % len(part)], f"ping {i}\n")
            with lock:
                times.append(took)

    parts = [jobs[k::workers] for k in range(workers)]
    with ThreadPoolExecutor(workers) as pool:
        for done in [pool.submit(run, part, count // workers) for part in parts]:
            done.result()
    return times


def session_memory(state: Path, jobs: list[str]) -> float:
    """Mean PSS (bytes) of a session's processes: its supervisor (its command line names
    the job), its runner (the shell's parent, sandboxed) and the shell (now `cat`)."""
    by_job: dict[str, list[psutil.Process]] = {job: [] for job in jobs}
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if isolate.runs(line.split(), "job_supervisor"):
            for job in jobs:
                if job in line:
                    by_job[job].append(proc)
    for job in jobs:
        record = (state / "jobs" / f"{job}.json").read_text()
        pid = int(record.split('"pid":')[1].split(",")[0])
        cat = psutil.Process(pid)
        by_job[job].append(cat)
        parent = cat.parent()
        if parent is not None and not any(parent.pid == p.pid for p in by_job[job]):
            by_job[job].append(parent)
    totals = []
    for procs in by_job.values():
        total = 0
        for proc in procs:
            try:
                total += proc.memory_full_info().pss
            except psutil.Error:
                continue
        totals.append(total)
    return statistics.mean(totals)


def _row(name: str, measured: str, baseline: str, target: str, ok: bool | None) -> str:
    status = "info" if ok is None else ("ok" if ok else "MISS")
    return f"{name:<46} {measured:<22} {baseline:<22} {target:<16} {status}"


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:.2f} ms (p99 {_pct(values, 0.99) * 1e3:.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer round trips and sessions")
    args = parser.parse_args(argv)
    trips, sessions = (100, 20) if args.quick else (1000, 100)
    root = Path(tempfile.mkdtemp(prefix="bashfleet-bench-inter-"))
    print("bashfleet interactive benchmark")
    print(f"python {sys.version.split()[0]}, cpus {os.cpu_count()}, state {root}")
    with cleanup.hosts_ended(root, remove=True), RedisServer(root / "redis") as server:
        env = worker_env(server.url, root / "host")
        env["BASHFLEET_INTERACTIVE_MAX_PER_OWNER"] = str(sessions + 10)
        worker = [sys.executable, "-m", "bashfleet.worker.fleet.supervisor", "--host", HOST]
        with _process(worker, env, root / "worker.log"):
            fleet = Fleet(server.url)
            _wait(lambda: any(h.host == HOST and h.alive and h.ready for h in fleet.hosts()),
                  "the bashfleet worker")
            local = local_round_trips(trips)
            first = start_cat(fleet)
            for _ in range(20):
                fleet_line(fleet, first, "warm\n")
            ours = fleet_round_trips(fleet, [first], trips)
            local_again = local_round_trips(trips)
            available = psutil.virtual_memory().available
            began = time.perf_counter()
            jobs = [first] + [start_cat(fleet) for _ in range(sessions - 1)]
            start_s = (time.perf_counter() - began) / (sessions - 1)
            drop = (available - psutil.virtual_memory().available) / (sessions - 1)
            pss = session_memory(root / "host", jobs)
            many = fleet_round_trips(fleet, jobs, trips)
            many4 = fleet_round_trips(fleet, jobs, trips, workers=4)
            for job in jobs:
                fleet.kill(job)
            fleet.close()
    local_all = local + local_again
    p50, l50 = statistics.median(ours), statistics.median(local_all)
    print()
    print(_row("row", "measured", "baseline", "target", None).replace("info", "status"))
    print("-" * 116)
    print(_row("line through `cat` in a PTY, p50", _ms(ours), f"local {_ms(local_all)}",
               "<= local + 5 ms", p50 - l50 <= 0.005))
    print(_row("  same, p50 added by the fleet (info)", f"{(p50 - l50) * 1e3:.2f} ms", "-",
               "-", None))
    print(_row(f"{sessions} live sessions: memory per session", f"{pss / 2**20:.1f} MiB PSS",
               f"host {drop / 2**20:.1f} MiB", "info", None))
    print(_row(f"{sessions} live sessions: round trip, 1 client", _ms(many),
               f"local {_ms(local_all)}", "info", None))
    print(_row(f"{sessions} live sessions: round trip, 4 clients", _ms(many4), "-", "info",
               None))
    print(_row("session start (mode background, info)", f"{start_s * 1e3:.1f} ms", "-", "-",
               None))
    print(f"\n(local: the same `{CAT}` on a PTY of this process; fleet: write_stdin through "
          "Redis and the host's control consumer, answered at the first output; host "
          "memory: MemAvailable drop per session)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
