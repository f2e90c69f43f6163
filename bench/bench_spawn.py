"""What starting a call's process costs the keeper: the spawner (`isolate/spawn.c`)
starting `true`, with no system call filter, with one of a single instruction and with
the workspaces' default one, against `subprocess.Popen` of the same program, rounds
alternating, in this process.

Each row is the time from the start to the moment the program runs (posix_spawn until
the report pipe closes at its exec: what a keeper waits for before it answers `P`), and
the CPU the started processes spent, per start. The filter's rows show what installing
it costs: its size barely counts, its install does. The last row is a ready spawner
(`--ready`, what a throwaway workspace's keeper starts before its next call comes,
filter installed): from the call handed to it to its exec; the CPU is all of it.

    python -m bench.bench_spawn [--starts N] [--rounds N]

Not a test: it never fails. The table goes to stdout.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bashfleet.worker.engine import holder
from bashfleet.worker.engine.isolate import kernel, syscall_filter
from bashfleet.worker.settings import Settings

PROGRAM = "/usr/bin/true"
#: One instruction: SECCOMP_RET_ALLOW (struct sock_filter: code, jt, jf, k).
ALLOW_ALL = struct.pack("HBBI", 0x06, 0, 0, 0x7FFF0000)
#: Between a ready spawner's start and its call, in its row: a call's answer and the
#: next call's request take longer than this through the fleet.
READY_GAP_S = 0.002


def _memfd(data: bytes, name: str) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    return fd


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


Start = Callable[[], Callable[[], object]]
"""Starts the program; what it returns waits for its end."""


def _measure(start: Start, starts: int) -> tuple[list[float], float]:
    """Each start's time to the program's exec (ms), and the started processes' CPU
    per start (ms)."""
    times = []
    before = _children_cpu()
    for _ in range(starts):
        began = time.perf_counter()
        wait = start()
        times.append((time.perf_counter() - began) * 1e3)
        wait()
    return times, (_children_cpu() - before) / starts * 1e3


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=200, help="starts per row per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bashfleet-bench-spawn-") as state:
        path = holder.spawner(Settings(state_dir=Path(state)))
        if path is None:
            print("no spawner on this host (no C compiler and none prebuilt)")
            return
        spawner = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        default = syscall_filter.for_mode("default", platform.machine()) or ALLOW_ALL
        filters = {"no filter": -1, "a 1-instruction filter": _memfd(ALLOW_ALL, "one"),
                   f"the default filter ({len(default) // 8})": _memfd(default, "default")}
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        nobody = kernel.Identity(-1, -1, (), -1)  # as the keeper: no ids to take

        def through_spawner(filter_fd: int) -> Start:
            def start() -> Callable[[], object]:
                pid = kernel.spawn_through(spawner, PROGRAM, ["true"], {}, [null] * 3,
                                           [0, 1, 2], cwd="/", who=nobody,
                                           filter_fd=filter_fd)
                assert pid is not None
                return lambda: os.waitpid(pid, 0)
            return start

        def through_ready(filter_fd: int) -> Start:
            waiting = [kernel.ready_spawn(spawner, nobody, filter_fd)]

            def start() -> Callable[[], object]:
                pid = kernel.start_ready(waiting[0], PROGRAM, ["true"], {}, [null] * 3,
                                         [0, 1, 2], cwd="/")
                assert pid is not None

                def wait() -> None:  # and the next start's spawner made ready, untimed
                    os.waitpid(pid, 0)
                    waiting[0] = kernel.ready_spawn(spawner, nobody, filter_fd)
                    # As a keeper's: ready by the time its call comes (a call's answer
                    # and the next call's request are milliseconds).
                    time.sleep(READY_GAP_S)
                return wait
            return start

        def popen() -> Callable[[], object]:
            return subprocess.Popen([PROGRAM], stdin=null, stdout=null, stderr=null).wait

        rows: dict[str, Start] = {"subprocess.Popen (baseline)": popen}
        rows |= {f"spawner, {name}": through_spawner(fd) for name, fd in filters.items()}
        ready = through_ready(filters[f"the default filter ({len(default) // 8})"])
        rows["ready spawner, the default filter"] = ready
        times: dict[str, list[float]] = {name: [] for name in rows}
        cpu: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(args.rounds):
            for name, start in rows.items():
                took, spent = _measure(start, args.starts)
                times[name] += took
                cpu[name].append(spent)
        ready()()  # the last one made ready, used and ended
        for fd in (spawner, null, *filters.values()):
            if fd >= 0:
                os.close(fd)

    base = statistics.median(times["subprocess.Popen (baseline)"])
    print(f"bashfleet spawn benchmark: {args.rounds} rounds x {args.starts} starts of "
          f"{PROGRAM}, load {os.getloadavg()[0]:.2f}")
    print(f"{'row':42} {'to exec p50':>12} {'p90':>9} {'vs Popen':>9} {'CPU/start':>10}")
    for name in rows:
        ordered = sorted(times[name])
        p50, p90 = statistics.median(ordered), ordered[int(0.9 * (len(ordered) - 1))]
        print(f"{name:42} {p50:9.3f} ms {p90:6.3f} ms {p50 - base:+6.3f} ms "
              f"{statistics.median(cpu[name]):7.3f} ms")


if __name__ == "__main__":
    main()
