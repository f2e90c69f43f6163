"""Snapshot registry benchmark: a snapshot layer's trip between hosts through the fleet's
registry, against the tools by hand.

    python -m bench.bench_snapshot_registry [--quick] [--runs N] [--dir D]

Starts a real registry on 127.0.0.1 (the tests' `tests/integration/registry.py`:
Debian's docker-registry, TLS and basic auth), makes a 50 MB layer of mixed data (text,
binaries copied from /usr/bin, random bytes, zeros, a sparse file; several owners,
extended attributes, a whiteout), and measures, the sides alternating run by run, each
run in a fresh directory and a fresh repository (a registry does not take a blob the
repository holds again), after a `sync`:

1. push + pull: `snapshot_registry.push` then `pull` into a fresh directory, against the
   same steps by hand: `tar --zstd` with the same flags, an OCI layout, `skopeo copy`
   up, `skopeo copy` down, `tar -x`. Target: median ratio at most 1.15x (what the module
   adds: the layer's digest checked on the way down, the member listing checked before
   unpacking).
2. The same against `skopeo copy` alone, up and down, of the same compressed layer (the
   registry's part): informational.
3. The same against `tar` alone, archive and unpack with no registry: informational.
4. The compression: archive + unpack with `zstd -T0 -3` (what push uses) against gzip
   (-6), sizes under the table: informational.

Not a test: it never fails on a miss. Must run as root (a layer's owners, whiteouts and
`trusted.*` attributes). Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bashfleet.worker.engine.snapshots import snapshot_registry as snapshots
from bashfleet.worker.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
# The tests' registry: the one way to serve a registry on this machine.
from integration.registry import Registry

#: Target of push + pull against the same steps by hand.
TRIP_TARGET = 1.15
#: Bytes of the layer, about (text, binaries, random, zeros).
LAYER_MB = {"text": 20, "bin": 15, "random": 10, "zeros": 5}
#: What tar archives with (the module's flags), before `--file` and the compressor.
TAR_CREATE = ["tar", "--create", "--format=posix", "--pax-option=delete=atime,delete=ctime",
              "--sort=name", "--sparse", "--numeric-owner", "--acls", "--xattrs",
              *(f"--xattrs-include={p}" for p in snapshots.XATTRS)]


# ------------------------------------------------------------------------ the layer


def make_layer(layer: Path) -> int:
    """A layer of about 50 MB of mixed data; the bytes it takes on disk."""
    rng = random.Random(7)
    for name in ("text", "bin", "random", "zeros", "top.etc"):
        (layer / name).mkdir(parents=True)
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 10)))
             for _ in range(3000)]
    per_file = 16 * 1024
    for index in range(LAYER_MB["text"] * 2**20 // per_file):
        text = " ".join(rng.choices(words, k=per_file // 6))[:per_file]
        path = layer / "text" / f"f{index:04d}.txt"
        path.write_text(text)
        if index % 3 == 0:
            os.chown(path, 1000, 1000)
    _copy_binaries(layer / "bin", LAYER_MB["bin"] * 2**20)
    for index in range(LAYER_MB["random"]):
        (layer / "random" / f"r{index}").write_bytes(rng.randbytes(2**20))
    (layer / "zeros" / "z").write_bytes(bytes(LAYER_MB["zeros"] * 2**20))
    with open(layer / "zeros" / "sparse", "wb") as handle:  # 4 MiB of holes, 3 bytes
        handle.seek(4 * 2**20)
        handle.write(b"end")
    os.setxattr(layer / "top.etc", "trusted.overlay.opaque", b"y")
    os.setxattr(layer / "text" / "f0000.txt", "user.x", b"1")
    os.mknod(layer / "top.etc" / "gone", stat.S_IFCHR, os.makedev(0, 0))
    return sum(p.stat().st_blocks * 512 for p in layer.rglob("*") if p.is_file())


def _copy_binaries(folder: Path, total: int) -> None:
    copied = 0
    for path in sorted(Path("/usr/bin").iterdir()):
        if copied >= total:
            return
        if path.is_file() and not path.is_symlink() and path.stat().st_size <= 2**20:
            shutil.copyfile(path, folder / path.name)
            copied += path.stat().st_size


# ------------------------------------------------------------------------- the sides


def through_bashfleet(settings: Settings, layer: Path, ref: str, folder: Path) -> float:
    started = time.perf_counter()
    snapshots.push(layer, ref, settings)
    snapshots.pull(ref, folder / "dest", settings)
    return time.perf_counter() - started


def by_hand(registry: Registry, layer: Path, ref: str, folder: Path) -> float:
    """tar, a layout, skopeo up, skopeo down, tar -x: seconds."""
    started = time.perf_counter()
    blob = folder / "layer"
    _run([*TAR_CREATE, f"--file={blob}", f"--use-compress-program={snapshots.COMPRESSOR}",
          f"--directory={layer}", "."])
    snapshots._write_layout(folder / "up", blob, b"{}")
    _copy_up(registry, folder / "up", ref)
    _copy_down(registry, ref, folder / "down")
    (folder / "dest").mkdir()
    _run(snapshots.extract_argv(_only_layer(folder / "down"), "zstd", folder / "dest"))
    return time.perf_counter() - started


def skopeo_alone(registry: Registry, layout: Path, ref: str, folder: Path) -> float:
    """The compressed layer (made before, untimed) up and down: seconds."""
    started = time.perf_counter()
    _copy_up(registry, layout, ref)
    _copy_down(registry, ref, folder / "down")
    return time.perf_counter() - started


def tar_alone(layer: Path, folder: Path, compressor: str = snapshots.COMPRESSOR,
              decompressor: str = "zstd") -> float:
    """Archive and unpack, no registry: seconds."""
    started = time.perf_counter()
    blob = folder / "layer"
    _run([*TAR_CREATE, f"--file={blob}", f"--use-compress-program={compressor}",
          f"--directory={layer}", "."])
    (folder / "dest").mkdir()
    _run(snapshots.extract_argv(blob, decompressor, folder / "dest"))
    return time.perf_counter() - started


def _copy_up(registry: Registry, layout: Path, ref: str) -> None:
    _run(["skopeo", "copy", "--quiet", "--preserve-digests", "--dest-authfile",
          str(registry.auth_file), "--dest-cert-dir", str(registry.certs_dir),
          f"oci:{layout}:{snapshots.LAYOUT_TAG}", f"docker://{ref}"])


def _copy_down(registry: Registry, ref: str, layout: Path) -> None:
    _run(["skopeo", "copy", "--quiet", "--preserve-digests", "--src-authfile",
          str(registry.auth_file), "--src-cert-dir", str(registry.certs_dir),
          f"docker://{ref}", f"oci:{layout}:{snapshots.LAYOUT_TAG}"])


def _only_layer(layout: Path) -> Path:
    """The largest blob of a layout: its layer."""
    return max((layout / "blobs" / "sha256").iterdir(), key=lambda p: p.stat().st_size)


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def alternate(runs: int, scratch: Path, sides: dict[str, Callable[[Path, str], float]]
              ) -> dict[str, list[float]]:
    """Each side `runs` times, the order rotating every run, each in a fresh folder with
    a fresh repository name."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for run in range(runs):
        for name in names[run % len(names):] + names[: run % len(names)]:
            folder = Path(tempfile.mkdtemp(dir=scratch))
            os.sync()  # the last run's writeback would otherwise fall into this one
            try:
                repository = f"bench/{name.replace(' ', '-')}-{run}"
                times[name].append(sides[name](folder, repository))
            finally:
                shutil.rmtree(folder)
            print(f"  {name}: {times[name][-1]:.2f} s", file=sys.stderr)
    return times


# ------------------------------------------------------------------------- the table


def _row(name: str, measured: str, baseline: str, ratio: str, target: str, *,
         ok: bool | None) -> str:
    status = "info" if ok is None else ("ok" if ok else "MISS")
    return f"{name:<46} {measured:<10} {baseline:<10} {ratio:<8} {target:<10} {status}"


def print_table(times: dict[str, list[float]], sizes: dict[str, int]) -> None:
    median = {name: statistics.median(values) for name, values in times.items()}
    ours = median["bashfleet"]
    print()
    print(_row("row", "measured", "baseline", "ratio", "target", ok=None).replace("info", "status"))
    print("-" * 96)
    rows = [("push + pull of a 50 MB layer (vs by hand)", "by hand", TRIP_TARGET),
            ("push + pull vs skopeo copy alone (info)", "skopeo copy", None),
            ("push + pull vs tar + untar alone (info)", "tar", None)]
    for label, side, target in rows:
        ratio = ours / median[side]
        print(_row(label, f"{ours:.2f} s", f"{median[side]:.2f} s", f"{ratio:.2f}x",
                   f"<= {target}x" if target else "-",
                   ok=None if target is None else ratio <= target))
    zstd, gzip = median["tar"], median["tar gzip"]
    print(_row("archive + unpack: zstd -3 vs gzip -6 (info)", f"{zstd:.2f} s", f"{gzip:.2f} s",
               f"{zstd / gzip:.2f}x", "-", ok=None))
    print(f"\ncompressed sizes: zstd -3 {sizes['zstd'] / 1e6:.1f} MB, gzip -6 "
          f"{sizes['gzip'] / 1e6:.1f} MB, of {sizes['layer'] / 1e6:.1f} MB")
    print("single runs (s): " + "; ".join(
        f"{name} " + ", ".join(f"{t:.2f}" for t in values) for name, values in times.items()))


def compressed_sizes(layer: Path, scratch: Path) -> dict[str, int]:
    sizes = {}
    for name, program in (("zstd", snapshots.COMPRESSOR), ("gzip", "gzip")):
        blob = scratch / f"size.{name}"
        _run([*TAR_CREATE, f"--file={blob}", f"--use-compress-program={program}",
              f"--directory={layer}", "."])
        sizes[name] = blob.stat().st_size
        blob.unlink()
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one run a side")
    parser.add_argument("--runs", type=int, default=5, help="runs a side (default 5)")
    parser.add_argument("--dir", help="where the registry, the layer and the copies go "
                        "(default: the system temp directory)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_snapshot_registry needs root (a layer's owners and whiteouts)",
              file=sys.stderr)
        return 1
    runs = 1 if args.quick else args.runs
    root = Path(tempfile.mkdtemp(prefix="bench-snapreg-", dir=args.dir))
    registry = Registry(root / "registry")
    try:
        print("making a 50 MB layer and starting a registry", file=sys.stderr)
        layer = root / "snap" / "layer"
        size = make_layer(layer)
        registry.start()
        settings = registry.settings(root / "state")
        print("bashfleet snapshot registry benchmark (a 50 MB layer, local registry)")
        print(f"python {sys.version.split()[0]}, cpus {os.cpu_count()}, "
              f"skopeo {_version('skopeo')}, state {root}")
        made = root / "made"
        made.mkdir()
        tar_alone(layer, made)
        snapshots._write_layout(made / "layout", made / "layer", b"{}")
        url = registry.url
        times = alternate(runs, root, {
            "bashfleet": lambda f, repo: through_bashfleet(settings, layer, f"{url}/{repo}:s", f),
            "by hand": lambda f, repo: by_hand(registry, layer, f"{url}/{repo}:s", f),
            "skopeo copy": lambda f, repo: skopeo_alone(registry, made / "layout",
                                                        f"{url}/{repo}:s", f),
            "tar": lambda f, repo: tar_alone(layer, f),
            "tar gzip": lambda f, repo: tar_alone(layer, f, "gzip", "gzip"),
        })
        print_table(times, {**compressed_sizes(layer, root), "layer": size})
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
