"""`bashfleet images ls|pull|rm`: the images the fleet's hosts hold, from a shell.

    bashfleet images pull registry.example/team/build:1 --host build-1
    bashfleet images ls
    bashfleet images rm registry.example/team/build:1 --host build-1

A host pulls with its own registry credentials (the worker's settings); images are
shared by every owner of a host, so `rm` takes the admin key, and `bashfleet gc` on a
host collects those no workspace uses. This module is only the CLI's words for
`Fleet.images`, `pull_image` and `remove_image`: tables and results on stdout,
progress and notices on stderr, `--json` for scripts.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from bashfleet.worker.wire.models import ImageInfo


def cmd_ls(args: argparse.Namespace) -> int:
    from bashfleet.client.cli.common import open_fleet  # noqa: PLC0415 - the CLI's own helper

    infos = open_fleet().images(host=args.host)
    if args.json:
        _print_infos(infos)
    else:
        print(image_table(infos, time.time()) if infos else "no images")
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from bashfleet.client.cli.common import open_fleet  # noqa: PLC0415

    line = ProgressLine(sys.stderr) if sys.stderr.isatty() else None
    try:
        infos = open_fleet().pull_image(args.ref, host=args.host, refresh=args.refresh,
                                    progress=line.show if line else None)
    finally:
        if line is not None:
            line.clear()
    if args.json:
        _print_infos(infos)
        return 0
    for info in infos:
        print(f"{info.host}: {args.ref} {info.digest} ({_size(info.size_bytes)}, "
              f"shell {info.shell})")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    """Remove it; 1 when no host held it."""
    import json  # noqa: PLC0415

    from bashfleet.client.cli.common import open_fleet  # noqa: PLC0415

    hosts = open_fleet().remove_image(args.ref, host=args.host)
    if args.json:
        print(json.dumps({"ref": args.ref, "removed_from": hosts}, indent=2))
    elif hosts:
        print(f"[{args.ref} removed from {', '.join(hosts)}]", file=sys.stderr)
    else:
        print(f"bashfleet images rm: no host held {args.ref}", file=sys.stderr)
    return 0 if hosts else 1


def _print_infos(infos: list[ImageInfo]) -> None:
    print("[" + ",\n".join(info.model_dump_json(indent=2) for info in infos) + "]")


class ProgressLine:
    """One line of progress on a terminal, rewritten in place (a pull's latest step)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.shown = False

    def show(self, text: str) -> None:
        width = max(20, shutil.get_terminal_size((80, 24)).columns - 1)
        shown = text if len(text) <= width else text[: width - 3] + "..."
        self.out.write(f"\r\x1b[K{shown}")
        self.out.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.out.write("\r\x1b[K")
            self.out.flush()


# --------------------------------------------------------------------------- text


def image_table(infos: list[ImageInfo], now: float) -> str:
    """Images as `images ls` shows them: host, reference, digest (short), size, shell,
    user, when last used."""
    from bashfleet.client.cli.common import table  # noqa: PLC0415

    rows = []
    for info in infos:
        used = info.last_used_at if info.last_used_at is not None else info.pulled_at
        rows.append([info.host, info.ref, info.digest.removeprefix("sha256:")[:12],
                     _size(info.size_bytes), info.shell, info.user or "root",
                     f"{_ago(now - used)} ago"])
    return table(rows, ["HOST", "IMAGE", "DIGEST", "SIZE", "SHELL", "USER", "USED"])


def _ago(seconds: float) -> str:
    from bashfleet.client.cli.workspaces import _duration  # noqa: PLC0415 - one way to say a duration

    return _duration(max(0.0, seconds))


def _size(count: int) -> str:
    from bashfleet.client.cli.workspaces import _size as size  # noqa: PLC0415

    return size(count)
