"""Environments benchmark: what an orchestrator's environment costs on bashfleet.

    .venv-frameworks/bin/python -m bench.bench_environments [--quick] [--samples N]
        [--at-once N] [--slots N]

Runs in the frameworks' environment (`./scripts/frameworks.sh` makes .venv-frameworks):
it drives bashfleet through inspect-ai's sandbox API, as an eval does, against its own
Redis server and one worker, and prints a table. Every row has its baseline measured in
the same run, interleaved with it:

1. Time to interactive: an environment made (`sample_init`: a workspace on the fleet)
   until its first command answered (`exec(["true"])`), N samples one after the other,
   p50 and p99. Baselines: inspect's `local` sandbox (a temporary directory and a local
   process), and a bare `subprocess.run(["bash", "-c", "true"])` (no environment at all).
   Target: the p50 under the best median the sandbox services publish for the same span
   (0.11 s; the published medians run from 0.11 s to 2.7 s).
2. N environments at once (100 by default), through the same adapter: each one made,
   used (two commands, a file written and read back) and cleaned up, all started
   together; the wall time of the whole, and each environment's time to interactive
   under that load. Baseline: inspect's `local` sandbox doing the same (its exec not
   throttled by inspect's subprocess limit, so both sides run everything at once). Every
   environment must come back with the right answers (a wrong one is a failure row).

Not a test: it never fails on a miss. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from inspect_ai.util import SandboxEnvironment
from inspect_ai.util._sandbox.local import LocalSandboxEnvironment

from bashfleet.client import Fleet
from bashfleet.client.integrations.inspect_ai import (
    BashfleetSandboxConfig,
    BashfleetSandboxEnvironment,
)
from bashfleet.client.redis_server import RedisServer
from bench import cleanup
from bench.bench_fleet import _pct, _process, _wait, worker_env

HOST = "bench-env"
#: The best median the sandbox services publish from create to the first command, and
#: the worst.
PUBLISHED_BEST_S = 0.11
PUBLISHED_WORST_S = 2.7

#: Makes one environment, returns it and the function that cleans it up.
Maker = Callable[[], Awaitable[tuple[SandboxEnvironment, Callable[[], Awaitable[None]]]]]


def bashfleet_maker(config: BashfleetSandboxConfig) -> Maker:
    async def make() -> tuple[SandboxEnvironment, Callable[[], Awaitable[None]]]:
        envs = await BashfleetSandboxEnvironment.sample_init("bench", config, {})

        async def cleanup() -> None:
            await BashfleetSandboxEnvironment.sample_cleanup("bench", config, envs, False)

        return envs["default"], cleanup
    return make


async def local_make() -> tuple[SandboxEnvironment, Callable[[], Awaitable[None]]]:
    envs = await LocalSandboxEnvironment.sample_init("bench", None, {})

    async def cleanup() -> None:
        await LocalSandboxEnvironment.sample_cleanup("bench", None, envs, False)

    return envs["default"], cleanup


def exec_options(env: SandboxEnvironment) -> dict[str, bool]:
    # inspect throttles the local sandbox's processes to its subprocess limit (the CPU
    # count) unless told not to: told, so that both sides run everything at once.
    return {"concurrency": False} if isinstance(env, LocalSandboxEnvironment) else {}


# ------------------------------------------------------------- time to interactive


async def time_to_interactive(make: Maker) -> float:
    """Seconds from asking for an environment to its first command's answer."""
    start = time.perf_counter()
    env, cleanup = await make()
    done = await env.exec(["true"], **exec_options(env))
    took = time.perf_counter() - start
    await cleanup()
    if not done.success:
        raise RuntimeError(f"`true` failed in {type(env).__name__}: {done.stderr}")
    return took


def bare_true() -> float:
    start = time.perf_counter()
    subprocess.run(["bash", "-c", "true"], check=True)
    return time.perf_counter() - start


async def interactive_rows(ours: Maker, samples: int, warmup: int
                           ) -> dict[str, list[float]]:
    """Each side `samples` times, in rotating order (noise hits every side alike)."""
    sides: dict[str, Callable[[], Awaitable[float]]] = {
        "bashfleet": lambda: time_to_interactive(ours),
        "local": lambda: time_to_interactive(local_make),
        "subprocess": lambda: asyncio.to_thread(bare_true),
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for round_ in range(warmup + samples):
        order = names[round_ % len(names):] + names[:round_ % len(names)]
        for name in order:
            took = await sides[name]()
            if round_ >= warmup:
                times[name].append(took)
    return times


# --------------------------------------------------------------- many at once


@dataclass
class Crowd:
    """N environments used at once: their times to interactive, wall time, failures."""

    tti: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    failures: list[str] = field(default_factory=list)


async def use_one(make: Maker, index: int, started: float, crowd: Crowd) -> None:
    """Make an environment, use it as an agent would, check every answer, clean up."""
    env, cleanup = await make()
    try:
        options = exec_options(env)
        first = await env.exec(["echo", f"env {index}"], **options)
        crowd.tti.append(time.perf_counter() - started)
        await env.write_file("data.txt", f"{index}\n" * 100)
        back = await env.read_file("data.txt")
        counted = await env.exec(["sh", "-c", "wc -l < data.txt"], **options)
        if first.stdout != f"env {index}\n" or back != f"{index}\n" * 100 or \
                counted.stdout.strip() != "100":
            crowd.failures.append(f"env {index}: wrong answers")
    finally:
        await cleanup()


async def at_once(make: Maker, count: int) -> Crowd:
    crowd = Crowd()
    started = time.perf_counter()
    results = await asyncio.gather(*(use_one(make, i, started, crowd) for i in range(count)),
                                   return_exceptions=True)
    crowd.wall_s = time.perf_counter() - started
    crowd.failures += [f"{type(error).__name__}: {error}" for error in results
                       if isinstance(error, BaseException)]
    return crowd


# ---------------------------------------------------------------------- table


def _row(name: str, measured: str, baseline: str, ratio: str, target: str, *,
         ok: bool | None) -> str:
    status = "info" if ok is None else ("ok" if ok else "MISS")
    return f"{name:<46} {measured:<14} {baseline:<14} {ratio:<8} {target:<14} {status}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def print_table(times: dict[str, list[float]], ours: Crowd, local: Crowd, count: int) -> None:
    print()
    print(_row("row", "measured", "baseline", "ratio", "target", ok=None)
          .replace("info", "status"))
    print("-" * 108)
    ours_tti, local_tti, bare = times["bashfleet"], times["local"], times["subprocess"]
    for label, q in (("p50", 0.5), ("p99", 0.99)):
        mine, base = _pct(ours_tti, q), _pct(local_tti, q)
        target = f"<= {PUBLISHED_BEST_S * 1e3:.0f} ms" if q == 0.5 else "-"
        print(_row(f"time to interactive, {label}", _ms(mine), _ms(base),
                   f"{mine / base:.2f}x", target,
                   ok=mine <= PUBLISHED_BEST_S if q == 0.5 else None))
    p50, bare50 = statistics.median(ours_tti), statistics.median(bare)
    print(_row("time to interactive vs subprocess.run (info)", _ms(p50), _ms(bare50),
               f"{p50 / bare50:.2f}x", "-", ok=None))
    print(_row(f"{count} environments at once: wall", f"{ours.wall_s:.2f} s",
               f"{local.wall_s:.2f} s", f"{ours.wall_s / local.wall_s:.2f}x", "-", ok=None))
    for label, q in (("p50", 0.5), ("p99", 0.99)):
        if ours.tti and local.tti:
            mine, base = _pct(ours.tti, q), _pct(local.tti, q)
            print(_row(f"{count} environments at once: interactive {label}", _ms(mine),
                       _ms(base), f"{mine / base:.2f}x", "-", ok=None))
    print(_row(f"{count} environments at once: failures", str(len(ours.failures)),
               str(len(local.failures)), "-", "0", ok=not ours.failures))
    for failure in ours.failures[:5]:
        print(f"  {failure}")
    print(f"\n(baseline: inspect's `local` sandbox, a temporary directory and local "
          f"processes; {len(ours_tti)} samples a side, in rotating order)")
    print(f"published medians from create to the first command, sandbox services: "
          f"{PUBLISHED_BEST_S:g} s to {PUBLISHED_WORST_S:g} s (their own published figures)")


# ----------------------------------------------------------------------- main


async def measure(samples: int, warmup: int, count: int
                  ) -> tuple[dict[str, list[float]], Crowd, Crowd]:
    config = BashfleetSandboxConfig(host=HOST)
    ours = bashfleet_maker(config)
    # As an eval does: the task holds the fleet client its samples share.
    await BashfleetSandboxEnvironment.task_init("bench", config)
    try:
        print(f"time to interactive: {samples} samples a side", file=sys.stderr)
        times = await interactive_rows(ours, samples, warmup)
        print(f"{count} environments at once, each side", file=sys.stderr)
        local = await at_once(local_make, count)
        crowd = await at_once(ours, count)
    finally:
        await BashfleetSandboxEnvironment.task_cleanup("bench", config, True)
    return times, crowd, local


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer samples, for a smoke run")
    parser.add_argument("--samples", type=int, help="time-to-interactive samples a side")
    parser.add_argument("--at-once", type=int, help="environments at once (default 100)")
    parser.add_argument("--slots", type=int, default=8, help="the worker's command slots")
    args = parser.parse_args(argv)
    samples = args.samples or (10 if args.quick else 200)
    count = args.at_once or (20 if args.quick else 100)
    warmup = 2 if args.quick else 10
    root = Path(tempfile.mkdtemp(prefix="bashfleet-bench-environments-"))
    print("bashfleet environments benchmark (inspect-ai's sandbox API)")
    print(f"python {sys.version.split()[0]}, cpus {os.cpu_count()}, state {root}")
    with cleanup.hosts_ended(root, remove=True), RedisServer(root / "redis") as server:
        env = worker_env(server.url, root / "host")
        os.environ["BASHFLEET_REDIS_URL"] = server.url  # the adapter's fleet, as a user's
        worker = [sys.executable, "-m", "bashfleet.worker.fleet.supervisor", "--host", HOST,
                  "--concurrency", str(args.slots)]
        with _process(worker, env, root / "worker.log"):
            with Fleet(server.url) as fleet:
                _wait(lambda: any(h.host == HOST and h.alive and h.ready
                                  for h in fleet.hosts()), "the bashfleet worker")
            times, crowd, local = asyncio.run(measure(samples, warmup, count))
    print_table(times, crowd, local, count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
