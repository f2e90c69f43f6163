"""Snapshots that clone: a snapshot's cost on this host's own file system against the
same on an XFS image with reflink (`layer_image_gb`), `cp -a` of the same layers the
baseline on each, every kind interleaved in each round.

    python -m bench.bench_snapshot_clone [--rounds N] [--dir D] [--no-gib]

Two workspaces per file system, each with a loop writing to its /tmp while it is
snapshotted: one holding 50 MiB of its own changes in 500 files, one holding 1 GiB in
512 files, half of each in its directory and half in its own `/`. Rows: the snapshot's
p50 (`snapshots.take`), how long its source was paused, and `cp -a` of its layers
(`--reflink=auto`: on the XFS image it clones too); and the first snapshot taken right
after the files were written (a clone writes dirty pages out first). Targets: 50 MiB
<= 150 ms, 1 GiB <= 300 ms, paused <= 100 ms.

Root only (the image is loop-mounted). Not a test: it never fails on a miss. Progress
goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from bashfleet.worker import Call, run_call
from bashfleet.worker.engine import sandbox, workspaces
from bashfleet.worker.engine.snapshots import layer_fs, snapshot_store, snapshots
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import WorkspaceRecord, WorkspaceSpec
from bench.bench_containers import Row, _ok, _print, _say

MIB = 1 << 20
TARGETS_S = {"50 MiB": 0.150, "1 GiB": 0.300}
PAUSE_TARGET_MS = 100.0

#: 50 MiB in 500 files (400 of 64 KiB in its directory, 100 of 256 KiB in its `/`).
FILL_50M = ("set -e; mkdir -p repo /pkg; head -c 26214400 /dev/urandom > /tmp/blob; "
            "i=0; while [ $i -lt 400 ]; do dd if=/tmp/blob of=repo/f$i bs=64k count=1 "
            "skip=$i status=none; i=$((i+1)); done; "
            "i=0; while [ $i -lt 100 ]; do dd if=/tmp/blob of=/pkg/g$i bs=256k count=1 "
            "skip=$((i % 90)) status=none; i=$((i+1)); done; rm /tmp/blob")
#: 1 GiB in 512 files of 2 MiB (256 in its directory, 256 in its `/`).
FILL_1G = ("set -e; mkdir -p repo /pkg; head -c 67108864 /dev/urandom > /tmp/blob; "
           "i=0; while [ $i -lt 256 ]; do dd if=/tmp/blob of=repo/h$i bs=2M count=1 "
           "skip=$((i % 32)) status=none; dd if=/tmp/blob of=/pkg/h$i bs=2M count=1 "
           "skip=$(((i + 7) % 32)) status=none; i=$((i+1)); done; rm /tmp/blob")
BEAT = "while :; do date +%s%N > /tmp/beat; sleep 0.01; done"


def _run(settings: Settings, ws_id: str, command: str, *, background: bool = False) -> None:
    result = run_call(Call(call_id=f"b{uuid.uuid4().hex[:15]}", command=command,
                           workspace=ws_id, timeout_s=600, background=background),
                      settings=settings)
    if not background and result.exit_code != 0:
        raise RuntimeError(f"{command[:40]!r} failed: {result!r}")


def _source(settings: Settings, fill: str) -> WorkspaceRecord:
    record = workspaces.create(WorkspaceSpec(), settings)
    _run(settings, record.id, fill)
    _run(settings, record.id, BEAT, background=True)
    return record


def _snapshot(settings: Settings, ws: WorkspaceRecord) -> tuple[float, float]:
    started = time.perf_counter()
    record, paused = snapshots.take(ws, settings, ttl_s=600)
    took = time.perf_counter() - started
    snapshots.remove(record.id, settings)
    _settle(settings)
    return took, paused or 0.0


def _settle(settings: Settings) -> None:
    """What a removal left the file system to do (XFS frees removed inodes, and their
    shared extents, in the background) done before the next measurement, on both file
    systems alike: `sync -f` (syncfs) waits for it."""
    subprocess.run(["sync", "-f", str(snapshot_store.snapshots_dir(settings))], check=True)


def _cp(settings: Settings, ws: WorkspaceRecord, scratch: Path) -> float:
    """`cp -a` of the workspace's layers, into a directory of the same file system as
    its snapshots (the layers' own are copied, nothing paused, no ids shifted)."""
    target = snapshot_store.snapshots_dir(settings) / f".cp-{uuid.uuid4().hex[:8]}"
    target.mkdir(parents=True)
    layers = [str(src) for src, _ in snapshots.own_dirs(ws, settings)]
    started = time.perf_counter()
    subprocess.run(["cp", "-a", "--reflink=auto", "--", *layers, str(target)], check=True)
    took = time.perf_counter() - started
    shutil.rmtree(target)
    _settle(settings)
    return took


@contextlib.contextmanager
def _host(base: Path, name: str, image_gb: int | None) -> Iterator[Settings]:
    settings = Settings(state_dir=base / name / "state", host=f"bench-{name}",
                        workspace_root=base / name / "workspaces", layer_image_gb=image_gb)
    settings.state_dir.mkdir(parents=True, mode=0o700)
    if image_gb is not None:
        on, said = layer_fs.prepare(settings) or (False, "not asked")
        _say(f"{name}: {said}")
        if not on:
            raise SystemExit(f"{name}: no XFS image: {said}")
    try:
        yield settings
    finally:
        for record in workspaces.local_records(settings):
            workspaces.delete(record.id, settings)
        # Once nothing of this process holds a workspace on it (its pool's keepers).
        workspaces.throwaways.close()
        sandbox.close_all()
        if image_gb is not None:
            layer_fs.release(settings)


def _fs(path: Path) -> str:
    """The type of the file system `path` is on, as mounted (`stat -f` names ext4 by its
    superblock's magic, which ext2 and ext3 share: "ext2/ext3")."""
    return subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "-T", str(path)],
                          capture_output=True, text=True, check=True).stdout.strip()


def measure(hosts: dict[str, Settings], sizes: dict[str, str], rounds: int,
            scratch: Path) -> list[Row]:
    """Each size's rounds in turn (a 1 GiB copy's writes, on the disk the image lives on
    too, would weigh on the 50 MiB rows), the file systems interleaved in each round."""
    sources: dict[tuple[str, str], WorkspaceRecord] = {}
    first: dict[tuple[str, str], float] = {}
    taken: dict[tuple[str, str], list[float]] = {}
    paused: dict[tuple[str, str], list[float]] = {}
    copies: dict[tuple[str, str], list[float]] = {}
    for size, fill in sizes.items():
        keys = [(fs, size) for fs in hosts]
        for key in keys:
            settings = hosts[key[0]]
            sources[key] = _source(settings, fill)
            # The first snapshot right after the writes, their pages still dirty: a
            # clone writes them out first (a copy reads them from memory). Then settled.
            first[key] = _snapshot(settings, sources[key])[0]
            taken[key], paused[key], copies[key] = [], [], []
        for index in range(rounds):
            _say(f"{size}: round {index + 1}/{rounds}")
            # Each round in another order: no kind always follows the same one.
            order = keys[index % len(keys):] + keys[:index % len(keys)]
            for key in order:
                settings = hosts[key[0]]
                took, pause = _snapshot(settings, sources[key])
                taken[key].append(took)
                paused[key].append(pause)
                copies[key].append(_cp(settings, sources[key], scratch))
    rows: list[Row] = []
    for size in sizes:
        for fs, settings in hosts.items():
            key = (fs, size)
            p50 = statistics.median(taken[key])
            rows.append((
                f"snapshot of {size} ({fs}: {_fs(snapshot_store.snapshots_dir(settings))})",
                f"{p50 * 1e3:.1f} ms (max {max(taken[key]) * 1e3:.1f})",
                f"{statistics.median(copies[key]) * 1e3:.1f} ms cp -a of its layers",
                f"<= {TARGETS_S[size] * 1e3:.0f} ms p50", _ok(p50 <= TARGETS_S[size])))
            rows.append((f"  its first, the writes not yet on disk ({fs})",
                         f"{first[key] * 1e3:.1f} ms", "-", "-", "-"))
            pause = statistics.median(paused[key])
            rows.append((f"  its source paused ({fs})",
                         f"{pause:.1f} ms (max {max(paused[key]):.1f})", "-",
                         f"<= {PAUSE_TARGET_MS:.0f} ms", _ok(max(paused[key]) <= PAUSE_TARGET_MS)))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.bench_snapshot_clone", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="rounds (default 7)")
    parser.add_argument("--dir", type=Path, default=None, help="where its state goes")
    parser.add_argument("--no-gib", action="store_true", help="the 50 MiB rows only")
    args = parser.parse_args(argv)
    sizes = {"50 MiB": FILL_50M} if args.no_gib else {"50 MiB": FILL_50M, "1 GiB": FILL_1G}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-clone-") as folder:
        base = Path(folder)
        with _host(base, "plain", None) as plain, _host(base, "image", 8) as image:
            if sandbox.host_ids(plain) is None:
                _say("this host gives workspaces no ids of their own: nothing to measure")
                return 1
            _say(f"{args.rounds} rounds of {', '.join(sizes)} on the plain directories "
                 "and on the XFS image")
            rows = measure({"plain": plain, "image": image}, sizes, args.rounds, base)
    _print(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
