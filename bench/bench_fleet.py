"""Fleet benchmark: end-to-end latency, throughput and control latency under load.

Starts its own Redis server, one bashfleet worker and one bare Celery worker (the
baseline: `bench/bare_app.py`, a task running `subprocess.run(["bash","-c",...])`)
against that same Redis, and prints a table. Never fails on a miss: it reports.

    python -m bench.bench_fleet [--quick]
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import redis
from celery import Celery

from bashfleet.client import Fleet
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.engine import isolate
from bashfleet.worker.wire import names
from bench import cleanup, redis_stats
from bench.redis_floor import FloorFleet

HOST = "bench"
BARE_QUEUE = "bare.exec"


def worker_env(url: str, state_dir: Path) -> dict[str, str]:
    """The environment of a worker of this benchmark: its Redis, its state, its
    workspaces' directories beside it (`cleanup.workspace_root`), a signing key.

    The key is made once per process and put in this process's environment too, so
    every client the benchmark makes signs its calls with it (workers refuse unsigned
    calls). Nothing of the caller's own BASHFLEET_* settings leaks in.
    """
    key = os.environ.setdefault("BASHFLEET_SIGNING_KEY", secrets.token_hex(16))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BASHFLEET_")}
    return env | {"BASHFLEET_REDIS_URL": url, "BASHFLEET_STATE_DIR": str(state_dir),
                  "BASHFLEET_WORKSPACE_ROOT": str(cleanup.workspace_root(state_dir)),
                  "BASHFLEET_SIGNING_KEY": key}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _wait(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)  # polling a condition with a deadline


@contextmanager
def _process(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as handle:
        proc = subprocess.Popen(
            args, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield proc
    finally:
        # Ours, by its group id (it leads a session of its own).
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _bare_client(url: str) -> Celery:
    app = Celery("bare-client", broker=url, backend=url)
    app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"])
    return app


def _bare_call(app: Celery, command: str) -> None:
    result = app.send_task("bare.run", args=[command], queue=BARE_QUEUE)
    result.get(timeout=60)
    result.forget()


def latency(fleet: Fleet, bare: Celery, calls: int) -> tuple[list[float], list[float]]:
    """Sequential `true` calls, alternating blocks of 10 between the two."""
    ours: list[float] = []
    base: list[float] = []
    for block in range(calls // 10):
        for _ in range(10):
            if block % 2 == 0:
                start = time.perf_counter()
                fleet.run("true", host=HOST)
                ours.append(time.perf_counter() - start)
            else:
                start = time.perf_counter()
                _bare_call(bare, "true")
                base.append(time.perf_counter() - start)
        for _ in range(10):
            if block % 2 == 0:
                start = time.perf_counter()
                _bare_call(bare, "true")
                base.append(time.perf_counter() - start)
            else:
                start = time.perf_counter()
                fleet.run("true", host=HOST)
                ours.append(time.perf_counter() - start)
    return ours, base


@dataclass
class Cpu:
    """CPU seconds spent by each party during one side's bursts."""

    client: float = 0.0
    worker: float = 0.0
    bash: float = 0.0
    redis: float = 0.0

    def add(self, other: Cpu) -> None:
        """Sum another burst's figures in."""
        self.client += other.client
        self.worker += other.worker
        self.bash += other.bash
        self.redis += other.redis


def _cpu_now(worker_pid: int, redis_pid: int) -> Cpu:
    """CPU used so far: this process (the callers), the worker's processes (their own,
    and the commands they reaped), Redis."""
    def own(proc: psutil.Process) -> float:
        try:
            times = proc.cpu_times()
        except psutil.Error:  # a workspace's keeper that ended since it was listed
            return 0.0
        return float(times.user + times.system)

    def reaped(proc: psutil.Process) -> float:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            return 0.0
        return float(times.children_user + times.children_system)

    top = psutil.Process(worker_pid)
    tree = [top, *top.children(recursive=True), *_sandbox_runners(top.create_time())]
    # What a worker process (or its sandbox's runner) reaped is the bash commands it ran
    # (a consumer a supervisor reaped would count too: none restarts here).
    return Cpu(
        client=own(psutil.Process()), worker=sum(own(p) for p in tree),
        bash=sum(reaped(p) for p in tree), redis=own(psutil.Process(redis_pid)),
    )


def _sandbox_runners(since: float) -> list[psutil.Process]:
    """The workspaces' keepers started since `since`: they spawn and reap the calls'
    bash, and leave the worker's process tree (the zygote forks them twice, into a PID
    namespace of their own), so a tree walk does not find them. (A keeper that ends
    between two looks takes its CPU with it: workspaces are recycled, few end.)"""
    found = []
    for proc in psutil.process_iter(["ppid", "create_time", "cmdline"]):
        args = proc.info["cmdline"] or []
        if (proc.info["ppid"] == 1 and proc.info["create_time"] >= since
                and isolate.runs(args, "launcher")):
            found.append(proc)
    return found


def _cpu_delta(before: Cpu, after: Cpu) -> Cpu:
    return Cpu(after.client - before.client, after.worker - before.worker,
               after.bash - before.bash, after.redis - before.redis)


@dataclass
class Side:
    """What one side's bursts cost: the CPU of each party, Redis' commands and CPU, and
    the keys its calls left in Redis."""

    cpu: Cpu
    redis: redis_stats.Spent
    left: redis_stats.Left


def throughput(
    url: str, bare: Celery, calls: int, clients: int, *, pids: dict[str, int],
    floor: FloorFleet, rounds: int = 4,
) -> tuple[float, float, dict[str, Side], redis_stats.Spent]:
    """Calls per second of `echo N` with `clients` concurrent callers, each side, what
    each side's calls cost (`pids`: ours, bare, redis), and what the same calls cost
    Redis through `floor` (`redis_floor`: the least a queued call can).

    The calls go in `rounds` bursts a side, in the order ours, bare, bare, ours, ... so
    that a machine getting slower or faster during the run favours neither side; the
    floor's burst comes first in a round, then last. The keys Redis holds are listed
    before and after each burst, outside its measured window: what appeared is what
    that burst's calls left.
    """
    local = threading.local()
    probe = redis.Redis.from_url(url, decode_responses=True)

    def ours(i: int) -> None:
        if not hasattr(local, "fleet"):
            local.fleet = Fleet(url)
        result = local.fleet.run(f"echo {i}", host=HOST)
        assert result.stdout == f"{i}\n", result

    def base(i: int) -> None:
        _bare_call(bare, f"echo {i}")

    def least(i: int) -> None:
        assert floor.call(f"echo {i}") == f"{i}\n"

    elapsed = {ours: 0.0, base: 0.0}
    sides = {name: Side(Cpu(), redis_stats.Spent(), redis_stats.Left())
             for name in ("ours", "bare")}
    side = {ours: "ours", base: "bare"}
    per_round = calls // rounds
    least_spent = redis_stats.Spent()
    with ThreadPoolExecutor(clients) as pool:
        for round_no in range(rounds):
            order = (ours, base) if round_no % 2 == 0 else (base, ours)
            if round_no % 2 == 0:
                _floor_burst(pool, least, probe, per_round, least_spent)
            for fn in order:
                worker, spent = pids[side[fn]], sides[side[fn]]
                keys_before = redis_stats.keys(probe)
                before = _cpu_now(worker, pids["redis"])
                stats_before = redis_stats.snapshot(probe)
                start = time.perf_counter()
                list(pool.map(fn, range(per_round)))
                elapsed[fn] += time.perf_counter() - start
                spent.redis.add(stats_before, redis_stats.snapshot(probe), per_round)
                spent.cpu.add(_cpu_delta(before, _cpu_now(worker, pids["redis"])))
                new_keys = redis_stats.keys(probe) - keys_before
                spent.left.add(probe, new_keys, per_round, horizon_s=names.REPLY_TTL_S)
            if round_no % 2 == 1:
                _floor_burst(pool, least, probe, per_round, least_spent)
    probe.close()
    done = per_round * rounds
    return done / elapsed[ours], done / elapsed[base], sides, least_spent


def _floor_burst(pool: ThreadPoolExecutor, least: Callable[[int], None], probe: redis.Redis,
                 calls: int, spent: redis_stats.Spent) -> None:
    """One burst of `calls` through the floor (`redis_floor`), its Redis counted in."""
    before = redis_stats.snapshot(probe)
    list(pool.map(least, range(calls)))
    spent.add(before, redis_stats.snapshot(probe), calls)


def check_under_load(fleet: Fleet, url: str, slots: int, checks: int) -> list[float]:
    """Latency of `check` on a background job while every command slot is busy."""
    job = fleet.run("sleep 120", host=HOST, mode="background").job
    assert job is not None
    ids = [uuid.uuid4().hex for _ in range(slots)]
    pool = ThreadPoolExecutor(slots)
    busy = [pool.submit(Fleet(url).run, "sleep 60", host=HOST, call_id=i) for i in ids]
    _wait(lambda: any(h.busy >= slots for h in fleet.hosts() if h.host == HOST), "busy slots")
    times = []
    for _ in range(checks):
        start = time.perf_counter()
        fleet.check(job.id)
        times.append(time.perf_counter() - start)
    for call_id in ids:
        fleet.cancel(call_id)
    for future in busy:
        future.result(timeout=60)
    pool.shutdown()
    fleet.kill(job.id)
    return times


def _row(
    name: str, measured: str, baseline: str, ratio: str, target: str, *, ok: bool | None
) -> str:
    status = "info" if ok is None else ("ok" if ok else "MISS")
    return f"{name:<44} {measured:<18} {baseline:<18} {ratio:<7} {target:<12} {status}"


def print_cost_rows(sides: dict[str, Side], burst: int, floor: redis_stats.Spent) -> None:
    """The rows of what a call costs each party, from the `echo` bursts (`floor`: what
    the same calls cost Redis through `redis_floor`)."""
    ours, bare = sides["ours"], sides["bare"]
    w_ours, w_bare = ours.cpu.worker / burst * 1e3, bare.cpu.worker / burst * 1e3
    print(_row("worker CPU per call", f"{w_ours:.2f} ms", f"{w_bare:.2f} ms",
               f"{w_ours / w_bare:.2f}x", "<= 1.00x", ok=w_ours <= w_bare))
    c_ours, c_bare = ours.redis.commands_per_call(), bare.redis.commands_per_call()
    print(_row("Redis commands per call", f"{c_ours:.1f}", f"{c_bare:.1f}",
               f"{c_ours / c_bare:.2f}x", "<= 10", ok=c_ours <= 10))
    r_ours, r_bare = ours.redis.cpu_ms_per_call(), bare.redis.cpu_ms_per_call()
    print(_row("Redis CPU per call", f"{r_ours:.3f} ms", f"{r_bare:.3f} ms",
               f"{r_ours / r_bare:.2f}x", "<= 0.120 ms", ok=r_ours <= 0.120))
    r_floor = floor.cpu_ms_per_call()
    print(_row("  same, the least a queued call can (info)", f"{r_floor:.3f} ms", "-",
               f"{r_ours / r_floor:.2f}x", "-", ok=None))
    m_ours, m_bare = ours.left.sustained_mb(), bare.left.sustained_mb()
    forever = ours.left.forever or bare.left.forever
    print(_row("Redis memory per call/s, sustained", f"{m_ours:.2f} MB", f"{m_bare:.2f} MB",
               "-", "<= 2 MB", ok=m_ours <= 2.0 and not forever))
    now_ours, now_bare = ours.left.per_call(ours.left.bytes_now), bare.left.per_call(
        bare.left.bytes_now)
    print(_row("Redis memory left per call (info)", f"{now_ours:.0f} B", f"{now_bare:.0f} B",
               "-", "-", ok=None))
    after = f"  same, after {names.REPLY_TTL_S} s (info)"
    print(_row(after, f"{ours.left.per_call(ours.left.bytes_after):.0f} B",
               f"{bare.left.per_call(bare.left.bytes_after):.0f} B", "-", "-", ok=None))


def print_cost_notes(sides: dict[str, Side], burst: int, floor: redis_stats.Spent) -> None:
    """Under the table: the CPU split, the commands run most, the keys left."""
    print(f"\nCPU per call during the `echo` bursts, ms (the callers, the worker's own "
          f"processes, the bash commands they ran, Redis; {burst} calls a side):")
    print(f"{'side':<6} {'callers':>8} {'worker':>8} {'bash':>8} {'redis':>8} {'total':>8}")
    for name, side in sides.items():
        cpu = side.cpu
        parts = [cpu.client, cpu.worker, cpu.bash, cpu.redis]
        cells = " ".join(f"{part / burst * 1e3:8.2f}" for part in [*parts, sum(parts)])
        print(f"{name:<6} {cells}")
    print("\nRedis commands per call, most run first (those inside scripts included):")
    for name, side in sides.items():
        print(f"  {name}: {side.redis.top()}")
    print(f"  floor: {floor.top()} (`redis_floor`: the least a queued call with a pushed "
          "answer can send, no record)")
    print("Redis time in commands per call, most first (INFO commandstats usec; a script's "
          "time includes its inner commands'):")
    for name, side in sides.items():
        print(f"  {name}: {side.redis.top_time()}")
    print("Redis memory left per call, by kind of key (sizes by MEMORY USAGE; "
          "sustained = bytes x TTL):")
    for name, side in sides.items():
        left = side.left
        forever = f", {left.forever} key(s) with no TTL" if left.forever else ""
        print(f"  {name}: {left.top() or 'nothing'}{forever}; INFO used_memory "
              f"{side.redis.memory_delta / max(1, side.redis.calls):+.0f} B per call")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer calls, for a smoke run")
    args = parser.parse_args(argv)
    calls, burst, checks, slots = (40, 200, 50, 4) if args.quick else (400, 2000, 400, 4)
    root = Path(tempfile.mkdtemp(prefix="bashfleet-bench-fleet-"))
    print("bashfleet fleet benchmark")
    print(f"python {sys.version.split()[0]}, cpus {os.cpu_count()}, state {root}")
    with cleanup.hosts_ended(root, remove=True), RedisServer(root / "redis") as server:
        env = worker_env(server.url, root / "host") | {"BARE_REDIS_URL": server.url}
        worker = [sys.executable, "-m", "bashfleet.worker.fleet.supervisor", "--host", HOST,
                  "--concurrency", str(slots)]
        bare_worker = [sys.executable, "-m", "celery", "-A", "bench.bare_app", "worker",
                       "-P", "threads", "-c", str(slots), "-Q", BARE_QUEUE, "-n", "bare@%h",
                       "--without-gossip", "--without-mingle", "-l", "WARNING"]
        with _process(worker, env, root / "worker.log") as ours_worker, \
                _process(bare_worker, env, root / "bare.log") as bare_proc:
            fleet = Fleet(server.url)
            bare = _bare_client(server.url)
            _wait(lambda: any(h.host == HOST and h.alive and h.ready for h in fleet.hosts()),
                  "the bashfleet worker")
            _bare_call(bare, "true")  # the bare worker is up once it answers
            for _ in range(20):
                fleet.run("true", host=HOST)
                _bare_call(bare, "true")
            ours, base = latency(fleet, bare, calls)
            pids = {"ours": ours_worker.pid, "bare": bare_proc.pid, "redis": server.pid or 0}
            with FloorFleet(server.url, workers=slots) as floor:
                ours_rate, base_rate, sides, least = throughput(
                    server.url, bare, burst, clients=16, pids=pids, floor=floor)
            check_times = check_under_load(fleet, server.url, slots, checks)
    print()
    print(_row("row", "measured", "baseline", "ratio", "target", ok=None).replace("info", "status"))
    print("-" * 110)
    p50, b50 = statistics.median(ours), statistics.median(base)
    print(_row("`true` end to end, p50", f"{p50 * 1e3:.2f} ms", f"{b50 * 1e3:.2f} ms",
               f"{p50 / b50:.2f}x", "<= 1.20x", ok=p50 / b50 <= 1.2))
    p99, b99 = _pct(ours, 0.99), _pct(base, 0.99)
    print(_row("`true` end to end, p99 (info)", f"{p99 * 1e3:.2f} ms", f"{b99 * 1e3:.2f} ms",
               f"{p99 / b99:.2f}x", "-", ok=None))
    print(_row(f"{burst} `echo` calls, 16 callers", f"{ours_rate:.0f} calls/s",
               f"{base_rate:.0f} calls/s", f"{ours_rate / base_rate:.2f}x", ">= 1.00x",
               ok=ours_rate >= base_rate))
    print_cost_rows(sides, burst, least)
    c99 = _pct(check_times, 0.99)
    print(_row(f"`check` p99, all {slots} slots busy", f"{c99 * 1e3:.2f} ms", "-", "-",
               "<= 20 ms", ok=c99 <= 0.020))
    print(_row("`check` p50, all slots busy (info)",
               f"{statistics.median(check_times) * 1e3:.2f} ms", "-", "-", "-", ok=None))
    print(f"\n(baseline: bare Celery task running subprocess.run on the same Redis, {slots} "
          "threads each side; ratios are measured / baseline)")
    print_cost_notes(sides, burst, least)
    return 0


if __name__ == "__main__":
    sys.exit(main())
