"""Images benchmark: what a pull through bashfleet costs against the tools by hand.

    python -m bench.bench_images [--quick] [--runs N] [--dir D]

Starts a real registry on 127.0.0.1 (Debian's docker-registry, TLS and basic auth: the
tests' `tests/integration/registry.py`, which also makes the test images on this machine
once, with mmdebstrap and umoci, and keeps them under /var/tmp), pushes Debian bookworm
minbase to it, and measures, alternating the sides run by run:

1. Cold pull to a root filesystem: `images.ensure` on an empty store (resolve the tag,
   copy by digest, unpack, describe) against the same by hand, `skopeo copy` into a
   fresh OCI layout then `umoci raw unpack` (what the store runs). Target: median
   ratio at most 1.1x. Every run starts after `sync` (the last run's writeback would
   otherwise fall into it).
2. The same cold pull against `skopeo copy` alone (the download without the unpack):
   informational; on a local registry the unpack is most of it.
3. A pull that shares every layer with an image held (USER/WORKDIR/ENV on the same
   layer): only the manifest and config travel; the unpack remains. Informational.
4. A cached `ensure` (the image held): p50 and p99 over many calls. Target: p50 under
   5 ms.

Not a test: it never fails on a miss. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bashfleet.worker.engine.images import images

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
# The tests' registry and images: the one way to serve a registry on this machine.
from integration.registry import Registry, pushed_images

#: Target of the cold pull against the tools by hand.
COLD_TARGET = 1.1
#: Target of a cached ensure's median.
CACHED_TARGET_S = 0.005


def by_hand(registry: Registry, ref: str, folder: Path, *, unpack: bool) -> float:
    """`skopeo copy` into a fresh layout (then `umoci raw unpack`): seconds."""
    started = time.perf_counter()
    subprocess.run(["skopeo", "copy", "--quiet", "--src-authfile", str(registry.auth_file),
                    "--src-cert-dir", str(registry.certs_dir), f"docker://{ref}",
                    f"oci:{folder / 'layout'}:image"], check=True)
    if unpack:
        subprocess.run(["umoci", "raw", "unpack", "--image", f"{folder / 'layout'}:image",
                        str(folder / "rootfs")], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def through_bashfleet(registry: Registry, ref: str, folder: Path,
                      held: str | None = None) -> float:
    """`images.ensure` on a fresh store (holding `held` first, untimed): seconds."""
    settings = registry.settings(folder / "state")
    if held is not None:
        images.ensure(held, settings)
    started = time.perf_counter()
    images.ensure(ref, settings)
    return time.perf_counter() - started


def alternate(runs: int, scratch: Path, sides: dict[str, Callable[[Path], float]]
              ) -> dict[str, list[float]]:
    """Each side `runs` times, the order rotating every run, each in a fresh folder."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for run in range(runs):
        for name in names[run % len(names):] + names[: run % len(names)]:
            folder = Path(tempfile.mkdtemp(dir=scratch))
            # The last run's files written out first: their writeback would otherwise
            # fall into this run (seconds of difference on a small VM's disk).
            os.sync()
            try:
                times[name].append(sides[name](folder))
            finally:
                shutil.rmtree(folder)
            print(f"  {name}: {times[name][-1]:.2f} s", file=sys.stderr)
    return times


def cached_ensures(registry: Registry, ref: str, folder: Path, count: int) -> list[float]:
    settings = registry.settings(folder / "state")
    images.ensure(ref, settings)
    times = []
    for _ in range(count):
        started = time.perf_counter()
        images.ensure(ref, settings)
        times.append(time.perf_counter() - started)
    return times


def _row(name: str, measured: str, baseline: str, ratio: str, target: str, *,
         ok: bool | None) -> str:
    status = "info" if ok is None else ("ok" if ok else "MISS")
    return f"{name:<44} {measured:<12} {baseline:<12} {ratio:<8} {target:<10} {status}"


def _pct(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def print_table(cold: dict[str, list[float]], shared: dict[str, list[float]],
                cached: list[float]) -> None:
    ours, hand = statistics.median(cold["bashfleet"]), statistics.median(cold["by hand"])
    copy = statistics.median(cold["skopeo copy"])
    print()
    print(_row("row", "measured", "baseline", "ratio", "target", ok=None).replace("info", "status"))
    print("-" * 98)
    print(_row("cold pull to a rootfs (vs copy + unpack)", f"{ours:.2f} s", f"{hand:.2f} s",
               f"{ours / hand:.2f}x", f"<= {COLD_TARGET}x", ok=ours / hand <= COLD_TARGET))
    print(_row("cold pull vs skopeo copy alone (info)", f"{ours:.2f} s", f"{copy:.2f} s",
               f"{ours / copy:.2f}x", "-", ok=None))
    mine, base = statistics.median(shared["shared layers"]), ours
    print(_row("pull sharing every layer held (info)", f"{mine:.2f} s", f"{base:.2f} s",
               f"{mine / base:.2f}x", "-", ok=None))
    p50, p99 = statistics.median(cached), _pct(cached, 99)
    print(_row("cached ensure, p50", f"{p50 * 1e3:.2f} ms", "-", "-",
               f"<= {CACHED_TARGET_S * 1e3:.0f} ms", ok=p50 <= CACHED_TARGET_S))
    print(_row("cached ensure, p99 (info)", f"{p99 * 1e3:.2f} ms", "-", "-", "-", ok=None))
    print("\nsingle runs (s): " + "; ".join(
        f"{name} " + ", ".join(f"{t:.2f}" for t in values)
        for name, values in {**cold, **shared}.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one run a side, 50 cached")
    parser.add_argument("--runs", type=int, default=5, help="cold pulls a side (default 5)")
    parser.add_argument("--dir", help="where the registry and the stores go (default: "
                        "the system temp directory)")
    args = parser.parse_args(argv)
    runs, count = (1, 50) if args.quick else (args.runs, 500)
    root = Path(tempfile.mkdtemp(prefix="bench-images-", dir=args.dir))
    registry = Registry(root / "registry")
    try:
        print("making the test images (cached) and starting a registry", file=sys.stderr)
        registry.start()
        refs = pushed_images(registry)
        print("bashfleet images benchmark (Debian bookworm minbase, local registry)")
        print(f"python {sys.version.split()[0]}, cpus {os.cpu_count()}, "
              f"skopeo {_version('skopeo')}, umoci {_version('umoci')}, state {root}")
        debian = refs["debian"]
        print("cold pulls, alternating", file=sys.stderr)
        cold = alternate(runs, root, {
            "bashfleet": lambda folder: through_bashfleet(registry, debian, folder),
            "by hand": lambda folder: by_hand(registry, debian, folder, unpack=True),
            "skopeo copy": lambda folder: by_hand(registry, debian, folder, unpack=False),
        })
        shared = alternate(runs, root, {"shared layers": lambda folder: through_bashfleet(
            registry, refs["user"], folder, held=debian)})
        print("cached ensures", file=sys.stderr)
        cache_dir = Path(tempfile.mkdtemp(dir=root))
        cached = cached_ensures(registry, debian, cache_dir, count)
        print_table(cold, shared, cached)
        sys.stdout.flush()
    finally:
        registry.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


def _version(tool: str) -> str:
    done = subprocess.run([tool, "--version"], capture_output=True, text=True, check=False)
    return done.stdout.split()[-1] if done.stdout.split() else "?"


if __name__ == "__main__":
    sys.exit(main())
