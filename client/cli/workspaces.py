"""`bashfleet workspace create|ls|info|renew|rm` and `bashfleet cp`: workspaces from a shell.

    W=$(bashfleet workspace create --label linux --ttl 7200)
    bashfleet cp ./src "$W:src"                 # a directory's contents, or one file
    bashfleet run --workspace "$W" 'cd src && make test'
    bashfleet cp "$W:src/build" ./build
    bashfleet workspace rm "$W"

A workspace is `client.Workspace` (see `client/_async/workspace.py`); this module is only
its words for a person: ids on stdout, notices on stderr, `--json` for scripts.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bashfleet.client.cli.arguments import LIMIT_NAMES

if TYPE_CHECKING:
    from bashfleet.client import Fleet, Workspace
    from bashfleet.worker.wire.models import WorkspaceView

# ----------------------------------------------------------------------- commands


def cmd_create(args: argparse.Namespace) -> int:
    from bashfleet.client.cli.common import open_fleet, tag_filter  # noqa: PLC0415 - the CLI's own helpers

    workspace = open_fleet().workspace(
        host=args.host, label=args.label, path=args.path, ttl_s=args.ttl,
        isolation=args.isolation, network=args.network, limits=_limits(args.limit),
        mounts=_pairs(args.mount, "--mount", "VIEW=SUBDIR"), tags=tag_filter(args.tag),
        image=args.image, build=args.build, user=args.user,
        snapshot=getattr(args, "snapshot", None), build_network=args.build_network,
    )
    view = workspace.view
    if args.json:
        print(view.model_dump_json(indent=2))
        return 0
    made_of = f", from {view.image}" if view.image else ""
    made_of += f", from snapshot {view.snapshot}" if view.snapshot else ""
    print(f"[workspace {view.id} on {view.host}{made_of}: {view.path}, {view.isolation} isolation, "
          f"lives {_duration(view.ttl_s)} unused; `bashfleet run --workspace {view.id} CMD`, "
          f"`bashfleet cp ./dir {view.id}:dir`, `bashfleet workspace rm {view.id}`]",
          file=sys.stderr)
    print(view.id, flush=True)
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from bashfleet.client.cli.common import open_fleet  # noqa: PLC0415

    fleet = open_fleet()
    views = fleet.workspaces()
    if args.mcp:
        seen = {view.id for view in views}
        views += [view for view in fleet.agent_workspaces() if view.id not in seen]
    if args.json:
        print("[" + ",\n".join(view.model_dump_json(indent=2) for view in views) + "]")
        return 0
    table = workspace_table(views, time.time(), owners=args.mcp)
    print(table if views else "no workspaces")
    return 0


def cmd_network(args: argparse.Namespace) -> int:
    from bashfleet.client.cli.common import open_fleet  # noqa: PLC0415
    from bashfleet.client.errors import UnknownWorkspace  # noqa: PLC0415

    try:
        view = open_fleet().open_workspace(args.id).set_network(args.policy)
    except UnknownWorkspace as exc:
        print(f"bashfleet workspace network: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(view.model_dump_json(indent=2))
    else:
        print(f"[workspace {view.id}: network {view.network}]", file=sys.stderr)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    return _each(args, lambda workspace: workspace.info())


def cmd_renew(args: argparse.Namespace) -> int:
    return _each(args, lambda workspace: workspace.renew())


def cmd_rm(args: argparse.Namespace) -> int:
    """Remove each workspace named; 1 when any was unknown (the others still go)."""
    from bashfleet.client.cli.common import open_fleet  # noqa: PLC0415
    from bashfleet.client.errors import UnknownWorkspace  # noqa: PLC0415

    fleet, status = open_fleet(), 0
    for ws_id in args.ids:
        try:
            gone = _open_for_removal(fleet, ws_id).delete()
        except UnknownWorkspace as exc:
            print(f"bashfleet workspace rm: {exc}", file=sys.stderr)
            status = 1
            continue
        print(f"[workspace {ws_id} {'removed' if gone else 'was gone already'}]",
              file=sys.stderr)
    return status


def _open_for_removal(fleet: Fleet, ws_id: str) -> Workspace:
    """A workspace of this owner's, else one of the MCP servers it started (opened by a
    client of its session's owner: without the admin key, this owner's cannot)."""
    from bashfleet.client.errors import UnknownWorkspace  # noqa: PLC0415
    from bashfleet.client.fleet import Fleet  # noqa: PLC0415

    try:
        return fleet.open_workspace(ws_id)
    except UnknownWorkspace:
        view = next((v for v in fleet.agent_workspaces() if v.id == ws_id), None)
        if view is None:
            raise
    return Fleet(owner=view.owner).open_workspace(ws_id)


def _each(args: argparse.Namespace, act: Any) -> int:
    """`info`/`renew`: act on each workspace named, print what its host says; 1 when any
    was unknown."""
    from bashfleet.client.cli.common import open_fleet  # noqa: PLC0415
    from bashfleet.client.errors import UnknownWorkspace  # noqa: PLC0415

    fleet, status, views = open_fleet(), 0, []
    for ws_id in args.ids:
        try:
            views.append(act(fleet.open_workspace(ws_id)))
        except UnknownWorkspace as exc:
            print(f"bashfleet workspace {args.verb}: {exc}", file=sys.stderr)
            status = 1
    if args.json:
        print("[" + ",\n".join(view.model_dump_json(indent=2) for view in views) + "]")
    elif views:
        print(workspace_table(views, time.time(), counted=args.verb == "info"))
    return status


# ---------------------------------------------------------------------------- cp


@dataclass(frozen=True)
class Place:
    """One side of `cp`: a local path, or a path in a workspace."""

    path: str
    workspace: str | None = None


def parse_place(text: str) -> Place:
    """`W:PATH` names a workspace's path (W a workspace id); anything else is local
    (`./w123:x` stays local, as scp has it for a path with a slash before the colon)."""
    head, colon, tail = text.partition(":")
    if colon and "/" not in head and _is_workspace_id(head):
        return Place(tail or ".", head)
    return Place(text)


def _is_workspace_id(text: str) -> bool:
    from bashfleet.worker.wire.models import WORKSPACE_ID_PATTERN  # noqa: PLC0415

    return re.fullmatch(WORKSPACE_ID_PATTERN, text) is not None


def cmd_cp(args: argparse.Namespace) -> int:
    from bashfleet.client.cli.common import open_fleet  # noqa: PLC0415
    from bashfleet.client.exit_status import USAGE as EXIT_USAGE  # noqa: PLC0415

    src, dst = parse_place(args.src), parse_place(args.dst)
    if (src.workspace is None) == (dst.workspace is None):
        print("bashfleet cp: one side must be a workspace's path (W:PATH) and the other a "
              "local one", file=sys.stderr)
        return EXIT_USAGE
    fleet = open_fleet()
    try:
        if dst.workspace is not None:
            return _upload(src.path, fleet.open_workspace(dst.workspace), dst.path)
        return _download(fleet.open_workspace(str(src.workspace)), src.path, dst.path)
    except OSError as exc:  # a file of either side (WorkspaceFileError is one too)
        print(f"bashfleet cp: {exc}", file=sys.stderr)
        return 1


def _upload(local: str, workspace: Workspace, path: str) -> int:
    if os.path.isdir(local):
        workspace.upload(local, path)
    elif os.path.isfile(local):
        if path.endswith("/") or path in (".", ""):
            path = path.rstrip("/") + "/" + os.path.basename(local)
        workspace.upload_file(local, path, mode=os.stat(local).st_mode & 0o777)
    else:
        raise FileNotFoundError(f"no such file or directory: {local}")
    return 0


def _download(workspace: Workspace, path: str, local: str) -> int:
    from bashfleet.client.errors import WorkspaceIsADirectory  # noqa: PLC0415

    target = local
    if local.endswith("/") or os.path.isdir(local):
        target = os.path.join(local, os.path.basename(path.rstrip("/")))
    try:
        workspace.download_file(path, target)
    except WorkspaceIsADirectory:
        workspace.download(path, local)
    return 0


# --------------------------------------------------------------------------- text


def workspace_table(views: list[WorkspaceView], now: float, *, counted: bool = False,
                    owners: bool = False) -> str:
    """Workspaces as `workspace ls` shows them: id, host, directory, isolation, when it
    expires unused, its session and tags (its disk and processes when `counted`, its
    owner when `owners`)."""
    from bashfleet.client.cli.common import table  # noqa: PLC0415

    header = ["ID", "HOST", "PATH", "ISOLATION", "NETWORK", "EXPIRES", "SESSION", "TAGS"]
    if counted:
        header += ["DISK", "PROCS"]
    if owners:
        header += ["OWNER"]
    rows = []
    for view in views:
        left = None if view.expires_at is None else max(0.0, view.expires_at - now)
        row: list[object] = [
            view.id, view.host, view.path,
            view.isolation, str(view.network),
            "-" if left is None else f"in {_duration(left)}", view.session or "-",
            " ".join(f"{k}={v}" for k, v in sorted(view.tags.items())) or "-",
        ]
        if counted:
            row += [_size(view.disk_bytes), "-" if view.processes is None else view.processes]
        if owners:
            row.append(view.owner or "-")
        rows.append(row)
    return table(rows, header)


def _duration(seconds: float) -> str:
    """`45s`, `12m`, `1h`, `2h30m`, `3d` : a TTL or a time left, for a person."""
    seconds = round(seconds)
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 120:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    return f"{hours // 24}d"


def _size(count: int | None) -> str:
    if count is None:
        return "-"
    if count < 1024:
        return f"{count}B"
    value = count / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}GiB"


def _pairs(pairs: list[str] | None, option: str, shape: str) -> dict[str, str]:
    """NAME=VALUE options as a mapping; ValueError (a usage error) for a malformed one."""
    result: dict[str, str] = {}
    for pair in pairs or ():
        name, equals, value = pair.partition("=")
        if not equals or not name or not value:
            raise ValueError(f"{option} takes {shape}, not {pair!r}")
        result[name] = value
    return result


def _limits(pairs: list[str] | None) -> dict[str, float]:
    limits: dict[str, float] = {}
    for name, value in _pairs(pairs, "--limit", "NAME=VALUE").items():
        if name not in LIMIT_NAMES:
            raise ValueError(f"--limit: no limit {name!r} (one of {', '.join(LIMIT_NAMES)})")
        try:
            limits[name] = float(value) if name == "cpus" else int(value)
        except ValueError:
            raise ValueError(f"--limit {name} takes a number, not {value!r}") from None
    return limits
