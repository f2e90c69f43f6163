"""Jobs and hosts: `check`, `kill`, `output`, `ps`, `wait`, `events` and `hosts`.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bashfleet.client import exit_status as statuses
from bashfleet.client.cli import common
from bashfleet.client.exit_status import TIMEOUT as EXIT_TIMEOUT
from bashfleet.worker.wire.models import (
    CheckResult,
    HostInfo,
)

if TYPE_CHECKING:
    from bashfleet.worker.wire.events import JobEvent


# ----------------------------------------------------------------------- check, kill


def print_check(check: CheckResult) -> None:
    if check.output:
        sys.stdout.write(check.output if check.output.endswith("\n") else check.output + "\n")
    if check.stderr_output:
        sys.stderr.write(check.stderr_output)
    if check.running:
        state = "running"
    elif check.signal is not None:
        state = f"killed by signal {check.signal}"
    else:
        state = f"exited with code {check.exit_code}"
    print(f"[job {check.id} on {check.host}: {state}; output: {check.output_path}]",
          file=sys.stderr)
    if check.note:
        print(f"[{check.note}]", file=sys.stderr)


def cmd_check(args: argparse.Namespace) -> int:
    check = common.open_fleet().check(args.id, grep=args.grep)
    if args.json:
        print(check.model_dump_json(indent=2))
    else:
        print_check(check)
    return 0


def cmd_kill(args: argparse.Namespace) -> int:
    check = common.open_fleet().kill(args.id)
    if args.json:
        print(check.model_dump_json(indent=2))
    else:
        print_check(check)
    return 0


def cmd_output(args: argparse.Namespace) -> int:
    chunk = common.open_fleet().read_output(args.id, offset=args.offset, limit=args.limit,
                                            grep=args.grep, stream=args.stream)
    sys.stdout.write(chunk.text)
    if not chunk.eof:
        print(
            f"[bytes {chunk.offset}-{chunk.next_offset} of {chunk.size}; "
            f"next: bashfleet output {args.id} --offset {chunk.next_offset}"
            f"{' --stream stderr' if args.stream == 'stderr' else ''}]",
            file=sys.stderr,
        )
    return 0


def _exit_column(exit_code: object, signal_number: object) -> object:
    """`ps`'s EXIT: the exit code, or the signal that ended the job (`SIGTERM`)."""
    if exit_code is None and isinstance(signal_number, int):
        try:
            return signal.Signals(signal_number).name
        except ValueError:
            return f"signal {signal_number}"
    return common.blank(exit_code)


def cmd_ps(args: argparse.Namespace) -> int:
    jobs = common.open_fleet().jobs(
        host=args.host, all_owners=args.all, tags=common.tag_filter(args.tag), owner=args.owner
    )
    if args.json:
        common.print_json([common.dump(job) for job in jobs])
        return 0
    rows = []
    for job in jobs:
        data = common.dump(job)
        state = data.get("state") or ("running" if data.get("running") else "ended")
        rows.append(
            [data.get("id"), data.get("host"), data.get("pid"), state,
             _exit_column(data.get("exit_code"), data.get("signal")),
             str(data.get("command", ""))[:60]]
        )
    header = ["ID", "HOST", "PID", "STATE", "EXIT", "COMMAND"]
    print(common.table(rows, header) if rows else "no jobs")
    return 0


def isolation_text(sandbox: dict[str, Any] | None) -> str:
    """A host's isolation in a few words: `process, cgroup v1`; `NONE` when its calls
    run unsandboxed (the reason goes under the table); `?` for a worker that does not say."""
    if not sandbox:
        return "?"
    level = sandbox.get("isolation") or "?"
    parts = ["NONE" if level == "none" else level]
    # Without a cgroup a workspace's limits are per process (ulimit): said, not implied.
    parts.append(f"cgroup {sandbox['cgroup']}" if sandbox.get("cgroup")
                 else "no cgroup (ulimit)")
    if level != "none" and sandbox.get("tenancy") == "multi":
        # Ids another worker of the machine may also hand out are not a tenant's alone.
        parts.append("ids per workspace" + (" (NOT machine-wide)" if sandbox.get("id_problem")
                                            else ""))
    elif level != "none":
        # Every workspace of the host runs as one uid: one tenant's processes, files and
        # keyring are another's to reach (docs/security.md).
        parts.append("single-tenant: one uid for every workspace")
    if sandbox.get("run_as") and sandbox.get("tenancy") != "multi":
        parts.append(f"as {sandbox['run_as']}")
    if sandbox.get("network"):
        parts.append(f"network {sandbox['network']}"
                     + (" (host allowed)" if sandbox.get("network_host") else ""))
    if sandbox.get("seccomp"):
        parts.append(f"seccomp {sandbox['seccomp']}")
    if sandbox.get("layers"):
        parts.append({"overlay": "own / over the host read-only"}.get(
            sandbox["layers"], str(sandbox["layers"])))
    return ", ".join(parts)


# --------------------------------------------------------------------- wait, events


def _ending(exit_code: int | None, signal: int | None) -> str:
    if exit_code is not None:
        return f"exited with code {exit_code}"
    if signal is not None:
        return f"killed by signal {signal}"
    return "ended, exit status unknown"


def cmd_wait(args: argparse.Namespace) -> int:
    from bashfleet.client.errors import WaitTimeout  # noqa: PLC0415

    try:
        view = common.open_fleet().wait(args.id, timeout=args.timeout)
    except WaitTimeout as exc:
        print(f"bashfleet wait: {exc}", file=sys.stderr)
        return EXIT_TIMEOUT
    if args.json:
        print(view.model_dump_json(indent=2))
    else:
        took = f" after {view.ended_at - view.started_at:.1f}s" if view.ended_at else ""
        print(f"[job {view.id} on {view.host}: {_ending(view.exit_code, view.signal)}{took}; "
              f"output: {view.output_path}]", file=sys.stderr)
    return statuses.of_process(view.exit_code, view.signal)


def event_line(event: JobEvent) -> str:
    """One job event as `bashfleet events` prints it for a person."""
    at = time.strftime("%H:%M:%S", time.localtime(event.at))
    tags = " ".join(f"{k}={v}" for k, v in sorted(event.tags.items()))
    if event.kind == "denied":
        return f"{at} denied   {event.target} in workspace {event.job_id} on {event.host}"
    if event.kind == "started":
        what = f"started  {event.job_id} on {event.host}"
    else:
        what = (f"ended    {event.job_id} on {event.host}: "
                f"{_ending(event.exit_code, event.signal)} after {event.duration_s or 0:.1f}s")
    command = event.command if len(event.command) <= 60 else event.command[:57] + "..."
    return f"{at} {what}  [{command}]" + (f"  {tags}" if tags else "") + \
        f"  output: {event.output_path}"


def cmd_events(args: argparse.Namespace) -> int:
    kinds = tuple(args.kind or ())
    stream = common.open_fleet().events(host=args.host, kinds=kinds,
                                        tags=common.tag_filter(args.tag),
                                        since="0-0" if args.since == "all" else args.since)
    for count, event in enumerate(stream, start=1):
        print(event.model_dump_json() if args.json else event_line(event), flush=True)
        if args.count is not None and count >= args.count:
            break
    return 0


#: A dead host not heard from for this long is left out of `bashfleet hosts` (`--all`
#: lists it until its record expires, a day after its last heartbeat): a fleet stopped
#: long ago is not one a person is looking for.
DEAD_HOST_SHOWN_S = 3600.0


def shown_hosts(hosts: Sequence[HostInfo], now: float, *, all_hosts: bool) -> list[HostInfo]:
    """The hosts `bashfleet hosts` lists: live ones, and dead ones heard from within
    DEAD_HOST_SHOWN_S (all of them with `all_hosts`)."""
    return [
        host for host in hosts
        if all_hosts or host.alive or now - (host.heartbeat_at or 0.0) <= DEAD_HOST_SHOWN_S
    ]


def host_alive(hosts: Sequence[HostInfo], host: str) -> int:
    """0 when `host`'s record (signed by the fleet, verified) says its worker is live,
    else 1 saying why: a container's healthcheck asks about its own worker, never
    whether Redis answers for some host."""
    found = next((info for info in hosts if info.host == host), None)
    if found is None:
        print(f"host {host}: no worker record", file=sys.stderr)
        return 1
    if not found.alive:
        print(f"host {host}: its worker's heartbeat expired", file=sys.stderr)
        return 1
    print(f"host {host}: alive")
    return 0


def cmd_hosts(args: argparse.Namespace) -> int:
    fleet = common.open_fleet()
    known = fleet.hosts()
    if args.alive is not None:
        return host_alive(known, args.alive or os.environ.get("BASHFLEET_HOST")
                          or socket.gethostname())
    hosts = shown_hosts(known, time.time(), all_hosts=args.all)
    if len(hosts) < len(known):
        hidden = len(known) - len(hosts)
        print(f"[{hidden} host(s) dead for more than {DEAD_HOST_SHOWN_S / 3600:g} h not "
              "shown: --all lists them]", file=sys.stderr)
    if args.json:
        common.print_json([common.dump(host) for host in hosts])
        return 0
    rows = []
    for host in hosts:
        data = common.dump(host)
        rows.append(
            [data.get("host"), "alive" if data.get("alive") else "dead",
             f"{data.get('busy', 0)}/{data.get('slots', 0)}", data.get("queued", 0),
             ",".join(data.get("labels") or []) or "-", isolation_text(data.get("sandbox"))]
        )
    if not rows:
        print("no hosts")
        return 0
    print(common.table(rows, ["HOST", "STATE", "BUSY/SLOTS", "QUEUED", "LABELS", "ISOLATION"]))
    for host in hosts:
        sandbox = common.dump(host).get("sandbox") or {}
        network_problem = sandbox.get("network_problem")
        for problem in (sandbox.get("problem"), sandbox.get("cgroup_problem"),
                        sandbox.get("id_problem"),
                        network_problem and f"no egress for workspaces: {network_problem}"):
            if problem and host.alive:
                print(f"{host.host}: {problem}", file=sys.stderr)
    # Calls for any host (or any of a pool) wait in queues no row above counts.
    shared = fleet.shared_queues()
    print("queued for any host: " + ", ".join(
        f"{name.removeprefix('bashfleet.').removesuffix('.exec')} {count}"
        for name, count in shared.items()
    ))
    return 0
