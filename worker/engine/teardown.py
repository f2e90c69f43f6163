"""Ending everything a host's state directory keeps running: its background jobs, its
workspaces (their keepers, so every process in them) and keepers no record names.

Workspaces and their jobs outlive the worker by design (a worker that restarts takes
them up again; a host's reaper ends them when their lease runs out). What ends a host
for good (`bashfleet down` of a local fleet, a test's or a benchmark's cleanup) calls
`end_host`, once the host's workers are stopped: nothing else would.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bashfleet.worker.engine import isolate, procs, workspaces
from bashfleet.worker.engine.jobs import jobs
from bashfleet.worker.engine.workspaces import lifecycle
from bashfleet.worker.settings import Settings


@dataclass(frozen=True)
class Ended:
    """What `end_host` ended."""

    jobs: int
    workspaces: int
    keepers: int
    """Keepers (or zygotes) no record named, ended by pid."""


def end_host(settings: Settings) -> Ended:
    """End the host's running jobs, delete its workspaces (and finish the deletions its
    workers left half done), and kill the keepers left without a record (a worker
    killed between starting one and saving its record, a blank one made ahead by a
    worker that died)."""
    ended_jobs = 0
    for record in jobs.local_records(settings):
        if jobs.is_running(record):
            leader = procs.is_same_process(record.pid, record.start_time)
            procs.terminate(record.pgid if leader else None, record.marker, grace_s=0.5)
            ended_jobs += 1
    records = workspaces.local_records(settings)
    for workspace in records:
        workspaces.delete(workspace.id, settings)
    # Deletions its workers began (`rm` answered, the rest behind) and did not finish,
    # and those whose cgroup was still held a moment ago.
    finished = workspaces.finish_endings(settings)
    workspaces.remove_held_groups(settings, timeout=lifecycle.CGROUP_GONE_S)
    ended_workspaces = len({r.id for r in records} | {r.id for r in finished})
    workspaces.reap_blanks(settings, wait=True)
    strays = keepers_under(settings.workspaces_dir)
    for pid in strays:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # pid 1 of its namespaces: they end with it
    return Ended(jobs=ended_jobs, workspaces=ended_workspaces, keepers=len(strays))


def end_hosts_under(
    root: Path, workspace_root: Callable[[Path], Path | None] = lambda _: None,
) -> int:
    """`end_host` for every host state directory under `root` (those holding a
    `workspace-state` directory), `workspace_root` giving each one's workspace root
    (None: its default); how many workspaces and stray keepers were ended. For what is
    gone for good with its workers: a benchmark's or a test's temporary hosts (a worker
    it killed leaves its workspaces' records, cgroups and keepers to a reaper that never
    comes)."""
    ended = 0
    for folder, dirs, _ in os.walk(root):
        if "workspace-state" in dirs:
            state_dir = Path(folder)
            done = end_host(Settings(state_dir=state_dir,
                                     workspace_root=workspace_root(state_dir)))
            ended += done.workspaces + done.keepers
            dirs.remove("workspace-state")
    return ended


def keepers_under(directory: Path) -> list[int]:
    """Live keepers, holders (and zygotes) of a host's workspace state `directory`: those holding
    a socket bound there (each keeper's listening socket is `<directory>/<id>.sock`,
    bound by the worker in the host's network namespace, so /proc/net/unix names it
    whatever namespace the keeper moved to), or whose mounts come from there (its /tmp,
    /var/tmp and HOME)."""
    prefix = f"{directory.resolve()}/"
    bound = _unix_sockets_under(prefix)
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if not isolate.is_keeper(Path(f"/proc/{name}/cmdline").read_bytes()):
                continue
            if _holds_socket(int(name), bound) or f" {prefix}" in Path(
                    f"/proc/{name}/mountinfo").read_text("utf-8", "replace"):
                found.append(int(name))
    return found


def _unix_sockets_under(prefix: str) -> set[str]:
    """The inodes of the Unix sockets bound under `prefix` (this network namespace's)."""
    inodes = set()
    with contextlib.suppress(OSError), open("/proc/net/unix", encoding="utf-8",
                                            errors="replace") as table:
        next(table, None)
        for line in table:
            fields = line.split()
            if len(fields) >= 8 and fields[7].startswith(prefix):
                inodes.add(fields[6])
    return inodes


def _holds_socket(pid: int, inodes: set[str]) -> bool:
    if not inodes:
        return False
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return True
    return False


def main(argv: list[str] | None = None) -> int:
    """`python -m bashfleet.worker.engine.teardown STATE_DIR...`: `end_host` for each host state
    directory (what `bashfleet down` runs once the local fleet's workers stopped)."""
    parser = argparse.ArgumentParser(prog="python -m bashfleet.worker.engine.teardown",
                                     description=main.__doc__)
    parser.add_argument("state_dirs", nargs="+", metavar="STATE_DIR",
                        help="a host's state directory (BASHFLEET_STATE_DIR)")
    args = parser.parse_args(argv)
    for state_dir in args.state_dirs:
        ended = end_host(Settings(state_dir=Path(state_dir)))
        if ended.jobs or ended.workspaces or ended.keepers:
            print(f"ended    {ended.workspaces} workspace(s), {ended.jobs} job(s) and "
                  f"{ended.keepers} stray keeper(s) of {state_dir}", file=sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
