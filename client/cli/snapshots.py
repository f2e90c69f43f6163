"""`bashfleet workspace snapshot|fork|restore` and `bashfleet snapshot ls|rm`.

    S=$(bashfleet workspace snapshot "$W")           # its files, frozen; W runs on
    bashfleet workspace fork "$W" -n 8               # 8 workspace ids, one a line
    W2=$(bashfleet workspace create --snapshot "$S")  # on any host
    bashfleet workspace restore "$W" "$S"            # W's files back (its processes end)
    bashfleet snapshot ls; bashfleet snapshot rm "$S"

Snapshots are `client.Workspace.snapshot` and friends; this module is only their words
for a person: ids on stdout, notices on stderr, `--json` for scripts.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bashfleet.worker.wire.models import Snapshot


def cmd_snapshot(args: argparse.Namespace) -> int:
    from bashfleet.client.cli.common import open_fleet, tag_filter  # noqa: PLC0415 - the CLI's own helpers

    made = open_fleet().open_workspace(args.workspace).snapshot(ttl_s=args.ttl,
                                                            tags=tag_filter(args.tag))
    if args.json:
        print(made.model_dump_json(indent=2))
        return 0
    paused = "" if made.paused_ms is None else f", its processes paused {made.paused_ms:.0f} ms"
    print(f"[snapshot {made.id} of {made.workspace} on {made.host}: {_size(made.bytes)}"
          f"{paused}; `bashfleet workspace create --snapshot {made.id}`, `bashfleet "
          f"workspace restore {made.workspace} {made.id}`, `bashfleet snapshot rm {made.id}`]",
          file=sys.stderr)
    print(made.id, flush=True)
    return 0


def cmd_fork(args: argparse.Namespace) -> int:
    from bashfleet.client.cli.common import open_fleet, tag_filter  # noqa: PLC0415

    forks = open_fleet().open_workspace(args.workspace).fork(
        args.n, ttl_s=args.ttl, tags=tag_filter(args.tag), host=args.host, label=args.label)
    if args.json:
        print("[" + ",\n".join(fork.view.model_dump_json(indent=2) for fork in forks) + "]")
        return 0
    print(f"[{len(forks)} fork(s) of {args.workspace} on {forks[0].host}, each with its files "
          f"at {forks[0].path} and no process running]", file=sys.stderr)
    for fork in forks:
        print(fork.id, flush=True)
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from bashfleet.client.cli.common import open_fleet  # noqa: PLC0415

    done = open_fleet().open_workspace(args.workspace).restore(args.snapshot)
    if args.json:
        print(done.model_dump_json(indent=2))
        return 0
    print(f"[workspace {done.workspace}: its files are snapshot {done.snapshot}'s again; "
          f"{done.ended} process(es) that ran in it were ended]", file=sys.stderr)
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from bashfleet.client.cli.common import open_fleet  # noqa: PLC0415

    found = open_fleet().snapshots()
    if args.json:
        print("[" + ",\n".join(snap.model_dump_json(indent=2) for snap in found) + "]")
        return 0
    print(snapshot_table(found, time.time()) if found else "no snapshots")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    """Delete each snapshot named; 1 when any was unknown (the others still go)."""
    from bashfleet.client.cli.common import open_fleet  # noqa: PLC0415

    fleet, status = open_fleet(), 0
    for snap_id in args.ids:
        if fleet.delete_snapshot(snap_id):
            print(f"[snapshot {snap_id} removed]", file=sys.stderr)
        else:
            print(f"bashfleet snapshot rm: no such snapshot: {snap_id}", file=sys.stderr)
            status = 1
    return status


def snapshot_table(found: list[Snapshot], now: float) -> str:
    """Snapshots as `snapshot ls` shows them."""
    from bashfleet.client.cli.common import table  # noqa: PLC0415
    from bashfleet.client.cli.workspaces import _duration  # noqa: PLC0415

    rows: list[list[object]] = [
        [snap.id, snap.host, snap.workspace, snap.base, _size(snap.bytes),
         f"in {_duration(max(0.0, snap.expires_at - now))}",
         " ".join(f"{k}={v}" for k, v in sorted(snap.tags.items())) or "-"]
        for snap in found
    ]
    return table(rows, ["ID", "HOST", "WORKSPACE", "BASE", "SIZE", "EXPIRES", "TAGS"])


def _size(count: int) -> str:
    from bashfleet.client.cli.workspaces import _size as size  # noqa: PLC0415

    return size(count)
