"""Placement benchmark: where new workspaces go on a fleet of idle hosts, and what a
host's workspaces leave running when its worker is killed again and again.

    python -m bench.bench_placement [--quick] [--rounds N] [--kills N]

Starts its own Redis server and worker processes (each a host of its own, as separate
machines would run them) and prints a table. Never fails on a miss: it reports.

1. 32 workspaces made at once (one `AsyncFleet`, `asyncio.gather`) on 4 idle hosts:
   how many each host got. Baselines from the same run: the rule placement used
   before (most free command slots, then the name: computed from the same host
   records), and a uniform random pick over the same hosts (1000 simulated rounds).
   Target: max - min <= 1. The same with a label two of the four hosts carry (16
   workspaces).
2. One host whose worker (its supervisor and consumers: the whole process group, as
   an OOM kill or a crash would end it) is SIGKILLed 20 times while calls run in
   throwaway workspaces and in leased ones, restarted after each kill. Then every
   leased workspace is deleted and the worker stopped cleanly: the keepers of the
   host's state directory still running, against those running before the first kill.
   Target: 0 left.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path

import psutil

from bashfleet.client import AsyncFleet, BashfleetError, Fleet, UnknownWorkspace, Workspace
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.engine import teardown, workspaces
from bashfleet.worker.engine.workspaces import usage
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import HostInfo
from bench import cleanup
from bench.bench_containers import Row, _ok, _print, _say
from bench.bench_fleet import _process, _wait, worker_env

HOSTS = ("p1", "p2", "p3", "p4")
#: The label two of the four hosts carry.
LABEL = "pair"
LABELLED = ("p3", "p4")
SPREAD_COUNT = 32
LABEL_COUNT = 16
SPREAD_TARGET = 1
#: Rounds of the random pick simulated for its baseline.
RANDOM_ROUNDS = 1000

VICTIM = "victim"
VICTIM_SLOTS = 4
#: Lease of the workspaces made on the victim: longer than the run, so that one the
#: benchmark failed to delete is still there (and counted) at the end.
LEASE_S = 900.0
#: How long the keepers get to go once the worker stopped before they are counted.
GRACE_S = 10.0
#: What every call of the load runs: long enough for a kill to find calls in flight.
CALL = "sleep 0.5"

#: Notes printed under the table.
_notes: list[str] = []


def _worker_args(host: str, slots: int, labels: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "bashfleet.worker.fleet.supervisor", "--host", host,
            "--concurrency", str(slots), *(arg for label in labels for arg in ("--label", label))]


def _env(url: str, root: Path, host: str) -> dict[str, str]:
    """A host's worker environment; its workspaces' directories under the run's root too
    (a root worker's default is /var/lib/bashfleet/workspaces)."""
    return worker_env(url, root / "hosts" / host) | {
        "BASHFLEET_WORKSPACE_ROOT": str(root / "ws" / host)}


def _ready(fleet: Fleet, hosts: Sequence[str], pid: int | None = None) -> bool:
    """Whether every one of `hosts` is alive and takes calls (`pid`: its supervisor's)."""
    infos = {info.host: info for info in fleet.hosts()}
    return all(h in infos and infos[h].alive and infos[h].ready
               and (pid is None or infos[h].pid == pid) for h in hosts)


# ------------------------------------------------------------------------- spread


def old_rule(infos: Sequence[HostInfo], label: str | None) -> str:
    """Where placement put a workspace before it counted the owner's workspaces: the
    live host (of `label`) with the most free command slots, ties to the greatest
    name. An idle workspace takes no slot, so on an idle fleet every one goes to the
    same host."""
    alive = [i for i in infos if i.alive and (label is None or label in i.labels)]
    return max(alive, key=lambda i: (i.slots - i.busy - i.queued, i.host)).host


def random_spread(hosts: Sequence[str], count: int, rounds: int = RANDOM_ROUNDS) -> float:
    """Mean max - min of `count` workspaces each put on one of `hosts` at random."""
    rng = random.Random(20261127)  # the same baseline every run
    spreads = []
    for _ in range(rounds):
        counts = Counter(rng.choice(hosts) for _ in range(count))
        spreads.append(max(counts[h] for h in hosts) - min(counts[h] for h in hosts))
    return statistics.mean(spreads)


async def _made_at_once(url: str, owner: str, count: int, label: str | None
                        ) -> tuple[list[str], list[str]]:
    """`count` workspaces made at once by one client, then deleted: their hosts, and
    the errors of those that failed."""
    async with AsyncFleet(url, owner=owner) as fleet:
        made = await asyncio.gather(*(fleet.workspace(label=label) for _ in range(count)),
                                    return_exceptions=True)
        good = [ws for ws in made if not isinstance(ws, BaseException)]
        errors = [f"{type(e).__name__}: {e}" for e in made if isinstance(e, BaseException)]
        placed = [ws.host for ws in good]
        await asyncio.gather(*(ws.delete() for ws in good), return_exceptions=True)
    return placed, errors


def _counts(placed: Sequence[str], hosts: Sequence[str]) -> tuple[str, int]:
    counts = Counter(placed)
    spread = max(counts[h] for h in hosts) - min(counts[h] for h in hosts)
    return "/".join(str(counts[h]) for h in hosts), spread


def _spread_row(name: str, url: str, fleet: Fleet, hosts: Sequence[str], *, count: int,
                label: str | None, rounds: int) -> Row:
    infos = fleet.hosts()
    old = old_rule(infos, label)
    old_counts, old_spread = _counts([old] * count, hosts)
    chance = random_spread(hosts, count)
    shown: list[str] = []
    worst = -1
    worst_counts = ""
    failed: list[str] = []
    for index in range(rounds):
        placed, errors = asyncio.run(_made_at_once(url, f"bench:spread-{label or 'all'}-{index}",
                                                   count, label))
        failed += errors
        stray = [h for h in placed if h not in hosts]
        if stray:
            failed.append(f"{len(stray)} on hosts outside the label: {sorted(set(stray))}")
        counts, spread = _counts(placed, hosts)
        shown.append(f"{counts} ({spread})")
        if spread > worst:
            worst, worst_counts = spread, counts
    _notes.append(f"{name}: per round, hosts {'/'.join(hosts)}: {', '.join(shown)}"
                  + (f"; {len(failed)} FAILED: {failed[0]}" if failed else ""))
    return (name, f"{worst_counts} (max-min {worst}, worst of {rounds})",
            f"old rule {old_counts} ({old_spread}); random mean max-min {chance:.1f}",
            f"max-min <= {SPREAD_TARGET}", _ok(worst <= SPREAD_TARGET and not failed))


def spread_rows(url: str, root: Path, rounds: int) -> list[Row]:
    """Row 1: workspaces made at once on 4 idle hosts, and on a label's 2."""
    rows: list[Row] = []
    with ExitStack() as stack, Fleet(url, owner="bench:spread") as fleet:
        for host in HOSTS:
            (root / "hosts" / host).mkdir(parents=True, exist_ok=True)
            labels = (LABEL,) if host in LABELLED else ()
            stack.enter_context(_process(_worker_args(host, 2, labels), _env(url, root, host),
                                         root / f"{host}.log"))
        _wait(lambda: _ready(fleet, HOSTS), f"hosts {', '.join(HOSTS)}", timeout=180)
        _say(f"{SPREAD_COUNT} workspaces at once on {len(HOSTS)} hosts, {rounds} round(s)")
        rows.append(_spread_row(f"{SPREAD_COUNT} workspaces on {len(HOSTS)} hosts: spread",
                                url, fleet, HOSTS, count=SPREAD_COUNT, label=None,
                                rounds=rounds))
        _say(f"{LABEL_COUNT} workspaces at once on label {LABEL!r}, {rounds} round(s)")
        rows.append(_spread_row(
            f"{LABEL_COUNT} workspaces on a label of 2 of the 4 hosts: spread", url, fleet,
            LABELLED, count=LABEL_COUNT, label=LABEL, rounds=rounds))
    return rows


# -------------------------------------------------------------------------- kills


class Victim:
    """The worker of one host, which this benchmark kills and starts again: a session
    of its own, so its process group is the supervisor and its consumers."""

    def __init__(self, url: str, root: Path) -> None:
        self.env = _env(url, root, VICTIM)
        self.log = root / f"{VICTIM}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        (root / "hosts" / VICTIM).mkdir(parents=True, exist_ok=True)

    def start(self) -> int:
        with open(self.log, "ab") as handle:
            self.proc = subprocess.Popen(_worker_args(VICTIM, VICTIM_SLOTS), env=self.env,
                                         stdout=handle, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL to its whole process group: nothing of it gets to clean up."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def stop(self) -> int | None:
        """SIGTERM, as a clean stop; its exit status (None: it had to be killed)."""
        if self.proc is None:
            return 0
        proc, self.proc = self.proc, None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None


class Load:
    """Calls kept running on the victim from threads of their own until `stop`: `CALL`
    in throwaway workspaces (no workspace named), `CALL` in two leased workspaces, and
    a leased workspace made, used and deleted over and over (so that kills also land
    while one is being made or deleted). Failures are counted, not raised: a call the
    kill ended fails by design."""

    def __init__(self, url: str, owner: str, leased: list[str]) -> None:
        self.url = url
        self.owner = owner
        self.done = threading.Event()
        self.outcomes: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._throwaway, daemon=True)
                        for _ in range(2)]
        self.threads += [threading.Thread(target=self._leased, args=(ws_id,), daemon=True)
                         for ws_id in leased]
        self.threads.append(threading.Thread(target=self._churn, daemon=True))

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.done.set()
        for thread in self.threads:
            thread.join(120)

    def _count(self, what: str) -> None:
        with self._lock:
            self.outcomes[what] += 1

    def _failed(self, kind: str, exc: BaseException) -> None:
        self._count(f"{kind} {type(exc).__name__}")
        self.done.wait(0.1)  # the host is down: do not spin

    def _ran(self, kind: str, exit_code: int | None) -> None:
        self._count(f"{kind} ok" if exit_code == 0 else f"{kind} exit {exit_code}")

    def _throwaway(self) -> None:
        with Fleet(self.url, owner=self.owner) as fleet:
            while not self.done.is_set():
                try:
                    self._ran("throwaway", fleet.run(CALL, host=VICTIM, timeout=60,
                                                     check=False).exit_code)
                except BashfleetError as exc:
                    self._failed("throwaway", exc)

    def _leased(self, ws_id: str) -> None:
        with Fleet(self.url, owner=self.owner) as fleet:
            ws: Workspace | None = None
            while not self.done.is_set():
                try:
                    if ws is None:
                        ws = fleet.open_workspace(ws_id)
                    self._ran("leased", ws.run(CALL, timeout=60, check=False).exit_code)
                except UnknownWorkspace as exc:
                    # Gone: counted, and a new one takes its place.
                    self._failed("leased", exc)
                    with contextlib.suppress(BashfleetError):
                        ws_id = fleet.workspace(host=VICTIM, ttl_s=LEASE_S).id
                        ws = None
                except BashfleetError as exc:
                    self._failed("leased", exc)

    def _churn(self) -> None:
        with Fleet(self.url, owner=self.owner) as fleet:
            while not self.done.is_set():
                try:
                    ws = fleet.workspace(host=VICTIM, ttl_s=LEASE_S)
                    try:
                        ws.run("true", timeout=60, check=False)
                    finally:
                        ws.delete()
                    self._count("churn made, used, deleted")
                except BashfleetError as exc:
                    self._failed("churn", exc)


def _keepers(settings: Settings) -> list[int]:
    """Keepers (and zygotes) of the victim's state directory, as a host's teardown
    finds them: a socket bound there, or mounts from there."""
    return teardown.keepers_under(settings.workspaces_dir)


def _rss(pids: Sequence[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_info().rss
    return total


def _records(settings: Settings) -> str:
    """The workspace records on the victim's disk, by kind and whether their keeper
    lives."""
    kinds = Counter(
        f"{'throwaway' if record.throwaway else 'leased'}, keeper "
        f"{'alive' if usage.keeper_alive(record) else 'gone'}"
        for record in workspaces.local_records(settings))
    return ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "none"


def _busy(fleet: Fleet) -> int:
    return sum(info.busy for info in fleet.hosts() if info.host == VICTIM and info.alive)


def _restart(victim: Victim, fleet: Fleet) -> None:
    """Start the victim's worker and wait until it takes calls (its own record: the
    killed one's heartbeat may still look fresh)."""
    pid = victim.start()
    _wait(lambda: _ready(fleet, [VICTIM], pid), "the victim's worker", timeout=180)


def kill_rows(url: str, root: Path, kills: int) -> list[Row]:
    """Row 2: keepers left after `kills` SIGKILLs of the victim's worker under load."""
    owner = "bench:kills"
    victim = Victim(url, root)
    settings = Settings(state_dir=root / "hosts" / VICTIM)
    restarts: list[float] = []
    idle_at_kill = 0
    with ExitStack() as stack:
        stack.callback(victim.stop)  # whatever happens below
        fleet = stack.enter_context(Fleet(url, owner=owner))
        _restart(victim, fleet)
        leased = [fleet.workspace(host=VICTIM, ttl_s=LEASE_S).id for _ in range(2)]
        load = stack.enter_context(Load(url, owner, leased))
        time.sleep(2.0)  # the load under way, the pools warm
        before = _keepers(settings)
        _say(f"{len(before)} keepers before the first kill; {kills} kills")
        for index in range(kills):
            with contextlib.suppress(RuntimeError):
                _wait(lambda: _busy(fleet) > 0, "a call in flight", timeout=5)
            if _busy(fleet) == 0:
                idle_at_kill += 1
            started = time.perf_counter()
            victim.kill()
            _restart(victim, fleet)
            restarts.append(time.perf_counter() - started)
            _say(f"  kill {index + 1}: up again in {restarts[-1]:.1f} s, "
                 f"{len(_keepers(settings))} keepers")
            time.sleep(0.5)  # calls under way again before the next kill
        serving = _keepers(settings)
        load.stop()
        # Every workspace of this owner deleted through the fleet, as its users would.
        views = fleet.workspaces()
        undeleted = 0
        for view in views:
            try:
                fleet.open_workspace(view.id).delete()
            except BashfleetError:
                undeleted += 1
        records_left = _records(settings)
        status = victim.stop()
        waited = time.perf_counter()
        left = _keepers(settings)
        while left and time.perf_counter() - waited < GRACE_S:
            time.sleep(0.2)
            left = _keepers(settings)
        waited = time.perf_counter() - waited
        rss = _rss(left)
        records_stopped = _records(settings)
        # Wider: any keeper of any host of this run (the spread hosts' stopped before).
        anywhere = teardown.keepers_under(root)
    outcomes = ", ".join(f"{what}: {n}" for what, n in sorted(load.outcomes.items()))
    _notes.append(f"kills: the load's outcomes: {outcomes}")
    _notes.append(f"kills: restart after a kill (kill to ready) median "
                  f"{statistics.median(restarts):.1f} s, max {max(restarts):.1f} s; "
                  f"{idle_at_kill} of {kills} kills found no call in flight; "
                  f"{len(views)} workspaces of the owner deleted at the end "
                  f"({undeleted} refused); workspace records on its disk then: "
                  f"{records_left}; once the worker stopped (exit status {status}): "
                  f"{records_stopped}; keepers of any host under the run's directory: "
                  f"{len(anywhere)}")
    return [
        (f"keepers left after {kills} worker SIGKILLs under load",
         f"{len(left)} ({rss / 2**20:.1f} MiB RSS)" + (f" after {waited:.1f} s" if left
                                                      else ""),
         f"{len(before)} before the first kill", "0", _ok(not left)),
        (f"  keepers while serving, after {kills} kills (info)", str(len(serving)),
         f"{len(before)} before the first kill", "informational", "-"),
    ]


# --------------------------------------------------------------------------- main


@contextlib.contextmanager
def _root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="bashfleet-bench-placement-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.bench_placement", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and kills")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of workspaces made at once (default 5; --quick 1)")
    parser.add_argument("--kills", type=int, default=None,
                        help="SIGKILLs of the victim's worker (default 20; --quick 3)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 5)
    kills = args.kills or (3 if args.quick else 20)
    started = time.perf_counter()
    rows: list[Row] = []
    with _root() as root:
        print("bashfleet placement benchmark", flush=True)
        print(f"python {sys.version.split()[0]}, cpus {os.cpu_count()}, "
              f"memory {psutil.virtual_memory().total / 2**30:.0f} GiB, state {root}",
              flush=True)
        # Leaving these blocks, in this order: the workers stop (each step's own), Redis
        # stops, then every workspace and keeper of the run's state directories ends.
        with cleanup.hosts_ended(root), RedisServer(root / "redis") as server:
            rows += spread_rows(server.url, root, rounds)
            _say(f"{kills} SIGKILLs of a worker under load")
            rows += kill_rows(server.url, root, kills)
    print()
    _print(rows)
    print()
    for note in _notes:
        print(note)
    print(f"\n(total {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
