"""Control plane benchmark: another owner's `check`, `write`, `kill` and `cancel` while
one owner runs 16 hostile file operations at once, against the same calls with no file
operation running (the baseline, measured in the same run, on the same worker).

The hostile operations, those that once stalled a host's control plane, are those a
tenant can aim at a host: reads, writes and downloads of FIFOs no writer ever opens,
reads of /dev/zero through a link, reads in a workspace whose tools hang (each runs into
the host's file deadline). Each repeats until the measurement ends. Starts its own Redis
server and one worker; prints a table; never fails on a miss.
    python -m bench.bench_control [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from bashfleet.client import BashfleetError, Fleet
from bashfleet.client.aio import AsyncFleet, AsyncWorkspace
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.wire.control import Collect
from bench import cleanup
from bench.bench_fleet import _pct, _process, _row, _wait, worker_env

HOST = "bench-ctl"
#: The host's file deadline here (what the hung-tool reads run into).
FILE_DEADLINE_S = 5.0
#: What a victim's control call must stay under at p99 while the attack runs.
TARGET_S = 1.0
SETUP = ("set -e; for n in 1 2 3 4 5 6 7 8; do mkfifo p$n; done; ln -s /dev/zero zero; "
         "printf '#!/bin/sh\\nexec sleep 3600\\n' > hang; chmod +x hang")
HANG = "cp hang /usr/local/bin/stat; echo x > file"


def hostile_ops(ws: AsyncWorkspace, hung: AsyncWorkspace, local: Path
                ) -> list[Callable[[], Awaitable[object]]]:
    """16 file operations that each would block a plain reader or writer for ever."""
    return [
        *[lambda n=n: ws.read_file(f"p{n}") for n in (1, 2, 3, 4)],
        *[lambda n=n: ws.write_file(f"p{n}", b"x") for n in (5, 6)],
        *[lambda n=n: ws.download_file(f"p{n}", local / f"p{n}") for n in (7, 8)],
        lambda: ws.upload_file(local / "small", "p1"),
        *[lambda: ws.read_file("zero") for _ in range(3)],
        lambda: ws.download_file("zero", local / "zero"),
        lambda: ws.download("/dev", local / "dev"),
        lambda: hung.read_file("file"),
        lambda: hung.write_file("new", b"x"),
    ]


@dataclass
class Attack:
    """One owner's hostile operations, each repeated until `stop`, on an event loop of
    their own (a thread)."""

    url: str
    local: Path
    stop: threading.Event = field(default_factory=threading.Event)
    ready: threading.Event = field(default_factory=threading.Event)
    done: list[float] = field(default_factory=list)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._main, daemon=True)

    def end(self) -> None:
        """Stop repeating; wait for the operations under way (each ends by its deadline)."""
        self.stop.set()
        self.thread.join(FILE_DEADLINE_S * 4)

    def start(self) -> None:
        self.thread.start()
        if not self.ready.wait(180) or self.error is not None:
            raise RuntimeError(f"the attack could not start: {self.error}")

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # said to the caller
            self.error = exc
            self.ready.set()

    async def _run(self) -> None:
        async with AsyncFleet(self.url, owner=f"hostile-{uuid.uuid4().hex[:6]}") as fleet:
            # `hung` replaces its own tools: its /usr/local/bin a mount of its directory's
            # bin/ (the host's is read-only to every workspace; an image's is its own).
            ws, hung = (await fleet.workspace(host=HOST),
                        await fleet.workspace(host=HOST, mounts={"/usr/local/bin": "bin"}))
            async with ws, hung:
                await ws.run(SETUP)
                await hung.run(SETUP + "; " + HANG)
                (self.local / "small").write_bytes(b"small")
                ops = hostile_ops(ws, hung, self.local)
                self.ready.set()
                await asyncio.gather(*(self._repeat(op) for op in ops))

    async def _repeat(self, op: Callable[[], Awaitable[object]]) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            # Refused, as it should be: what counts here is how long it took.
            with contextlib.suppress(BashfleetError):
                await op()
            self.done.append(time.monotonic() - started)


def victim(fleet: Fleet, runner: Fleet, counts: dict[str, int]) -> dict[str, list[float]]:
    """Seconds each of the victim's control calls took: `check` a job, `write` to an
    interactive one (no wait), `kill` a job, `cancel` a running foreground call."""
    sleeper = fleet.run("sleep 600", host=HOST, mode="background").job
    cat = fleet.run("cat", host=HOST, stdin="pipe", timeout=0.5).job
    assert sleeper is not None and cat is not None
    doomed = [fleet.run("sleep 600", host=HOST, mode="background").job
              for _ in range(counts["kill"])]
    took: dict[str, list[float]] = {kind: [] for kind in counts}
    for n in range(max(counts.values())):
        if n < counts["check"]:
            _timed(took["check"], lambda: fleet.check(sleeper.id))
        if n < counts["write"]:
            _timed(took["write"], lambda: fleet.write_stdin(cat.id, "x\n",
                                                             collect=Collect(wait_s=0)))
        if n < counts["kill"]:
            job = doomed[n]
            assert job is not None
            _timed(took["kill"], lambda: fleet.kill(job.id))  # noqa: B023 - called now
        if n < counts["cancel"]:
            call_id, thread = _running_call(runner)
            _timed(took["cancel"], lambda: fleet.cancel(call_id))  # noqa: B023
            thread.join(30)
    fleet.kill(sleeper.id)
    fleet.kill(cat.id)
    return took


def _timed(into: list[float], act: Callable[[], object]) -> None:
    started = time.perf_counter()
    act()
    into.append(time.perf_counter() - started)


def _running_call(runner: Fleet) -> tuple[str, threading.Thread]:
    call_id = uuid.uuid4().hex
    thread = threading.Thread(target=lambda: runner.run("sleep 60", host=HOST, call_id=call_id),
                              daemon=True)
    thread.start()
    _wait(lambda: runner.call_progress(call_id).state == "running", "a running call")
    return call_id, thread


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer calls, for a smoke run")
    args = parser.parse_args(argv)
    counts = ({"check": 40, "write": 20, "kill": 4, "cancel": 3} if args.quick
              else {"check": 300, "write": 150, "kill": 20, "cancel": 10})
    root = Path(tempfile.mkdtemp(prefix="bashfleet-bench-control-"))
    print("bashfleet control plane benchmark")
    print(f"python {sys.version.split()[0]}, cpus {os.cpu_count()}, state {root}")
    with cleanup.hosts_ended(root, remove=True), RedisServer(root / "redis") as server:
        env = worker_env(server.url, root / "host") | {
            "BASHFLEET_WORKSPACE_ROOT": str(root / "workspaces"),
            "BASHFLEET_FILE_OP_TIMEOUT_S": str(FILE_DEADLINE_S)}
        worker = [sys.executable, "-m", "bashfleet.worker.fleet.supervisor", "--host", HOST,
                  "--concurrency", "2", "--local-fallback"]
        with _process(worker, env, root / "worker.log"):
            owner = f"victim-{uuid.uuid4().hex[:6]}"
            with Fleet(server.url, owner=owner) as fleet, \
                    Fleet(server.url, owner=owner) as runner:
                _wait(lambda: any(h.host == HOST and h.alive and h.ready
                                  for h in fleet.hosts()), "the worker")
                victim(fleet, runner, {"check": 10, "write": 5, "kill": 1, "cancel": 1})  # warm
                quiet = victim(fleet, runner, counts)
                attack = Attack(server.url, root / "local")
                attack.local.mkdir()
                attack.start()
                _wait(lambda: len(attack.done) >= 16, "the hostile operations", 120)
                loaded = victim(fleet, runner, counts)
                attack.end()
    print()
    print(_row("row", "measured", "baseline", "ratio", "target", ok=None).replace("info", "status"))
    print("-" * 110)
    for kind in counts:
        ours, base = _pct(loaded[kind], 0.99), _pct(quiet[kind], 0.99)
        print(_row(f"`{kind}` p99, 16 hostile file ops", f"{ours * 1e3:.1f} ms",
                   f"{base * 1e3:.1f} ms", f"{ours / base:.2f}x", f"<= {TARGET_S * 1e3:.0f} ms",
                   ok=ours <= TARGET_S))
    hostile = attack.done
    print(_row("hostile file op answered, p50 (info)", f"{_pct(hostile, 0.5) * 1e3:.1f} ms",
               "-", "-", "-", ok=None))
    print(_row("hostile file op answered, max (info)", f"{max(hostile):.2f} s", "-", "-",
               f"<= {FILE_DEADLINE_S + 2:.0f} s", ok=None))
    print(f"\n(baseline: the same control calls of the same owner on the same worker with no "
          f"file operation running; {len(hostile)} hostile operations answered meanwhile; "
          f"the host's file deadline {FILE_DEADLINE_S:g} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
