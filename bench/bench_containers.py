"""Containers benchmark: workspaces with ids and layers of their own, from the host's
root and from an image, against baselines measured in the same run.

    python -m bench.bench_containers [--quick] [--dir D] [--count N]

Starts a real registry on 127.0.0.1 (the tests' `tests/integration/registry.py`, whose
Debian bookworm image is made here once with mmdebstrap and umoci), pulls it once, then,
alternating the sides run by run:

1. A workspace on the host's root ready for its first call (`workspaces.create`): p50
   and p99. Target: p50 <= 10 ms.
2. A workspace from the cached image ready for its first call: p50, p99. Target: p50
   <= 30 ms.
3. `true` in a warm image workspace against `true` in a warm host-root workspace:
   median per call. Target: ratio <= 1.1x.
4. 100 workspaces on one image, each having written 1 MiB: the disk they hold beside
   the image (held once), and the memory per idle workspace (its keeper's PSS).

Not a test: it never fails on a miss. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from bashfleet.worker import Call, run_call
from bashfleet.worker.engine import sandbox, workspaces
from bashfleet.worker.engine.images import images
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import WorkspaceSpec
from bench.bench_idle import namespace_pss

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
# The tests' registry and images: the one way to serve a registry on this machine.
from integration.registry import Registry, pushed_images, running_registry

HOST_READY_TARGET_S = 0.010
IMAGE_READY_TARGET_S = 0.030
TRUE_TARGET = 1.1
MIB = 1 << 20

Row = tuple[str, str, str, str, str]


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(values: Sequence[float]) -> str:
    return f"{statistics.median(values) * 1e3:.1f} ms (p99 {_pct(values, 0.99) * 1e3:.1f})"


def _ok(good: bool) -> str:
    return "ok" if good else "MISS"


def _true(settings: Settings, ws_id: str) -> Callable[[], None]:
    def run() -> None:
        result = run_call(Call(call_id=f"b{uuid.uuid4().hex[:15]}", command="true",
                               workspace=ws_id), settings=settings)
        if result.exit_code != 0:
            raise RuntimeError(f"`true` failed: {result!r}")
    return run


def ready_rows(settings: Settings, ref: str, count: int) -> list[Row]:
    """Rows 1 and 2: made, alternating host root and image, each deleted after."""
    host: list[float] = []
    image: list[float] = []
    for index in range(count * 2):
        spec = WorkspaceSpec(image=ref) if index % 2 else WorkspaceSpec()
        started = time.perf_counter()
        record = workspaces.create(spec, settings)
        (image if index % 2 else host).append(time.perf_counter() - started)
        workspaces.delete(record.id, settings)
    return [
        ("host-root workspace ready for its first call", _ms(host), "-",
         f"<= {HOST_READY_TARGET_S * 1e3:.0f} ms p50",
         _ok(statistics.median(host) <= HOST_READY_TARGET_S)),
        ("workspace from a cached image ready", _ms(image), "-",
         f"<= {IMAGE_READY_TARGET_S * 1e3:.0f} ms p50",
         _ok(statistics.median(image) <= IMAGE_READY_TARGET_S)),
    ]


def true_row(settings: Settings, ref: str, count: int) -> Row:
    """Row 3: `true` in two warm workspaces, in alternating blocks of ten."""
    on_host = workspaces.create(WorkspaceSpec(), settings)
    on_image = workspaces.create(WorkspaceSpec(image=ref), settings)
    try:
        timed: dict[str, list[float]] = {"host": [], "image": []}
        runs = {"host": _true(settings, on_host.id), "image": _true(settings, on_image.id)}
        for run in runs.values():
            run()  # warm
        for block in range(count // 10 * 2):
            side = "image" if block % 2 else "host"
            for _ in range(10):
                started = time.perf_counter()
                runs[side]()
                timed[side].append(time.perf_counter() - started)
        ratio = statistics.median(timed["image"]) / statistics.median(timed["host"])
        return ("`true` in a warm image workspace", _ms(timed["image"]),
                _ms(timed["host"]) + " host root", f"<= {TRUE_TARGET}x ({ratio:.2f}x)",
                _ok(ratio <= TRUE_TARGET))
    finally:
        workspaces.delete(on_host.id, settings)
        workspaces.delete(on_image.id, settings)


def _du(path: Path) -> int:
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total


def hundred_rows(settings: Settings, ref: str, count: int) -> list[Row]:
    """Row 4: `count` workspaces on one image, each with 1 MiB of its own."""
    made: list[str] = []
    try:
        for _ in range(count):
            record = workspaces.create(WorkspaceSpec(image=ref), settings)
            made.append(record.id)
            _true(settings, record.id)()
            run_call(Call(call_id=f"b{uuid.uuid4().hex[:15]}", workspace=record.id,
                          command="head -c 1048576 /dev/urandom > /opt/mine"),
                     settings=settings)
        held = images.find(ref, settings)
        image_bytes = held.size_bytes if held is not None else 0
        own = sum(workspaces.disk_bytes(workspaces.load(ws_id, settings), settings)
                  for ws_id in made)
        pss = 0
        for ws_id in made:
            pid = workspaces.load(ws_id, settings).keeper_pid
            if pid is not None:
                pss += namespace_pss(pid)  # its holder and keeper, whichever run
        return [
            (f"{count} workspaces on one image: disk", f"{own / MIB:.0f} MiB their own",
             f"{image_bytes / MIB:.0f} MiB the image, once",
             f"image once + {count} MiB", _ok(own <= (count * 1.5 + 16) * MIB)),
            (f"{count} idle image workspaces: memory per workspace",
             f"{pss / len(made) / MIB:.2f} MiB PSS", "-", "-", "info"),
        ]
    finally:
        for ws_id in made:
            workspaces.delete(ws_id, settings)


@contextlib.contextmanager
def _fleet_state(base: Path, registry: Registry) -> Iterator[Settings]:
    settings = Settings(state_dir=base / "state", host="bench-containers",
                        workspace_root=base / "workspaces",
                        registry_auth_file=registry.auth_file,
                        registry_certs_dir=registry.certs_dir)
    try:
        yield settings
    finally:
        workspaces.throwaways.close()
        for record in workspaces.local_records(settings):
            workspaces.delete(record.id, settings)
        sandbox.close_all()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.bench_containers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer runs, 20 workspaces")
    parser.add_argument("--dir", type=Path, default=None, help="where its state goes")
    parser.add_argument("--count", type=int, default=None,
                        help="workspaces made per side (default 40; --quick 10)")
    args = parser.parse_args(argv)
    count = args.count or (10 if args.quick else 40)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-containers-") as folder:
        base = Path(folder)
        with running_registry(base / "registry") as registry:
            ref = pushed_images(registry)["debian"]
            with _fleet_state(base, registry) as settings:
                if sandbox.host_ids(settings) is None:
                    _say("this host gives workspaces no ids of their own: nothing to measure")
                    return 1
                _say(f"pulling {ref}")
                images.ensure(ref, settings)
                _say(f"{count} workspaces each way, made and deleted")
                rows = ready_rows(settings, ref, count)
                _say("`true` in warm workspaces")
                rows.append(true_row(settings, ref, count * 10))
                many = 20 if args.quick else 100
                _say(f"{many} workspaces on one image")
                rows += hundred_rows(settings, ref, many)
    _print(rows)
    return 0


def _print(rows: Sequence[Row]) -> None:
    header = ("row", "measured", "baseline", "target", "status")
    widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(5)]
    for row in (header, tuple("-" * w for w in widths), *rows):
        print(" | ".join(str(cell).ljust(width) for cell, width in zip(row, widths,
                                                                     strict=True)))


if __name__ == "__main__":
    raise SystemExit(main())
