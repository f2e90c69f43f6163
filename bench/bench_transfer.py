"""Transfer benchmark: one large file up to and down from a workspace, against moving
the same bytes through the same Redis with plain redis-py.

    python -m bench.bench_transfer [--quick] [--runs N] [--mib N] [--dir D]

Starts a Redis server and one worker on this machine, makes a workspace on it, writes a
file of random bytes (200 MiB; 32 MiB with --quick) and measures, the sides rotating run
by run:

1. `Workspace.upload_file`: the file streamed into the workspace (`bashfleet cp F W:P`).
2. `Workspace.download_file`: back out of it into a local file (`bashfleet cp W:P F`).
3. The baseline: this process RPUSHes the file in 1 MiB chunks onto a list of the same
   Redis while a second Python process BLPOPs them and writes them to a file (two
   processes, as a client and a worker are), no framing, no window, no tool.

Targets: each direction at least 100 MB/s and at least 0.5x the baseline. Informational:
a directory of 64 files of the same total size both ways, and the same file through
`write_file` / `read_file` (a control call per 4 MiB chunk: how `cp` moved files before).
Every transfer is checked byte for byte (sha256). Not a test: it never fails on a miss.
Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bashfleet.client import Fleet, Workspace
from bashfleet.client.redis_server import RedisServer
from bench import cleanup
from bench.bench_fleet import _process, _wait, worker_env

HOST = "bench-xfer"
MB = 1_000_000
CHUNK = 1024 * 1024
#: Each direction: at least this many MB/s, and this share of the baseline's.
RATE_TARGET = 100.0
RATIO_TARGET = 0.5

#: The baseline's reader: BLPOP 1 MiB chunks until an empty one, into a file (timed
#: from when it said it is connected: a Python start is not part of a transfer).
_READER = """
import sys, redis
r = redis.Redis.from_url(sys.argv[1])
r.ping()
print("ready", flush=True)
with open(sys.argv[3], "wb") as out:
    while True:
        item = r.blpop([sys.argv[2]], timeout=30)[1]
        if not item:
            break
        out.write(item)
"""


def digest(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def baseline(url: str, source: Path, target: Path) -> float:
    """The file through Redis with plain redis-py, 1 MiB chunks: seconds."""
    import redis  # noqa: PLC0415

    client = redis.Redis.from_url(url)
    key = f"bench:transfer:{time.monotonic_ns()}"
    reader = subprocess.Popen([sys.executable, "-c", _READER, url, key, str(target)],
                              stdout=subprocess.PIPE)
    try:
        assert reader.stdout is not None
        reader.stdout.readline()
        started = time.perf_counter()
        with open(source, "rb") as handle:
            while piece := handle.read(CHUNK):
                client.rpush(key, piece)
        client.rpush(key, b"")
        reader.wait(120)
        return time.perf_counter() - started
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
        client.delete(key)
        client.close()


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def old_way_up(ws: Workspace, source: Path) -> None:
    ws.write_file("old.bin", source.read_bytes())


def old_way_down(ws: Workspace, target: Path) -> None:
    target.write_bytes(ws.read_file("old.bin"))


def rotate(runs: int, sides: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Each side `runs` times, the order rotating every run."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for run in range(runs):
        for name in names[run % len(names):] + names[: run % len(names)]:
            times[name].append(sides[name]())
            print(f"  {name}: {times[name][-1]:.2f} s", file=sys.stderr)
    return times


def _row(name: str, measured: str, baseline_: str, ratio: str, target: str, *,
         ok: bool | None) -> str:
    status = "info" if ok is None else ("ok" if ok else "MISS")
    return f"{name:<44} {measured:<12} {baseline_:<12} {ratio:<8} {target:<16} {status}"


def print_table(size: int, times: dict[str, list[float]], old: dict[str, list[float]]) -> None:
    rate = {name: size / MB / statistics.median(values) for name, values in {**times,
                                                                             **old}.items()}
    base = rate["baseline"]
    print()
    print(_row("row", "measured", "baseline", "ratio", "target", ok=None).replace("info",
                                                                                  "status"))
    print("-" * 104)
    target = f">= {RATE_TARGET:.0f} MB/s, {RATIO_TARGET}x"
    for name, label in (("upload", "upload of one large file"),
                        ("download", "download of one large file")):
        ours = rate[name]
        print(_row(label, f"{ours:.0f} MB/s", f"{base:.0f} MB/s", f"{ours / base:.2f}x", target,
                   ok=ours >= RATE_TARGET and ours / base >= RATIO_TARGET))
    for name, label in (("tree up", "directory of 64 files up (info)"),
                        ("tree down", "directory of 64 files down (info)"),
                        ("old up", "write_file in 4 MiB calls (info)"),
                        ("old down", "read_file in 4 MiB calls (info)")):
        if name in rate:
            print(_row(label, f"{rate[name]:.0f} MB/s", f"{base:.0f} MB/s",
                       f"{rate[name] / base:.2f}x", "-", ok=None))
    print(f"\n({size / MB:.0f} MB a transfer; baseline: plain redis-py RPUSH / BLPOP of 1 MiB "
          "chunks between two processes on the same Redis; rates are medians)")
    print("single runs (s): " + "; ".join(
        f"{name} " + ", ".join(f"{t:.2f}" for t in values)
        for name, values in {**times, **old}.items()))


def make_tree(folder: Path, size: int, files: int = 64) -> None:
    for n in range(files):
        part = folder / f"d{n % 8}" / f"f{n}.bin"
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(os.urandom(size // files))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="32 MiB, one run a side")
    parser.add_argument("--runs", type=int, default=3, help="runs a side (default 3)")
    parser.add_argument("--mib", type=int, help="size of the file (default 200 MiB)")
    parser.add_argument("--dir", help="where the state and files go (default: the system "
                        "temp directory)")
    args = parser.parse_args(argv)
    runs = 1 if args.quick else args.runs
    size = (args.mib or (32 if args.quick else 200)) * 1024 * 1024
    root = Path(tempfile.mkdtemp(prefix="bashfleet-bench-transfer-", dir=args.dir))
    local = root / "local"
    local.mkdir()
    source = local / "big.bin"
    with open(source, "wb") as handle:
        for _ in range(size // CHUNK):
            handle.write(os.urandom(CHUNK))
    make_tree(local / "tree", size)
    want = digest(source)
    print("bashfleet transfer benchmark")
    print(f"python {sys.version.split()[0]}, cpus {os.cpu_count()}, state {root}")
    try:
        with cleanup.hosts_ended(root), RedisServer(root / "redis") as server:
            env = worker_env(server.url, root / "host")
            worker = [sys.executable, "-m", "bashfleet.worker.fleet.supervisor", "--host", HOST,
                      "--concurrency", "2"]
            with _process(worker, env, root / "worker.log"), Fleet(server.url) as fleet:
                _wait(lambda: any(h.host == HOST and h.alive and h.ready
                                  for h in fleet.hosts()), "the worker")
                with fleet.workspace(host=HOST) as ws:
                    times, old = measure(ws, server.url, local, runs, want)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(size, times, old)
    return 0


def measure(ws: Workspace, url: str, local: Path, runs: int, want: str
            ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    source, back, base = local / "big.bin", local / "back.bin", local / "base.bin"

    def checked(path: Path, seconds: float) -> float:
        if digest(path) != want:
            raise RuntimeError(f"{path.name}: the bytes differ from the source")
        path.unlink()
        return seconds

    def upload() -> float:
        return timed(lambda: ws.upload_file(source, "big.bin"))

    def download() -> float:
        return checked(back, timed(lambda: ws.download_file("big.bin", back)))

    ws.upload_file(source, "big.bin")  # the first download has a file to read
    print("one large file, rotating", file=sys.stderr)
    times = rotate(runs, {
        "upload": upload, "download": download,
        "baseline": lambda: checked(base, baseline(url, source, base)),
        "tree up": lambda: timed(lambda: ws.upload(local / "tree", "tree")),
        "tree down": lambda: timed(lambda: ws.download("tree", local / "tree-back")),
    })
    print("the old way, once", file=sys.stderr)
    old = {"old up": [timed(lambda: old_way_up(ws, source))],
           "old down": [checked(back, timed(lambda: old_way_down(ws, back)))]}
    return times, old


if __name__ == "__main__":
    sys.exit(main())
