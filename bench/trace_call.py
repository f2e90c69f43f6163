"""Where one `true` call's time goes, step by step, from the client to the client.

Starts its own Redis and one bashfleet worker whose processes time the functions a call
goes through (`bench/trace_hook/sitecustomize.py`, on their PYTHONPATH), runs `true`
calls one at a time through `Fleet.run`, and prints, for each step, the p50 time since
the step before and since the call began, with the load average: the machine this ran
on, as it was. The wrapping itself costs a few microseconds a mark. A reference row:
`subprocess.run(["bash", "-c", "true"])` in this process, same run.

    python -m bench.trace_call [--calls N] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bashfleet.client import Fleet
from bashfleet.client.redis_server import RedisServer
from bench import cleanup
from bench.bench_fleet import HOST, _process, _wait, worker_env

HOOK = Path(__file__).with_name("trace_hook")


def _client_marks(trace: Path) -> None:
    """Time the client's SEND script in this process too."""
    os.environ["BASHFLEET_TRACE_FILE"] = str(trace)
    spec = importlib.util.spec_from_file_location("bench_trace_hook", HOOK / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    from bashfleet.client._sync import records  # noqa: PLC0415 - after the hook's setup

    hook.timed(records, "send_call", "client: SEND script")


def _steps(trace: Path, calls: list[tuple[float, float]]) -> list[tuple[str, list[float],
                                                                         list[float]]]:
    """Per step, in the order first seen: the times since the previous mark, and since
    the call began (ms), over the calls that passed it."""
    marks: list[tuple[float, str]] = []
    for line in trace.read_text(encoding="utf-8").splitlines():
        text, _pid, name = line.split(" ", 2)
        marks.append((float(text), name))
    steps: dict[str, tuple[list[float], list[float]]] = {}
    for begin, end in calls:
        seq = [("client: run() called", begin)]
        seq += [(name, at) for at, name in marks if begin <= at <= end]
        seq.append(("client: run() returned", end))
        seq.sort(key=lambda item: item[1])
        previous, seen = begin, set()
        for step, stamp in seq:
            if step in seen:  # a step run twice in a call: its first time
                continue
            seen.add(step)
            since, total = steps.setdefault(step, ([], []))
            since.append((stamp - previous) * 1e3)
            total.append((stamp - begin) * 1e3)
            previous = stamp
    order = sorted(steps, key=lambda s: statistics.median(steps[s][1]))
    return [(step, *steps[step]) for step in order]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=50, help="calls traced")
    parser.add_argument("--quick", action="store_true", help="10 calls, for a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls = 10
    root = Path(tempfile.mkdtemp(prefix="bashfleet-bench-trace-"))
    trace = root / "trace.log"
    _client_marks(trace)
    load_before = os.getloadavg()
    calls: list[tuple[float, float]] = []
    with cleanup.hosts_ended(root), RedisServer(root / "redis") as server:
        env = worker_env(server.url, root / "host") | {
            "BASHFLEET_TRACE_FILE": str(trace),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HOOK),
                                                        os.environ.get("PYTHONPATH")])),
        }
        worker = [sys.executable, "-m", "bashfleet.worker.fleet.supervisor", "--host", HOST,
                  "--concurrency", "4"]
        with _process(worker, env, root / "worker.log"):
            fleet = Fleet(server.url)
            _wait(lambda: any(h.host == HOST and h.alive and h.ready for h in fleet.hosts()),
                  "the bashfleet worker")
            for _ in range(10):
                fleet.run("true", host=HOST)
            trace.write_text("", encoding="utf-8")
            bare = []
            for _ in range(args.calls):
                # Apart (the marks of the worker's background work between calls are
                # outside every call's window), without a sleep: a bash of reference.
                start = time.perf_counter()
                subprocess.run(["bash", "-c", "true"], check=True)
                bare.append((time.perf_counter() - start) * 1e3)
                begin = time.time()
                fleet.run("true", host=HOST)
                calls.append((begin, time.time()))
    load_after = os.getloadavg()
    print(f"one `true` call, step by step: {args.calls} calls, p50 ms; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after (cpus {os.cpu_count()})")
    print(f"{'row: step (> entered, < returned)':<44} {'since previous':>15} "
          f"{'since run()':>12} {'calls':>6}")
    for step, since, total in _steps(trace, calls):
        print(f"{step:<44} {statistics.median(since):15.3f} {statistics.median(total):12.3f} "
              f"{len(since):6d}")
    whole = statistics.median((end - begin) * 1e3 for begin, end in calls)
    print(f"{'end to end':<44} {'':>15} {whole:12.3f}")
    print(f"{'reference: subprocess.run bash -c true':<44} {'':>15} "
          f"{statistics.median(bare):12.3f}")
    shutil.rmtree(root, ignore_errors=True)  # a run that failed keeps it: its logs
    return 0


if __name__ == "__main__":
    sys.exit(main())
