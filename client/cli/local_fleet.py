"""`up` and `down` (a local fleet) and the commands that run a build machine's
own side (`worker`, `gc`, ...), each that module's own entry point.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Sequence

from bashfleet.client.cli import common
from bashfleet.client.cli.arguments import WORKER_SIDE
from bashfleet.client.exit_status import USAGE as EXIT_USAGE

# ---------------------------------------------------------------- up, down, worker


def cmd_up(args: argparse.Namespace) -> int:
    from bashfleet.client import local  # noqa: PLC0415

    hosts = tuple(h.strip() for h in args.hosts.split(",") if h.strip())
    options = local.UpOptions(
        hosts=hosts, concurrency=args.concurrency, flower=args.flower,
        flower_port=args.flower_port, labels=tuple(args.label or ()),
    )
    try:
        up = local.start(options)  # a running fleet is joined, never stopped
    except local.UpError as exc:
        print(f"bashfleet up: {exc}", file=sys.stderr)
        return 1
    if not _wait_hosts(hosts, timeout=60.0):
        print("bashfleet up: workers did not come up; logs in "
              f"{local.fleet_dir() / 'logs'}", file=sys.stderr)
        local.stop(log=lambda _: None, only=up.started)
        return 1
    for warning in local.unsandboxed_warnings(common.open_fleet().hosts(), hosts):
        print(f"bashfleet up: {warning}", file=sys.stderr)
    print(f"fleet up: {', '.join(up.state.hosts)}. Try: bashfleet run 'uname -a'. "
          "Stop: bashfleet down")
    if up.state.flower_url:
        # The password stays in the file (mode 0600): never printed.
        print(f"Flower: {up.state.flower_url} (user {up.state.flower_user}; its password is "
              f"`flower_password` in {local.state_path()})")
    if args.detach or not up.started:
        return 0
    print("(Ctrl-C stops the fleet)" if not up.joined else
          "(Ctrl-C stops the hosts this command added)")
    try:
        while any(local.is_alive(p) for p in up.started if p.role == "worker"):
            time.sleep(1.0)  # idle in the foreground until Ctrl-C
        print("bashfleet up: a worker exited; stopping the fleet", file=sys.stderr)
    except KeyboardInterrupt:
        pass
    local.stop(only=up.started if up.joined else None)
    return 0


def _wait_hosts(hosts: Sequence[str], timeout: float) -> bool:
    fleet = common.open_fleet()
    deadline = time.monotonic() + timeout
    delay = 0.05
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            alive = {h.host for h in fleet.hosts() if h.alive}
            if set(hosts) <= alive:
                return True
        time.sleep(delay)  # waiting for worker processes to register
        delay = min(delay * 2, 0.5)
    return False


def cmd_down(args: argparse.Namespace) -> int:
    del args
    from bashfleet.client import local  # noqa: PLC0415

    local.stop()
    return 0


def exec_worker_side(command: str, argv: Sequence[str]) -> int:
    """Become `python -m MODULE ARGV`: a command of the build machine's own side.

    `worker` and `gc` run the worker's code on this machine, which the client never
    imports (`bashfleet.worker.fleet`, the engine): the process is replaced, so its pid, its
    signals and its exit status are the command's own.
    """
    module = WORKER_SIDE[command][0]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", module, *argv])  # noqa: S606 - no shell
    return EXIT_USAGE  # pragma: no cover - execv does not return
