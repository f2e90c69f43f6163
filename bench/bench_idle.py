"""Idle workspaces' memory: sleeping workspaces (a holder as pid 1) against awake ones
(a Python keeper) and podman's idle containers, measured in the same run.

    python -m bench.bench_idle [--quick] [--dir D] [--count N] [--many N] [--rounds N]

Starts the tests' registry on 127.0.0.1 with their Debian image, then:

1. `count` (50) image workspaces, each having run `true`, idle: the PSS of every process
   in each workspace's PID namespace (all a workspace adds to the host's processes;
   network `none`, so no helper outside it), with `keeper_idle_s` 0 (keepers awake)
   and 0.5 (asleep: measured once every one sleeps). Target: <= 0.5 MiB asleep.
2. podman: `count` containers of the same image, `podman run -d --init --network none
   REF sleep infinity`: the PSS of conmon and catatonit (the container's pid 1) per
   container, the `sleep` they run left out (a workspace runs nothing when idle).
3. `many` (1,000) workspaces, awake then asleep: the same, and asleep the host's memory
   used before and after, per workspace (everything: the kernel's namespaces, mounts and
   cgroups too), and the kernel's unreclaimable part of it.
4. The worker's standing memory beside it: this process (the engine, in process) and
   its zygote (bubblewrap and the Python zygote), PSS.
5. The first `true` after a workspace slept (the wake: a fork of the zygote set into its
   namespaces) against a warm `true`, `rounds` alternating rounds, p50.

Not a test: it never fails on a miss. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import psutil

from bashfleet.worker import Call, run_call
from bashfleet.worker.engine import holder, isolate, sandbox, workspaces
from bashfleet.worker.engine.images import images
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import WorkspaceRecord, WorkspaceSpec
from bench.bench_cli import ULIMITS, Podman

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
# The tests' registry and images: the one way to serve a registry on this machine.
from integration.registry import pushed_images, running_registry

MIB = 1 << 20
TARGET_MIB = 0.5
IDLE_S = 0.5
Row = tuple[str, str, str, str, str]


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _pss(pid: int) -> int:
    """A process's PSS in bytes (smaps_rollup); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
            for line in handle:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _namespaces() -> dict[str, list[int]]:
    """PID namespace -> host pids of its processes, for every process on the host."""
    found: dict[str, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                found.setdefault(os.readlink(f"/proc/{name}/ns/pid"), []).append(int(name))
    return found


def namespace_pss(pid: int) -> int:
    """PSS in bytes of every process in the PID namespace of `pid` (a workspace's pid 1:
    its keeper, or its holder and a keeper beside it, and what its calls left)."""
    try:
        ns = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return 0
    return sum(_pss(member) for member in _namespaces().get(ns, []))


def _workspace_pids(records: Sequence[WorkspaceRecord]) -> list[list[int]]:
    spaces = _namespaces()
    out: list[list[int]] = []
    for record in records:
        try:
            ns = os.readlink(f"/proc/{record.keeper_pid}/ns/pid")
        except OSError:
            out.append([])
            continue
        out.append(spaces.get(ns, []))
    return out


def _asleep(records: Sequence[WorkspaceRecord]) -> bool:
    for pids in _workspace_pids(records):
        if len(pids) != 1:
            return False
        with contextlib.suppress(OSError):
            if not os.path.basename(os.readlink(f"/proc/{pids[0]}/exe")).startswith("holder-"):
                return False
    return True


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _true(settings: Settings, ws_id: str) -> float:
    start = time.perf_counter()
    result = run_call(Call(call_id=f"b{uuid.uuid4().hex[:15]}", workspace=ws_id,
                           command="true"), settings=settings)
    took = time.perf_counter() - start
    if result.exit_code != 0:
        raise RuntimeError(f"`true` failed in {ws_id}: {result.error}")
    return took


@contextlib.contextmanager
def _idle_workspaces(settings: Settings, ref: str, count: int) -> Iterator[list[WorkspaceRecord]]:
    made: list[WorkspaceRecord] = []
    try:
        for index in range(count):
            record = workspaces.create(WorkspaceSpec(image=ref, network="none"), settings)
            made.append(record)
            _true(settings, record.id)
            if index and index % 100 == 0:
                _say(f"  {index} made")
        yield made
    finally:
        for record in made:
            with contextlib.suppress(Exception):
                workspaces.delete(record.id, settings)


def _per_workspace(records: Sequence[WorkspaceRecord]) -> float:
    total = sum(_pss(pid) for pids in _workspace_pids(records) for pid in pids)
    return total / len(records) / MIB


def workspace_rows(awake: Settings, sleepy: Settings, ref: str, count: int
                   ) -> tuple[list[Row], float]:
    """Rows 1: `count` workspaces awake, then asleep."""
    _say(f"{count} idle image workspaces, keepers awake")
    with _idle_workspaces(awake, ref, count) as made:
        time.sleep(1.0)
        awake_mib = _per_workspace(made)
    _say(f"{count} idle image workspaces, asleep")
    with _idle_workspaces(sleepy, ref, count) as made:
        _wait(lambda: _asleep(made), "every workspace to sleep")
        asleep_mib = _per_workspace(made)
    rows = [
        (f"{count} idle workspaces, keepers awake: PSS per workspace", f"{awake_mib:.2f} MiB",
         "-", "-", "info"),
        (f"{count} idle workspaces, asleep (holder): PSS per workspace",
         f"{asleep_mib:.3f} MiB", f"awake {awake_mib:.2f} MiB", f"<= {TARGET_MIB} MiB",
         "ok" if asleep_mib <= TARGET_MIB else "MISS"),
    ]
    return rows, asleep_mib


def podman_row(podman: Podman, ref: str, count: int, asleep_mib: float) -> Row:
    """Row 2: `count` idle podman containers."""
    _say(f"{count} idle podman containers")
    names = [f"bench-idle-{index}" for index in range(count)]
    for name in names:
        podman("run", "--detach", "--init", "--name", name, "--network", "none", *ULIMITS,
               ref, "sleep", "infinity")
    time.sleep(1.0)
    total = 0
    for name in names:
        conmon, pid1 = (int(part) for part in podman(
            "inspect", "--format", "{{.State.ConmonPid}} {{.State.Pid}}", name).split())
        total += _pss(conmon) + _pss(pid1)
    per = total / count / MIB
    return (f"{count} idle podman containers: conmon + catatonit PSS per container",
            f"{per:.3f} MiB", f"bashfleet asleep {asleep_mib:.3f} MiB",
            f"ratio {asleep_mib / per:.2f}x", "info")


def many_rows(awake: Settings, sleepy: Settings, ref: str, many: int) -> list[Row]:
    """Row 3: `many` workspaces awake, then asleep, and row 4 beside them."""
    _say(f"{many} idle image workspaces, keepers awake")
    with _idle_workspaces(awake, ref, many) as made:
        time.sleep(1.0)
        awake_mib = _per_workspace(made)
    _say(f"{many} idle image workspaces, asleep")
    before = _host_memory()
    with _idle_workspaces(sleepy, ref, many) as made:
        _wait(lambda: _asleep(made), "every workspace to sleep")
        per = _per_workspace(made)
        after = _host_memory()
        worker = _worker_memory()
    used, kernel = ((after[i] - before[i]) / many / MIB for i in range(2))
    return [
        (f"{many} idle workspaces, asleep: PSS per workspace", f"{per:.3f} MiB",
         f"awake {awake_mib:.2f} MiB", f"<= {TARGET_MIB} MiB",
         "ok" if per <= TARGET_MIB else "MISS"),
        ("  the host's memory used (MemTotal - MemAvailable), per workspace",
         f"{used:.2f} MiB", "-", "-", "info (a shared host: noisy)"),
        ("  of it the kernel's (slab unreclaimable, page tables, stacks)", f"{kernel:.2f} MiB",
         "-", "-", "info"),
        ("  the worker beside them: engine process + zygote PSS", worker, "-", "-", "info"),
    ]


def _host_memory() -> tuple[int, int]:
    """(MemTotal - MemAvailable, SUnreclaim + PageTables + KernelStack), bytes."""
    fields: dict[bytes, int] = {}
    with open("/proc/meminfo", "rb") as handle:
        for line in handle:
            name, _, rest = line.partition(b":")
            fields[name] = int(rest.split()[0]) * 1024
    kernel = fields[b"SUnreclaim"] + fields[b"PageTables"] + fields[b"KernelStack"]
    return fields[b"MemTotal"] - fields[b"MemAvailable"], kernel


def _worker_memory() -> str:
    me = psutil.Process()
    zygote = 0
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if isolate.runs(b"\0".join(arg.encode() for arg in child.cmdline()), "launcher") \
                    or child.name() == "bwrap":
                zygote += _pss(child.pid)
    return f"{_pss(me.pid) / MIB:.1f} MiB + {zygote / MIB:.1f} MiB"


def wake_row(sleepy: Settings, ref: str, rounds: int) -> Row:
    """Row 5: the first `true` after sleep against a warm one."""
    _say(f"first `true` after sleep vs warm, {rounds} rounds")
    woken: list[float] = []
    warm: list[float] = []
    with _idle_workspaces(sleepy, ref, 1) as made:
        for _ in range(rounds):
            _wait(lambda: _asleep(made), "the workspace to sleep")
            woken.append(_true(sleepy, made[0].id))
            warm.append(_true(sleepy, made[0].id))
    wake_ms, warm_ms = statistics.median(woken) * 1e3, statistics.median(warm) * 1e3
    return ("first `true` after sleep (p50)", f"{wake_ms:.1f} ms", f"warm {warm_ms:.1f} ms",
            f"+{wake_ms - warm_ms:.1f} ms", "info")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.bench_idle", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 and 100 workspaces")
    parser.add_argument("--dir", type=Path, default=None, help="where its state goes")
    parser.add_argument("--count", type=int, default=None, help="default 50 (--quick 10)")
    parser.add_argument("--many", type=int, default=None, help="default 1000 (--quick 100)")
    parser.add_argument("--rounds", type=int, default=None, help="default 20 (--quick 5)")
    args = parser.parse_args(argv)
    count = args.count or (10 if args.quick else 50)
    many = args.many or (100 if args.quick else 1000)
    rounds = args.rounds or (5 if args.quick else 20)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-idle-") as folder:
        base = Path(folder)
        with running_registry(base / "registry") as registry:
            ref = pushed_images(registry)["debian"]
            awake = Settings(state_dir=base / "state", host="bench-idle",
                             workspace_root=base / "workspaces",
                             registry_auth_file=registry.auth_file,
                             registry_certs_dir=registry.certs_dir, workspace_pool=0,
                             keeper_idle_s=0)
            sleepy = awake.model_copy(update={"keeper_idle_s": IDLE_S})
            path, problem = holder.find(sleepy)
            if path is None or sandbox.host_ids(awake) is None:
                _say(f"nothing to measure here: {problem or 'no host ids for workspaces'}")
                return 1
            try:
                images.ensure(ref, awake)
                rows, asleep_mib = workspace_rows(awake, sleepy, ref, count)
                podman = Podman(base / "podman", registry)
                try:
                    podman.pull(ref)
                    rows.append(podman_row(podman, ref, count, asleep_mib))
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    _say(f"podman cannot run here ({exc}): its row is left out")
                finally:
                    podman.close()
                rows += many_rows(awake, sleepy, ref, many)
                rows.append(wake_row(sleepy, ref, rounds))
            finally:
                for record in workspaces.local_records(awake):
                    workspaces.delete(record.id, awake)
                sandbox.close_all()
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
