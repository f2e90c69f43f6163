"""Scale benchmark: how the fleet's costs grow with hosts, calls in flight and records.

Starts its own Redis server and worker processes (as separate hosts would run them),
measures, and prints a table. Never fails on a miss: it reports.

- throughput with 1, 2, 4 and 8 hosts (4 slots each) on one Redis, `true` calls from
  one AsyncFleet with 16 calls in flight per host;
- Redis CPU per host heartbeat, with every host idle;
- 1,000 calls in flight from one AsyncFleet (in a process of its own): wall time against
  the slowest call, the client's threads and memory;
- 10,000 job records: how long the workers take to publish them, then `jobs()` (what
  `bashfleet ps` shows), a host's jobs, and `hosts()`;
- Redis memory per call record and per job record.

    python -m bench.bench_scale [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psutil
import redis

from bashfleet.client import AsyncFleet, Fleet
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.engine.jobs import jobs as engine_jobs
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire import names
from bashfleet.worker.wire.models import JobRecord
from bench import cleanup
from bench.bench_fleet import _process, _wait, worker_env

Row = tuple[str, str, str]


# ---------------------------------------------------------------------------- hosts


class Hosts:
    """Worker processes on one Redis, started and ended by this object."""

    def __init__(self, url: str, root: Path, stack: ExitStack) -> None:
        self.url = url
        self.root = root
        self.stack = stack

    def start(self, fleet: Fleet, hosts: list[str], slots: int) -> None:
        """Start `hosts` (each with `slots` command slots) and wait until all are ready."""
        self.root.mkdir(parents=True, exist_ok=True)
        for host in hosts:
            env = worker_env(self.url, self.root / "hosts" / host)
            args = [sys.executable, "-m", "bashfleet.worker.fleet.supervisor", "--host", host,
                    "--concurrency", str(slots)]
            self.stack.enter_context(_process(args, env, self.root / f"{host}.log"))

        def ready() -> bool:
            up = {h.host for h in fleet.hosts() if h.alive and h.ready}
            return set(hosts) <= up

        _wait(ready, f"hosts {', '.join(hosts)}", timeout=180)


@contextmanager
def _hosts(url: str, root: Path) -> Iterator[Hosts]:
    with ExitStack() as stack:
        yield Hosts(url, root, stack)


def _redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _redis_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


# ------------------------------------------------------------------------ throughput


async def _burst(url: str, hosts: list[str], calls: int, in_flight: int) -> float:
    """Calls per second of `true` calls spread over `hosts`, `in_flight` at a time."""
    async with AsyncFleet(url, max_in_flight=in_flight) as fleet:
        await asyncio.gather(*(fleet.run("true", host=h) for h in hosts))  # warm
        started = time.perf_counter()
        results = await asyncio.gather(*(
            fleet.run("true", host=hosts[i % len(hosts)]) for i in range(calls)
        ))
        elapsed = time.perf_counter() - started
    failed = [r for r in results if r.exit_code != 0]
    if failed:
        raise RuntimeError(f"{len(failed)} calls failed: {failed[0]}")
    return calls / elapsed


def throughput_rows(url: str, root: Path, quick: bool) -> tuple[list[Row], int]:
    """Throughput and idle Redis CPU with 1, 2, 4, 8 hosts; and memory per call record."""
    rows: list[Row] = []
    client = redis.Redis.from_url(url, decode_responses=True)
    fleet = Fleet(url)
    # --quick (the suite's smoke run of this bench) proves each row is made, not its figure.
    calls_per_host = 25 if quick else 400
    idle_s = 1.0 if quick else 10.0
    settle_s = 0.5 if quick else 2.0
    total_calls = 0
    memory_before = _redis_memory(client)
    # Redis' own idle work (its cron, this client): not the hosts'.
    cpu = _redis_cpu(client)
    time.sleep(idle_s)
    idle_rate = (_redis_cpu(client) - cpu) / idle_s
    rows.append(("Redis CPU idle, no host", f"{idle_rate * 1e3:.2f} ms/s",
                 "subtracted from the per-host figures below"))
    with _hosts(url, root / "small") as hosts:
        started: list[str] = []
        for count in (1, 2, 4, 8):
            new = [f"h{i}" for i in range(len(started) + 1, count + 1)]
            hosts.start(fleet, new, slots=4)
            started += new
            time.sleep(settle_s)  # settle: the new consumers' first polls
            cpu = _redis_cpu(client)
            time.sleep(idle_s)  # idle: what the hosts cost Redis while nothing runs
            spent = _redis_cpu(client) - cpu - idle_rate * idle_s
            per_beat = max(0.0, spent) / (count * idle_s / names.HEARTBEAT_INTERVAL_S)
            calls = calls_per_host * count
            cpu = _redis_cpu(client)
            rate = asyncio.run(_burst(url, started, calls, in_flight=16 * count))
            busy = (_redis_cpu(client) - cpu) / (calls + count)
            total_calls += calls + count
            rows.append((f"{count} host(s) x 4 slots: `true` calls/s", f"{rate:.0f}/s",
                         f"{rate / count:.0f}/s per host, {calls} calls, "
                         f"{16 * count} in flight; Redis {busy * 1e3:.3f} ms a call "
                         f"(its heartbeats, polls and events included): "
                         f"{1 / busy:.0f} calls/s per Redis core"))
            rows.append((f"  Redis CPU per host heartbeat, {count} idle",
                         f"{per_beat * 1e3:.3f} ms",
                         f"all of an idle host's Redis work a second (beat, polls, events); "
                         f"{per_beat * count * 100:.2f}% of a core"))
        per_call = (_redis_memory(client) - memory_before) / total_calls
    fleet.close()
    client.close()
    rows.append(("Redis memory per call record", f"{per_call:.0f} B",
                 f"call hash + stored answer, kept {names.FINISHED_TTL_S // 60} min / "
                 f"{names.REPLY_TTL_S // 60} min after the call"))
    return rows, total_calls


# ------------------------------------------------------------------- Redis ceiling

#: Sizes of what one `true` call writes through Redis (its task message, its sealed
#: answer), as `bench_fleet` measures them: the synthetic calls below carry as much.
MESSAGE_BYTES = 1500
REPLY_BYTES = 1000


def protocol_child(url: str, seconds: float, worker_no: int) -> None:
    """(In a process of its own.) Make calls through Redis as a client and a worker do,
    with the fleet's own functions, but no bash behind them: send (the client's script),
    take (BRPOP), claim, finish and answer (the worker's scripts), for `seconds`; print
    how many as JSON. Several of these drive one Redis towards its ceiling."""
    from bashfleet.client import records as client_records  # noqa: PLC0415 - the child's own imports
    from bashfleet.worker.fleet import registry  # noqa: PLC0415

    client = redis.Redis.from_url(url, decode_responses=True)
    host, queue = f"proto{worker_no}", names.exec_queue(f"proto{worker_no}")
    channel = names.reply_channel(f"bench{worker_no}")
    registry.acquire_host(client, host, "t")
    done, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        call_id = f"p{worker_no}-{uuid.uuid4().hex[:12]}"
        message = json.dumps({"headers": {"id": call_id}, "body": "x" * MESSAGE_BYTES})
        client_records.send_call(client, call_id, queue, host, message, require_alive=True)
        client.brpop([queue], timeout=1)
        registry.claim_call(client, call_id, host, "t", os.getpid(), owner="bench")
        registry.finish_and_reply(client, host, call_id, {"exit_code": 0},
                                  reply=registry.Reply(call_id, channel, "r" * REPLY_BYTES))
        done += 1
    client.close()
    print(json.dumps({"calls": done}))


def ceiling_rows(url: str, root: Path, quick: bool) -> list[Row]:
    """What one Redis carries: its CPU per call while processes make calls through it as
    fast as they can (no bash, no worker: only the fleet's Redis work), as calls/s per
    Redis core."""
    client = redis.Redis.from_url(url, decode_responses=True)
    seconds, procs = (1.0, 2) if quick else (10.0, 6)
    cpu, started = _redis_cpu(client), time.perf_counter()
    children = [subprocess.Popen(
        [sys.executable, "-m", "bench.bench_scale", "--protocol-child", url, str(seconds),
         str(index)], stdout=subprocess.PIPE, text=True) for index in range(procs)]
    outputs = [child.communicate(timeout=seconds + 60)[0] for child in children]
    wall, spent = time.perf_counter() - started, _redis_cpu(client) - cpu
    client.close()
    calls = sum(json.loads(out.strip().splitlines()[-1])["calls"] for out in outputs)
    per_core = calls / spent
    return [
        (f"Redis ceiling: {procs} processes making calls", f"{calls / wall:.0f}/s",
         f"Redis busy {spent / wall * 100:.0f}% of a core; the callers (Python) take the "
         "rest of this machine's 2 CPUs"),
        ("  calls/s per Redis core", f"{per_core:.0f}/s",
         f"{spent / calls * 1e3:.3f} ms of Redis CPU per call (send, take, claim, finish, "
         "answer)"),
    ]


# ------------------------------------------------------------------------- in flight


def in_flight_child(url: str, calls: int, hosts: list[str], seconds: float) -> None:
    """(In a process of its own.) `calls` calls of `sleep seconds` at once from one
    AsyncFleet; prints wall time, slowest call, peak threads and memory as JSON."""
    me = psutil.Process()
    rss_before = me.memory_info().rss
    peak = {"threads": me.num_threads(), "rss": rss_before}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak["threads"] = max(peak["threads"], me.num_threads())
            peak["rss"] = max(peak["rss"], me.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    async def main() -> tuple[float, float]:
        async with AsyncFleet(url, max_in_flight=calls) as fleet:
            started = time.perf_counter()
            results = await asyncio.gather(*(
                fleet.run(f"sleep {seconds}", host=hosts[i % len(hosts)], timeout=300)
                for i in range(calls)
            ))
            wall = time.perf_counter() - started
        bad = [r for r in results if r.exit_code != 0]
        # Reported, not raised: the table says how many failed and why.
        failed["count"] = len(bad)
        failed["first"] = str(bad[0].error.message if bad[0].error else bad[0])[:120] \
            if bad else ""
        return wall, max(r.duration_s for r in results)

    failed: dict[str, Any] = {}
    wall, slowest = asyncio.run(main())
    done.set()
    sampler.join()
    print(json.dumps({
        "wall": wall, "slowest": slowest, "threads": peak["threads"] - 1,  # not the sampler
        "rss_before": rss_before, "rss_peak": peak["rss"], "failed": failed,
    }))


def in_flight_rows(url: str, root: Path, quick: bool) -> list[Row]:
    """1,000 calls in flight from one AsyncFleet over 4 hosts of 250 slots."""
    calls, host_count, seconds = (64, 2, 1.0) if quick else (1000, 4, 2.0)
    slots = calls // host_count
    hosts = [f"wide{i}" for i in range(1, host_count + 1)]
    fleet = Fleet(url)
    with _hosts(url, root / "wide") as workers:
        workers.start(fleet, hosts, slots=slots)
        child = subprocess.run(
            [sys.executable, "-m", "bench.bench_scale", "--in-flight-child", url, str(calls),
             str(seconds), *hosts],
            capture_output=True, text=True, check=False, timeout=600,
        )
    fleet.close()
    if child.returncode != 0:
        raise RuntimeError(f"the in-flight client failed: {child.stderr[-2000:]}")
    found: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    return [
        (f"{calls} calls in flight, one AsyncFleet: wall", f"{found['wall']:.2f} s",
         f"slowest call {found['slowest']:.2f} s on its worker (`sleep {seconds:g}`), "
         f"{host_count} hosts x {slots} slots"
         + (f"; {found['failed']['count']} FAILED: {found['failed']['first']}"
            if found["failed"].get("count") else "")),
        ("  client threads (peak)", str(found["threads"]), "with a thread per call: 6 at a time"),
        ("  client memory (peak RSS growth)",
         f"{(found['rss_peak'] - found['rss_before']) / 2**20:.1f} MiB",
         f"{(found['rss_peak'] - found['rss_before']) / calls / 1024:.1f} KiB per call; "
         f"{found['rss_before'] / 2**20:.0f} MiB before"),
    ]


# ---------------------------------------------------------------------- job records


JOB_OWNER = "user:bench"
#: One job in this many is the listing client's; the others are other owners'.
OWN_EVERY = 100


def _owner_of(index: int) -> str:
    return JOB_OWNER if index % OWN_EVERY == 0 else f"user:other{index % 7}"


def _write_jobs(state_dir: Path, host: str, count: int) -> None:
    """`count` ended jobs on a host's disk, as the engine records them: one in OWN_EVERY
    the listing client's, the rest other owners' (a shared build host)."""
    settings = Settings(state_dir=state_dir, host=host)
    settings.jobs_dir.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for index in range(count):
        job_id = f"j{uuid.uuid4().hex[:16]}"
        output = settings.jobs_dir / f"{job_id}.log"
        output.write_text(f"job {index}\n")
        record = JobRecord(
            id=job_id, host=host, pid=1_000_000 + index, pgid=1_000_000 + index,
            start_time=now - 60, marker=job_id, command=f"make shard-{index}", cwd="/src",
            output_path=str(output), status_path=str(settings.jobs_dir / f"{job_id}.status.json"),
            started_at=now - 60 + index * 0.001,
            tags={"agent": f"a{index // OWN_EVERY % 10}"}, owner=_owner_of(index),
        )
        engine_jobs.save_record(record, settings)
        engine_jobs.write_status(record, index % 3)


def _median_time(action: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def job_rows(url: str, root: Path, quick: bool) -> list[Row]:
    """10,000 job records: publishing them, listing them, and what they cost Redis."""
    count = 500 if quick else 10_000
    host = "jobs"
    state_dir = root / "jobs" / "hosts" / host
    _write_jobs(state_dir, host, count)
    client = redis.Redis.from_url(url, decode_responses=True)
    memory_before = _redis_memory(client)
    fleet = Fleet(url, owner=JOB_OWNER)  # a client lists its own owner's jobs
    with _hosts(url, root / "jobs") as workers:
        started = time.perf_counter()
        workers.start(fleet, [host], slots=1)
        _wait(lambda: client.zcard(names.jobs_key(host)) >= count, "the job records",
              timeout=600)
        publish = time.perf_counter() - started
        per_job = (_redis_memory(client) - memory_before) / count
        listed = len(fleet.jobs())
        runs = 3 if quick else 5
        every = _median_time(fleet.jobs, runs)
        tagged = _median_time(lambda: fleet.jobs(tags={"agent": "a7"}), runs)
        hosts = _median_time(fleet.hosts, 20)
    fleet.close()
    client.close()
    own = len(range(0, count, OWN_EVERY))
    if listed != own:
        raise RuntimeError(f"jobs() listed {listed} jobs; the caller has {own} of {count}")
    return [
        (f"{count} job records: published by a starting worker", f"{publish:.1f} s",
         f"{publish / count * 1e3:.2f} ms per job (the worker's start included)"),
        (f"  `jobs()` / `bashfleet ps`: the caller's {own} of {count}", f"{every * 1e3:.0f} ms",
         f"{every / own * 1e6:.0f} us per own job, read fresh from the host's disk "
         "(its owner's index names them)"),
        ("  `jobs(tags=...)`, 1 in 10 kept", f"{tagged * 1e3:.0f} ms", "filtered in the client"),
        ("  `hosts()`", f"{hosts * 1e3:.1f} ms", "does not grow with jobs"),
        ("Redis memory per job record", f"{per_job:.0f} B",
         f"job hash + listing entry + its events, kept {names.JOB_TTL_S // 86400} days"),
    ]


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller numbers, a smoke run")
    parser.add_argument("--in-flight-child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--protocol-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.protocol_child:
        url, seconds, worker_no = args.protocol_child
        protocol_child(url, float(seconds), int(worker_no))
        return 0
    if args.in_flight_child:
        url, calls, seconds, *hosts = args.in_flight_child
        in_flight_child(url, int(calls), hosts, float(seconds))
        return 0
    root = Path(tempfile.mkdtemp(prefix="bashfleet-bench-scale-"))
    print("bashfleet scale benchmark", flush=True)
    print(f"python {sys.version.split()[0]}, cpus {os.cpu_count()}, "
          f"memory {psutil.virtual_memory().total / 2**30:.0f} GiB, state {root}", flush=True)
    started = time.perf_counter()
    rows: list[Row] = []
    with cleanup.hosts_ended(root, remove=True), RedisServer(root / "redis") as server:
        for step in (throughput_rows, ceiling_rows, in_flight_rows, job_rows):
            print(f"... {step.__name__}", file=sys.stderr, flush=True)
            found = step(server.url, root, args.quick)
            rows += found[0] if isinstance(found, tuple) else found
    print()
    print(f"{'row':<52} {'measured':<12} note")
    print("-" * 120)
    for name, measured, note in rows:
        print(f"{name:<52} {measured:<12} {note}")
    print(f"\n(total {time.perf_counter() - started:.0f} s; workers are processes on this "
          "machine, sharing its CPUs with Redis and the client)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
