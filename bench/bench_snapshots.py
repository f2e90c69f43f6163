"""Snapshots benchmark: snapshots and forks of a workspace against baselines measured in
the same run.

    python -m bench.bench_snapshots [--quick] [--dir D] [--count N] [--no-fleet | --fleet-only]
                                    [--layer-image GB]

1. A snapshot of a workspace holding 50 MB of its own changes (`snapshots.take`), while
   a loop runs in it: p50 and p99, and how long its processes were paused; baseline:
   one `cp -a` of the same layers (the bytes alone, nothing paused, no ids shifted).
   Targets: <= 150 ms, paused <= 100 ms.
2. A fork (n=1) on the same host ready for its first call (`workspaces.create` from the
   snapshot); baseline: a fresh host-root workspace. Target: <= 30 ms p50.
3. Sixteen forks at once (one `fork` request's work: their blanks asked for, a snapshot,
   then 16 workspaces). Target: <= 200 ms for all 16.
4. The disk of 16 forks that each change 1 MB: the snapshot once + 16 MB.
5. A workspace from the snapshot on another host (a second state directory), cold: its
   layer pulled from the tests' registry on 127.0.0.1 and the workspace made, as a worker
   that is up does it (its blank keeper made beside the pull); baseline: the registry
   pull of the same layer alone. Target: <= pull + 30 ms.

As the client sees them (a Redis server and one worker started here, `Fleet` in this
process; `--no-fleet` leaves them out, `--fleet-only` measures only them), from a
workspace holding an agent's working tree (200 files of 4 KiB), in interleaved rounds,
each started once the host settled (the last round's deletes and blanks done):

6. `ws.fork(1)` returned, its snapshot taken by the same request; baseline: a fresh
   workspace (`fleet.workspace()`, the same host root). Target: <= 30 ms p50. The source
   does not change between the rounds: from the second on, a fork stands on the last
   fork's snapshot, renewed (`fork_reuse`). Then, in as many rounds of their own, a file
   of the source is changed before each `fork(1)`: its snapshot is a copy again.
7. `ws.fork(16)` returned, all ready; baseline: one control round trip (`ws.renew()`).
   Target: <= 200 ms p50.
8. `fork.delete()` of a workspace made by a fork; baselines: the delete of a fresh
   workspace, and one control round trip. Target: <= 20 ms p50.

`--layer-image GB`: every host (the engine's two, the fleet's worker) keeps its layers
and snapshots on an XFS image of that size (`layer_image_gb`: a snapshot clones extents),
unmounted at the end.

Not a test: it never fails on a miss. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

from bashfleet.worker import Call, run_call
from bashfleet.worker.engine import sandbox, workspaces
from bashfleet.worker.engine.snapshots import layer_fs, snapshot_store, snapshots
from bashfleet.worker.fleet import snapshot_calls
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import WorkspaceSpec
from bench import cleanup
from bench.bench_containers import Row, _du, _ms, _ok, _pct, _print, _say

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
# The tests' registry: the one way to serve a registry on this machine.
from integration.registry import running_registry

SNAPSHOT_TARGET_S = 0.150
PAUSE_TARGET_MS = 100.0
FORK_TARGET_S = 0.030
FORK16_TARGET_S = 0.200
DELETE_TARGET_S = 0.020
MIB = 1 << 20



def _run(settings: Settings, ws_id: str, command: str) -> str:
    result = run_call(Call(call_id=f"b{uuid.uuid4().hex[:15]}", command=command,
                           workspace=ws_id, timeout_s=120), settings=settings)
    if result.exit_code != 0:
        raise RuntimeError(f"{command!r} failed: {result!r}")
    return result.stdout


#: 50 MB of a workspace's own changes: a repository's worth of files of mixed sizes
#: (400 of 64 KiB, 100 of 256 KiB: 50 MiB) in its directory and its own `/` (/pkg).
FILL = ("set -e; mkdir -p repo /pkg; "
        "head -c 26214400 /dev/urandom > /tmp/blob; "
        "i=0; while [ $i -lt 400 ]; do dd if=/tmp/blob of=repo/f$i bs=64k count=1 "
        "skip=$i status=none; i=$((i+1)); done; "
        "i=0; while [ $i -lt 100 ]; do dd if=/tmp/blob of=/pkg/g$i bs=256k count=1 "
        "skip=$((i % 90)) status=none; i=$((i+1)); done; rm /tmp/blob")


def snapshot_rows(settings: Settings, count: int, base: Path) -> tuple[list[Row], str]:
    """Row 1; the source workspace and its last snapshot stay for the fork rows."""
    source = workspaces.create(WorkspaceSpec(), settings)
    _run(settings, source.id, FILL)
    run_call(Call(call_id=f"b{uuid.uuid4().hex[:15]}", workspace=source.id, background=True,
                  command="while :; do date +%s%N > /tmp/beat; sleep 0.01; done"),
             settings=settings)
    taken: list[float] = []
    paused: list[float] = []
    copies: list[float] = []
    last = ""
    for index in range(count):
        if index % 2:
            # The baseline: the same layers copied by one `cp -a`, nothing paused, no ids.
            target = base / f"copy{index}"
            target.mkdir()
            layers = [str(src) for src, _ in snapshots.own_dirs(source, settings)]
            started = time.perf_counter()
            subprocess.run(["cp", "-a", "--reflink=auto", "--", *layers, str(target)],
                           check=True)
            copies.append(time.perf_counter() - started)
            shutil.rmtree(target)
            continue
        started = time.perf_counter()
        record, pause = snapshots.take(source, settings, ttl_s=3600)
        taken.append(time.perf_counter() - started)
        paused.append(pause or 0.0)
        if last:
            snapshots.remove(last, settings)
        last = record.id
    size = snapshot_store.load(last, settings).bytes
    pause_p99 = _pct(paused, 0.99)
    rows = [
        (f"snapshot of {size / MIB:.0f} MiB of own changes", _ms(taken),
         _ms(copies) + " cp -a of its layers", f"<= {SNAPSHOT_TARGET_S * 1e3:.0f} ms p50",
         _ok(statistics.median(taken) <= SNAPSHOT_TARGET_S)),
        ("snapshot: its source paused", f"{statistics.median(paused):.1f} ms (p99 "
         f"{pause_p99:.1f})", "-", f"<= {PAUSE_TARGET_MS:.0f} ms",
         _ok(pause_p99 <= PAUSE_TARGET_MS)),
    ]
    _hold["source"] = source.id
    return rows, last


_hold: dict[str, str] = {}
_others: list[Settings] = []


def fork_rows(settings: Settings, snap_id: str, count: int) -> list[Row]:
    """Rows 2, 3 and 4."""
    forks: list[float] = []
    fresh: list[float] = []
    for index in range(count * 2):
        spec = WorkspaceSpec(snapshot=snap_id) if index % 2 == 0 else WorkspaceSpec()
        started = time.perf_counter()
        record = workspaces.create(spec, settings)
        (forks if index % 2 == 0 else fresh).append(time.perf_counter() - started)
        workspaces.delete(record.id, settings)
    source = workspaces.load(_hold["source"], settings)
    started = time.perf_counter()
    # As a `fork` request makes them (`bashfleet.worker.fleet.snapshot_calls.fork`): their
    # blank keepers asked for before the snapshot (made while it is taken), then the
    # workspaces a few at once.
    workspaces.make_ahead(source, settings, 16)
    snap, _ = snapshots.take(source, settings, hidden=True)
    took = time.perf_counter() - started
    with ThreadPoolExecutor(snapshot_calls.FORK_THREADS) as pool:
        sixteen = list(pool.map(lambda _: workspaces.create(
            WorkspaceSpec(snapshot=snap.id), settings), range(16)))
    all16 = time.perf_counter() - started - took
    try:
        for fork in sixteen:
            _run(settings, fork.id, "head -c 1048576 /dev/urandom > repo/mine")
        own = sum(workspaces.disk_bytes(fork, settings) for fork in sixteen)
        snap_bytes = _du(snapshot_store.layer_path(settings, snap.id))
    finally:
        for fork in sixteen:
            workspaces.delete(fork.id, settings)
    return [
        ("fork (n=1) ready for its first call", _ms(forks), _ms(fresh) + " fresh workspace",
         f"<= {FORK_TARGET_S * 1e3:.0f} ms p50", _ok(statistics.median(forks) <= FORK_TARGET_S)),
        ("fork n=16 from a snapshot, all ready", f"{all16 * 1e3:.0f} ms",
         f"{(took + all16) * 1e3:.0f} ms with its snapshot taken first",
         f"<= {FORK16_TARGET_S * 1e3:.0f} ms", _ok(all16 <= FORK16_TARGET_S)),
        ("16 forks that each change 1 MiB: disk", f"{own / MIB:.1f} MiB their own",
         f"{snap_bytes / MIB:.0f} MiB the snapshot, once", "snapshot once + 16 MiB",
         _ok(own <= 20 * MIB)),
    ]


def across_row(settings: Settings, other: Settings, snap_id: str, count: int) -> Row:
    """Row 5: a workspace from the snapshot on another host, cold (its layer pulled from
    the registry and the workspace made there), against the registry pull alone."""
    from bashfleet.worker.engine.snapshots import snapshot_registry  # noqa: PLC0415 - only this row needs it

    record = snapshot_store.load(snap_id, settings)
    ref = snapshot_registry.snapshot_ref(settings, snap_id)
    assert ref is not None
    digest = snapshot_registry.push(snapshot_store.layer_path(settings, snap_id), ref, settings)
    pinned = f"{ref.rsplit(':', 1)[0]}@{digest}"
    # The other host is a worker that is up: what its start does (the holder found or
    # built, the sandbox probed) is done before any round, as a worker does it at start.
    sandbox.startup_problems(other)
    cold: list[float] = []
    pulls: list[float] = []
    for index in range(max(3, count) * 2):
        layer = snapshot_store.layer_path(other, snap_id)
        shutil.rmtree(layer.parent, ignore_errors=True)
        snapshot_store.record_path(other, snap_id).unlink(missing_ok=True)
        layer.parent.mkdir(parents=True)
        started = time.perf_counter()
        if not index % 2:
            # As the fleet's fetch does (`snapshot_calls._run_move`): the blank keeper
            # of the workspace asked for is made beside the pull, not after it.
            workspaces.make_ahead(record, other, 1)
        snapshot_registry.pull(pinned, layer, other)
        if index % 2:
            pulls.append(time.perf_counter() - started)
            continue
        snapshot_store.save(record.model_copy(update={"pushed": pinned}), other)
        made = workspaces.create(WorkspaceSpec(snapshot=snap_id), other)
        cold.append(time.perf_counter() - started)
        workspaces.delete(made.id, other)
    extra = statistics.median(cold) - statistics.median(pulls)
    return ("workspace from a snapshot on another host, cold", _ms(cold),
            _ms(pulls) + " registry pull alone", "<= pull + 30 ms",
            _ok(extra <= FORK_TARGET_S))


#: The fleet rows' source: an agent's working tree, 200 files of 4 KiB in 4 folders.
TREE = ("set -e; for d in 0 1 2 3; do mkdir -p repo/d$d; i=0; while [ $i -lt 50 ]; do "
        "head -c 4096 /dev/urandom > repo/d$d/f$i; i=$((i+1)); done; done")


def fleet_rows(base: Path, count: int, layer_image_gb: int | None = None) -> list[Row]:
    """Rows 6, 7 and 8: forks and deletes as `Fleet` returns them, through a Redis server
    and a worker started here; each against its baseline, in alternating rounds. With
    `layer_image_gb`, the worker keeps its layers on an XFS image (`layer_fs`), released
    once it stopped."""
    from bashfleet.client import Fleet  # noqa: PLC0415 - only these rows need the client
    from bashfleet.client.redis_server import RedisServer  # noqa: PLC0415 - likewise
    from bench.bench_fleet import HOST, _process, _wait, worker_env  # noqa: PLC0415 - likewise

    root = base / "fleet"
    times: dict[str, list[float]] = {name: [] for name in (
        "fork1", "fresh", "fork16", "ctl", "delete_fork", "delete_fresh", "fork1_changed")}
    with cleanup.hosts_ended(root), RedisServer(root / "redis") as server:
        worker = [sys.executable, "-m", "bashfleet.worker.fleet.supervisor", "--host", HOST,
                  "--concurrency", "2"]
        env = worker_env(server.url, root / "host")
        if layer_image_gb is not None:
            env["BASHFLEET_LAYER_IMAGE_GB"] = str(layer_image_gb)
        with _released(root / "host", layer_image_gb), \
                _process(worker, env, root / "worker.log"):
            fleet = Fleet(server.url)
            _wait(lambda: any(h.host == HOST and h.alive and h.ready for h in fleet.hosts()),
                  "the bashfleet worker")
            source = fleet.workspace(host=HOST)
            try:
                if source.run(TREE).exit_code != 0:
                    raise RuntimeError("could not fill the source workspace")
                for index in range(count + 1):  # the first round warms up, uncounted
                    keep = index > 0
                    _quiet()
                    _fleet_round(fleet, source, times if keep else
                                 {name: [] for name in times})
                for _ in range(count):
                    _quiet()
                    _changed_fork(source, times)
            finally:
                source.delete()
    rtt = _ms(times["ctl"]) + " control round trip"
    return [
        ("fleet: fork(1) returned, its snapshot included", _ms(times["fork1"]),
         _ms(times["fresh"]) + " fresh workspace", f"<= {FORK_TARGET_S * 1e3:.0f} ms p50",
         _ok(statistics.median(times["fork1"]) <= FORK_TARGET_S)),
        ("fleet: fork(1) just after a change", _ms(times["fork1_changed"]),
         _ms(times["fresh"]) + " fresh workspace", f"<= {FORK_TARGET_S * 1e3:.0f} ms p50",
         _ok(statistics.median(times["fork1_changed"]) <= FORK_TARGET_S)),
        ("fleet: fork(16) returned, all ready", _ms(times["fork16"]), rtt,
         f"<= {FORK16_TARGET_S * 1e3:.0f} ms p50",
         _ok(statistics.median(times["fork16"]) <= FORK16_TARGET_S)),
        ("fleet: delete of a fork", _ms(times["delete_fork"]),
         _ms(times["delete_fresh"]) + " delete of a fresh one; " + rtt,
         f"<= {DELETE_TARGET_S * 1e3:.0f} ms p50",
         _ok(statistics.median(times["delete_fork"]) <= DELETE_TARGET_S)),
    ]


#: Below this share of the host's CPU over `QUIET_WINDOW_S`, the host counts as settled.
QUIET_SHARE = 0.10
QUIET_WINDOW_S = 0.1
#: Seconds a round waits for the host to settle before it starts anyway.
QUIET_WAIT_S = 10.0


def _quiet() -> None:
    """Wait until the host is settled (under `QUIET_SHARE` of its CPU busy over a window),
    at most `QUIET_WAIT_S`: a round does not start while the worker still ends the last
    round's sixteen forks and makes the blanks kept for the next fork, work that is not
    the next round's to pay for."""
    deadline = time.monotonic() + QUIET_WAIT_S
    while time.monotonic() < deadline:
        if psutil.cpu_percent(interval=QUIET_WINDOW_S) / 100 < QUIET_SHARE:
            return


@contextlib.contextmanager
def _released(state_dir: Path, layer_image_gb: int | None) -> Iterator[None]:
    """Unmount the layer image a worker of `state_dir` mounted, once it stopped (a worker
    leaves it for its next start). What its workspaces left running (a round that
    failed before its deletes) is ended first: the record of a workspace is on the image,
    and once the image is released nothing would find its keeper again."""
    try:
        yield
    finally:
        if layer_image_gb is not None:
            cleanup.end_hosts_under(state_dir)
            layer_fs.release(Settings(state_dir=state_dir, layer_image_gb=layer_image_gb))


def _fleet_round(fleet: Any, source: Any, times: dict[str, list[float]]) -> None:
    """One round of rows 6-8 (a fork, a fresh workspace, sixteen forks, a round trip,
    and the deletes), each timed as its call returns."""
    def timed(name: str, step: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        answer = step()
        times[name].append(time.perf_counter() - started)
        return answer

    (fork,) = timed("fork1", lambda: source.fork(1))
    fresh = timed("fresh", lambda: fleet.workspace(host=source.host))
    timed("ctl", source.renew)
    timed("delete_fork", fork.delete)
    timed("delete_fresh", fresh.delete)
    sixteen = timed("fork16", lambda: source.fork(16))
    for each in sixteen:
        each.delete()


def _changed_fork(source: Any, times: dict[str, list[float]]) -> None:
    """A file of the source changed (one of its 200), then `fork(1)`: its snapshot a copy
    of the layers, not the last fork's again (`fork_reuse`)."""
    if source.run("head -c 4096 /dev/urandom > repo/d0/f0").exit_code != 0:
        raise RuntimeError("could not change the source workspace")
    started = time.perf_counter()
    (fork,) = source.fork(1)
    times["fork1_changed"].append(time.perf_counter() - started)
    fork.delete()


@contextlib.contextmanager
def _state(base: Path, registry: object | None = None, layer_image_gb: int | None = None
           ) -> Iterator[Settings]:
    """The two hosts of rows 1-5; with `layer_image_gb`, each keeps its layers on an XFS
    image of its own (`layer_fs`), released at the end."""
    extra: dict[str, object] = {}
    if registry is not None:
        extra = {"registry_auth_file": getattr(registry, "auth_file"),  # noqa: B009
                 "registry_certs_dir": getattr(registry, "certs_dir"),  # noqa: B009
                 "snapshot_registry": f"{getattr(registry, 'url')}/bench/snapshots"}  # noqa: B009
    settings = Settings(state_dir=base / "state", host="bench-snapshots",
                        workspace_root=base / "workspaces", layer_image_gb=layer_image_gb,
                        **extra)  # type: ignore[arg-type]
    other = settings.model_copy(update={"state_dir": base / "other", "host": "bench-other",
                                        "workspace_root": base / "other-ws"})
    _hold["other"] = str(base / "other")
    _others.append(other)
    hosts = (settings, other)
    try:
        for each in hosts if layer_image_gb is not None else ():
            each.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            on, said = layer_fs.prepare(each) or (False, "not asked")
            _say(f"{each.host}: {said}")
            if not on:
                raise SystemExit(f"{each.host}: no XFS image: {said}")
        yield settings
    finally:
        workspaces.throwaways.close()
        for each in (settings, *_others):
            for record in workspaces.local_records(each):
                workspaces.delete(record.id, each)
        sandbox.close_all()
        for each in hosts if layer_image_gb is not None else ():
            layer_fs.release(each)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.bench_snapshots", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer runs")
    parser.add_argument("--dir", type=Path, default=None, help="where its state goes")
    parser.add_argument("--count", type=int, default=None,
                        help="snapshots and forks measured (default 30; --quick 6)")
    parser.add_argument("--no-fleet", action="store_true",
                        help="without the rows through the fleet (a Redis and a worker)")
    parser.add_argument("--fleet-only", action="store_true", help="only the fleet's rows")
    parser.add_argument("--layer-image", type=int, default=None, metavar="GB",
                        help="every host keeps its layers on an XFS image this big")
    args = parser.parse_args(argv)
    count = args.count or (6 if args.quick else 30)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-snapshots-") as folder:
        base = Path(folder)
        if args.fleet_only:
            _say(f"{count} rounds through the fleet")
            _print(fleet_rows(base, count, args.layer_image))
            return 0
        with running_registry(base / "registry") as registry, \
                _state(base, registry, args.layer_image) as settings:
            if sandbox.host_ids(settings) is None:
                _say("this host gives workspaces no ids of their own: nothing to measure")
                return 1
            _say(f"{count} snapshots of 50 MiB (and as many cp -a)")
            rows, snap_id = snapshot_rows(settings, count, base)
            _say(f"{count} forks and fresh workspaces; 16 forks")
            rows += fork_rows(settings, snap_id, count)
            _say("a workspace from the snapshot on another host, cold")
            rows.append(across_row(settings, _others[-1], snap_id, count))
        if not args.no_fleet:
            _say(f"{count} rounds through the fleet")
            rows += fleet_rows(base, count, args.layer_image)
    _print(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
