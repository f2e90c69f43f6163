"""Engine benchmark: what running a command through `run_call` costs over bare bash.

    python -m bench.bench_engine [--quick] [--dir DIR] [--calls N] [--runs N]

Every row is measured against a baseline taken in the same run, interleaved with it
so that a noisy machine hurts both sides alike:

1. Per-call overhead of `true`: `run_call(Call(command="true"))` unsandboxed
   (`isolation=none`) against `subprocess.run(["bash", "-c", "true"])`, N calls each in
   rotating blocks; median and p90 per call; target: median ratio <= 1.3x. Two
   informational rows repeat it with the native dialect's error digest on and with
   combined streams.
1b. The sandbox: `run_call` of `true` with `isolation=process` (bubblewrap: a PID
   namespace, the worker's files hidden) against the same call unsandboxed, measured
   in the same rotation; target: median ratio <= 1.3x. An informational row for
   `strict` (read-only root, private /tmp, no network).
2. Wall time of a command printing 1 GiB of lines through `run_call` against bash
   redirecting the same command into a file; median of alternating runs;
   target: ratio <= 1.15x.
3. Peak RSS growth of this process during the 1 GiB call (sampled every 5 ms);
   target: <= 32 MiB.

Not a test: it never fails on a miss. It prints measured, baseline, ratio, target
and `ok` / `MISS` per row (`info` for rows without a target).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import psutil

from bashfleet.worker import Call, Policy, Settings, run_call
from bashfleet.worker.engine import sandbox, workspaces
from bashfleet.worker.wire.models import WorkspaceSpec
from bench import cleanup
from bench.bench_idle import namespace_pss

MIB = 1024 * 1024
GIB = 1024 * MIB
#: 27-byte lines ("a..z\n"), cut by head inside the last one: exact counts are known.
BIG_LINE = "abcdefghijklmnopqrstuvwxyz"
BIG_COMMAND = f"yes {BIG_LINE} | head -c {GIB}"
BIG_LINES = math.ceil(GIB / (len(BIG_LINE) + 1))

TRUE_TARGET = 1.30
BIG_TARGET = 1.15
RSS_TARGET_MIB = 32.0

#: Calls per block of the interleaved `true` measurement.
BLOCK = 10
#: How often the RSS sampler looks.
SAMPLE_INTERVAL_S = 0.005

Runner = Callable[[], None]


@dataclass(frozen=True)
class Config:
    """How much to measure."""

    calls: int
    warmup: int
    big_runs: int
    big_warmup: bool


#: Six 1 GiB runs per side, not three: on a small VM one run varies 1-3 s, and an even
#: count lets each side go first equally often.
FULL = Config(calls=300, warmup=20, big_runs=6, big_warmup=True)
QUICK = Config(calls=40, warmup=5, big_runs=1, big_warmup=True)


@dataclass(frozen=True)
class Row:
    """One line of the table."""

    name: str
    measured: str
    baseline: str
    ratio: float | None
    target: str
    status: str
    note: str = ""
    """Printed under the table (the single runs behind a median, for example)."""


_ids = itertools.count()


def _call_id(prefix: str) -> str:
    return f"bench-{prefix}-{os.getpid()}-{next(_ids)}"


def _progress(message: str) -> None:
    print(f"... {message}", file=sys.stderr, flush=True)


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))
    return ordered[index]


def _status(ok: bool) -> str:
    return "ok" if ok else "MISS"


# ------------------------------------------------------------------- per-call overhead


def _engine_true(settings: Settings, policy: Policy | None,
                 workspace: str | None = None) -> Runner:
    def run() -> None:
        call = Call(call_id=_call_id("true"), command="true", policy=policy or Policy(),
                    workspace=workspace)
        result = run_call(call, settings=settings)
        if result.exit_code != 0 or result.error is not None:
            raise RuntimeError(f"run_call failed: {result!r}")

    return run


def _bash_true() -> None:
    subprocess.run(["bash", "-c", "true"], check=True)


def measure_interleaved(
    runners: dict[str, Runner], calls: int, warmup: int
) -> dict[str, list[float]]:
    """Seconds per call of each runner, run in blocks whose order rotates every round."""
    names = list(runners)
    for name in names:
        for _ in range(warmup):
            runners[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_no in range(math.ceil(calls / BLOCK)):
        shift = round_no % len(names)
        for name in names[shift:] + names[:shift]:
            run, bucket = runners[name], times[name]
            for _ in range(BLOCK):
                start = time.perf_counter()
                run()
                bucket.append(time.perf_counter() - start)
    return times


def _ms(values: Sequence[float]) -> str:
    median, p90 = statistics.median(values), _percentile(values, 0.9)
    return f"{median * 1e3:.3f} ms (p90 {p90 * 1e3:.3f})"


def overhead_rows(settings: Settings, config: Config) -> list[Row]:
    """Row 1 and its informational variants (unsandboxed), and the sandbox rows (1b)."""
    plain = settings.model_copy(update={"isolation": "none"})
    boxed = settings.model_copy(update={"isolation": "process"})
    strict = settings.model_copy(update={"isolation": "strict"})
    variants: dict[str, tuple[str, Policy | None]] = {
        "default": ("`true` per call: run_call vs bash -c", None),
        "digest": (
            "  same, native + digest_errors (info)",
            Policy(name="native", digest_errors=True),
        ),
        "combined": ("  same, streams=combined (info)", Policy(streams="combined")),
    }
    runners: dict[str, Runner] = {"bash": _bash_true}
    for key, (_, policy) in variants.items():
        runners[key] = _engine_true(plain, policy)
    sandboxed = sandbox.availability(boxed)[0]
    if sandboxed:
        warm = workspaces.create(WorkspaceSpec(), boxed)
        runners["workspace"] = _engine_true(boxed, None, warm.id)
        runners["process"] = _engine_true(boxed, None)
        runners["strict"] = _engine_true(strict, None)
    _progress(
        f"`true`: {config.calls} calls x {len(runners)} variants "
        f"(warm-up {config.warmup}), blocks of {BLOCK}"
    )
    times = measure_interleaved(runners, config.calls, config.warmup)
    rows = []
    for key, (label, _) in variants.items():
        rows.append(_ratio_row(label, key, times[key], times["bash"], "run_call"))
    if not sandboxed:
        reason = sandbox.availability(boxed)[1]
        return [*rows, Row("`true` sandboxed", "-", "-", None, "-", f"skip ({reason})")]
    rows.append(_ratio_row(
        "`true` in a warm workspace vs unsandboxed run_call", "workspace",
        times["workspace"], times["default"], "a workspace",
    ))
    rows.append(_ratio_row(
        "`true` in a throwaway workspace (no session)", "process", times["process"],
        times["default"], "a throwaway workspace",
    ))
    strict_row = _ratio_row("  same, strict (info)", "strict", times["strict"],
                            times["default"], "strict")
    rows.append(dataclasses.replace(strict_row, target="-", status="info"))
    return rows


def _ratio_row(label: str, key: str, measured: list[float], base: list[float],
               what: str) -> Row:
    median, base_median = statistics.median(measured), statistics.median(base)
    ratio = median / base_median
    note = f"`true` {key}: {what} adds {(median - base_median) * 1e3:.3f} ms per call"
    return Row(label, _ms(measured), _ms(base), ratio, f"<= {TRUE_TARGET:.2f}x",
               _status(ratio <= TRUE_TARGET), note)


# ------------------------------------------------------------------------ workspaces

#: The target: a workspace ready for its first call within 20 ms (sandbox services
#: publish 110 ms and 440 ms medians for the same "time to interactive").
READY_TARGET_MS = 20.0
IDLE_WORKSPACES = 100


def workspace_rows(settings: Settings, config: Config) -> list[Row]:
    """A workspace made and ready (its keeper's view built), then its first `true`; and
    the memory of 100 idle workspaces."""
    boxed = settings.model_copy(update={"isolation": "process"})
    if not sandbox.availability(boxed)[0]:
        return [Row("workspace ready", "-", "-", None, "-", "skip (no sandbox)")]
    made: list[str] = []
    ready: list[float] = []
    first: list[float] = []
    spawn: list[float] = []
    try:
        count = max(20, config.calls // 5)
        _progress(f"workspaces: {count} made, each then runs its first `true`")
        for _ in range(count):
            start = time.perf_counter()
            record = workspaces.create(WorkspaceSpec(), boxed)
            ready.append(time.perf_counter() - start)
            made.append(record.id)
            _engine_true(boxed, None, record.id)()
            first.append(time.perf_counter() - start)
            spawn_start = time.perf_counter()
            subprocess.run(["bash", "-c", "true"], check=True)
            spawn.append(time.perf_counter() - spawn_start)
        rows = [
            Row("workspace ready for its first call", _ms(ready), "-", None,
                f"<= {READY_TARGET_MS:.0f} ms p50",
                _status(statistics.median(ready) * 1e3 <= READY_TARGET_MS)),
            Row("  made, then `true` answered (info)", _ms(first), _ms(spawn),
                statistics.median(first) / statistics.median(spawn), "-", "info"),
        ]
        for ws_id in made:
            workspaces.delete(ws_id, boxed)
        made = []
        _progress(f"{IDLE_WORKSPACES} idle workspaces: their keepers' memory")
        made = [workspaces.create(WorkspaceSpec(), boxed).id for _ in range(IDLE_WORKSPACES)]
        rows.append(_idle_row(boxed, made))
        return rows
    finally:
        for ws_id in made:
            workspaces.delete(ws_id, boxed)


def _idle_row(settings: Settings, made: list[str]) -> Row:
    pss = 0
    for ws_id in made:
        pid = workspaces.load(ws_id, settings).keeper_pid
        if pid is not None:
            pss += namespace_pss(pid)  # its holder and keeper, whichever run
    shell = psutil.Process(subprocess.Popen(["sleep", "5"]).pid)
    base = shell.memory_full_info().pss
    shell.kill()
    shell.wait()
    per = pss / len(made) / 2**20
    return Row(f"{len(made)} idle workspaces: memory per workspace", f"{per:.2f} MiB PSS",
               f"`sleep` {base / 2**20:.2f} MiB", None, "info", "info",
               f"{len(made)} keepers hold {pss / 2**20:.0f} MiB PSS in all (forks of one "
               "zygote: the pages they share are counted once)")


# ---------------------------------------------------------------------- 1 GiB output


class RssSampler:
    """Peak RSS of this process while the block runs, sampled from a thread."""

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self.before = 0
        self.peak = 0

    def _rss(self) -> int:
        return int(self._process.memory_info().rss)

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self.peak = max(self.peak, self._rss())

    def __enter__(self) -> RssSampler:
        self.before = self.peak = self._rss()
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())

    @property
    def growth(self) -> int:
        """Peak minus the RSS before the block, in bytes."""
        return self.peak - self.before


@dataclass(frozen=True)
class BigRun:
    """One run of the 1 GiB command."""

    wall_s: float
    rss_growth: int
    cpu_s: float
    """CPU seconds (user + system) this process spent, all threads."""


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _clear(directory: Path) -> None:
    if directory.is_dir():
        for path in directory.iterdir():
            path.unlink()


def _big_engine(settings: Settings) -> BigRun:
    call = Call(call_id=_call_id("gib"), command=BIG_COMMAND)
    os.sync()
    cpu = _self_cpu()
    with RssSampler() as rss:
        start = time.perf_counter()
        result = run_call(call, settings=settings)
        wall = time.perf_counter() - start
    cpu = _self_cpu() - cpu
    info = result.stdout_truncation
    _clear(settings.spill_dir)
    if result.exit_code != 0 or info is None:
        raise RuntimeError(f"1 GiB call failed: {result!r}")
    if (info.total_bytes, info.total_lines) != (GIB, BIG_LINES):
        raise RuntimeError(
            f"1 GiB call miscounted: {info.total_bytes} bytes, {info.total_lines} lines; "
            f"expected {GIB}, {BIG_LINES}"
        )
    return BigRun(wall, rss.growth, cpu)


def _big_bash(directory: Path) -> BigRun:
    target = directory / "redirect.out"
    command = f"{BIG_COMMAND} > {shlex.quote(str(target))}"
    os.sync()
    cpu = _self_cpu()
    with RssSampler() as rss:
        start = time.perf_counter()
        subprocess.run(["bash", "-c", command], check=True)
        wall = time.perf_counter() - start
    cpu = _self_cpu() - cpu
    size = target.stat().st_size
    target.unlink()
    if size != GIB:
        raise RuntimeError(f"redirect wrote {size} bytes, expected {GIB}")
    return BigRun(wall, rss.growth, cpu)


def big_rows(settings: Settings, work: Path, config: Config) -> list[Row]:
    """Rows 2 and 3, plus the engine's own CPU time as information."""
    free = shutil.disk_usage(work).free
    if free < 3 * GIB:
        reason = f"needs 3 GiB free in {work}, has {free / GIB:.1f}"
        return [Row("1 GiB output", "-", "-", None, "-", f"skip ({reason})")]
    if config.big_warmup:
        _progress("1 GiB: warm-up run (bash redirect, untimed)")
        _big_bash(work)
    engine: list[BigRun] = []
    bash: list[BigRun] = []
    for run_no in range(config.big_runs):
        _progress(f"1 GiB: run {run_no + 1}/{config.big_runs} (engine and redirect)")
        if run_no % 2 == 0:
            bash.append(_big_bash(work))
            engine.append(_big_engine(settings))
        else:
            engine.append(_big_engine(settings))
            bash.append(_big_bash(work))
    wall = statistics.median(r.wall_s for r in engine)
    base = statistics.median(r.wall_s for r in bash)
    runs = " ".join(f"{r.wall_s:.2f}" for r in engine)
    base_runs = " ".join(f"{r.wall_s:.2f}" for r in bash)
    note = f"1 GiB runs, s: run_call {runs} | redirect {base_runs}"
    label = f"1 GiB output wall time (median of {config.big_runs})"
    rss = max(r.rss_growth for r in engine) / MIB
    base_rss = max(r.rss_growth for r in bash) / MIB
    cpu = statistics.median(r.cpu_s for r in engine)
    base_cpu = statistics.median(r.cpu_s for r in bash)
    return [
        Row(
            label,
            f"{wall:.3f} s",
            f"{base:.3f} s",
            wall / base,
            f"<= {BIG_TARGET:.2f}x",
            _status(wall / base <= BIG_TARGET),
            note,
        ),
        Row(
            "1 GiB output peak RSS growth (max)",
            f"{rss:.1f} MiB",
            f"{base_rss:.1f} MiB",
            None,
            f"<= {RSS_TARGET_MIB:.0f} MiB",
            _status(rss <= RSS_TARGET_MIB),
        ),
        Row(
            "1 GiB output CPU of this process (info)",
            f"{cpu:.3f} s",
            f"{base_cpu:.3f} s",
            None,
            "-",
            "info",
        ),
    ]


# ------------------------------------------------------------------------ reporting


def _bash_version() -> str:
    done = subprocess.run(
        ["bash", "-c", "echo $BASH_VERSION"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "unknown"


def _filesystem(path: Path) -> str:
    best = None
    for part in psutil.disk_partitions(all=True):
        mount = part.mountpoint
        inside = str(path) == mount or str(path).startswith(mount.rstrip("/") + "/")
        if inside and (best is None or len(mount) > len(best.mountpoint)):
            best = part
    return f"{best.fstype} on {best.mountpoint}" if best else "unknown"


def environment_lines(work: Path, config: Config, quick: bool) -> list[str]:
    """Facts about the machine the numbers come from."""
    cpus = os.cpu_count()
    usable = len(os.sched_getaffinity(0))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    memory = psutil.virtual_memory()
    return [
        f"python   {platform.python_implementation()} {platform.python_version()} "
        f"({sys.executable})",
        f"system   {platform.platform()}",
        f"cpus     {cpus} ({usable} usable), load average {load}",
        f"memory   {memory.total / GIB:.1f} GiB total, {memory.available / GIB:.1f} GiB available",
        f"bash     {_bash_version()}",
        f"psutil   {psutil.__version__}",
        f"state    {work} ({_filesystem(work)})",
        f"mode     {'quick' if quick else 'full'}: {config.calls} `true` calls per variant "
        f"(warm-up {config.warmup}), {config.big_runs} x 1 GiB run(s) per side",
    ]


def render(rows: Sequence[Row]) -> str:
    """The table, columns aligned."""
    header = ("row", "measured", "baseline", "ratio", "target", "status")
    cells = [header] + [
        (
            r.name,
            r.measured,
            r.baseline,
            f"{r.ratio:.2f}x" if r.ratio is not None else "-",
            r.target,
            r.status,
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        for line in cells
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    lines += [f"  {r.note}" for r in rows if r.note]
    return "\n".join(line.rstrip() for line in lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(
        prog="bench.bench_engine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="few calls, one 1 GiB run")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where the temporary state directory goes (default: system temp)",
    )
    parser.add_argument("--calls", type=int, default=None, help="`true` calls per variant")
    parser.add_argument("--runs", type=int, default=None, help="1 GiB runs per side")
    args = parser.parse_args(argv)
    config = QUICK if args.quick else FULL
    config = Config(
        calls=args.calls or config.calls,
        warmup=config.warmup,
        big_runs=args.runs or config.big_runs,
        big_warmup=config.big_warmup,
    )
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="bashfleet-bench-", dir=args.dir)).resolve()
    try:
        settings = Settings(state_dir=work / "state", host="bench",
                            workspace_root=work / "workspaces")
        print("bashfleet engine benchmark")
        print("\n".join(environment_lines(work, config, args.quick)))
        found = sandbox.probe(settings.model_copy(update={"isolation": "auto"}))
        print(f"sandbox  bubblewrap {found.bwrap or '-'} ({found.problem or 'works'}), "
              f"cgroup {found.cgroup or '-'} ({found.cgroup_problem or 'per call'})")
        print(flush=True)
        rows = overhead_rows(settings, config)
        rows += workspace_rows(settings, config)
        rows += big_rows(settings, work, config)
    finally:
        sandbox.close_all()
        cleanup.end_hosts_under(work)
        shutil.rmtree(work, ignore_errors=True)
    print(render(rows))
    print(
        f"\n(total {time.monotonic() - started:.1f} s; ratio = measured / baseline, "
        "medians; the bench never fails on a miss)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
