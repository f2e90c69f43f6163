"""The `bashfleet` command: a local fleet, a worker, and every call a person makes.

Readable text for people, `--json` for scripts. `run` exits with the command's own
status (128+N when a signal ended it, 124 on a timeout kill, 125 for a system error,
130 after Ctrl-C: `bashfleet.client.exit_status`, the one mapping), so `bashfleet run
'make test' && deploy` works as with plain bash: a timeout kills the command unless
`--background-on-timeout` says otherwise. Ctrl-C, `--follow` and stdin:
`bashfleet.client.foreground`. A reader that goes away (`bashfleet schema | head`) ends
any command quietly with 141, as SIGPIPE ends `yes | head`'s `yes`.

One module a group of commands: `run` (run, its spinner, its result; `plain`, its call
with no model built, for a workspace or a host named), `interactive`
(--tty, stdin, attach, write), `jobs` (check, kill, output, ps, wait, events, hosts),
`local_fleet` (up, down, and the worker-side commands), `agents` (schema, mcp),
`workspaces`, `snapshots`, `images`, `owners`; `common` holds what they share and
`arguments` the options of all of them. This module is the entry point: `main`.

A command's module loads when the command is chosen, never before: `bashfleet --help`
loads argparse and nothing of the fleet's, `run` the fleet client and not the MCP
server, the dialects or the SWE-ReX server (a unit test holds each command to it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence

from bashfleet.client import exit_status as statuses
from bashfleet.client.cli import arguments, common
from bashfleet.client.exit_status import SYSTEM_ERROR as EXIT_SYSTEM_ERROR
from bashfleet.client.exit_status import USAGE as EXIT_USAGE


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None
           ) -> tuple[argparse.Namespace, list[str]]:
    """Parse `argv`; what no option takes is returned (a worker-side command's own).

    `write`'s text may come on both sides of its options (`write J -n abc`): argparse
    gives the words after an option back unparsed, and they are the text's."""
    args, rest = parser.parse_known_args(argv)
    if args.cmd == "write" and rest and not any(word.startswith("-") for word in rest):
        args.text = [*args.text, *rest]
        rest = []
    return args, rest


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `bashfleet` console script."""
    parser = arguments.build_parser(sys.argv[1:] if argv is None else argv)
    try:
        args, rest = _parse(parser, argv)
    except BrokenPipeError:
        # `--help` into a reader that went (`| head -1`): Python 3.11.2's argparse lets the
        # failed write through, later ones drop it themselves.
        return _reader_gone()
    if args.cmd in arguments.WORKER_SIDE:
        from bashfleet.client.cli.local_fleet import exec_worker_side  # noqa: PLC0415

        return exec_worker_side(args.cmd, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.cmd == "run" and not args.command:
        parser.error("run: a command is required")
    try:
        return _dispatch(args)
    except BrokenPipeError:
        return _reader_gone()


def _dispatch(args: argparse.Namespace) -> int:
    """Run the command; its exit status, with errors said in the CLI's words."""
    try:
        status: int = arguments.command(args.func)(args)
    except KeyboardInterrupt:
        return statuses.INTERRUPTED
    except Exception as exc:
        said = _said(args, exc)
        if said is None:
            raise
        return said
    return status


def _said(args: argparse.Namespace, exc: Exception) -> int | None:
    """Say an error in the CLI's words, on stderr; its exit status (None: a bug)."""
    from pydantic import ValidationError  # noqa: PLC0415

    from bashfleet.client._core.identity import settings_problem  # noqa: PLC0415
    from bashfleet.client._core.settings import SettingsError  # noqa: PLC0415
    from bashfleet.client.errors import BashfleetError, FleetUnavailable  # noqa: PLC0415

    if isinstance(exc, ValidationError) and exc.title == "Settings":
        # A BASHFLEET_* variable's value (the worker's settings, which `up` and `owner`
        # read): one line, not pydantic's paragraphs.
        text, status = f"bashfleet: {settings_problem(exc)}", EXIT_USAGE
    elif isinstance(exc, SettingsError):  # the same, of the client's settings
        text, status = f"bashfleet: {exc}", EXIT_USAGE
    elif isinstance(exc, common.NoFleet):
        text, status = f"bashfleet: {exc}", EXIT_SYSTEM_ERROR
    elif isinstance(exc, FleetUnavailable):
        text, status = (f"bashfleet: {exc}\nbashfleet: is the fleet up? {common.NO_FLEET_HINT}",
                        EXIT_SYSTEM_ERROR)
    elif isinstance(exc, BashfleetError):
        text, status = f"bashfleet: {exc}", EXIT_SYSTEM_ERROR
    elif isinstance(exc, ValueError):  # a malformed option value (`--tag` without `=`)
        text, status = f"bashfleet {args.cmd}: {exc}", EXIT_USAGE
    else:
        return None
    print(text, file=sys.stderr)
    return status


def _reader_gone() -> int:
    """The reader of stdout went away (`bashfleet schema | head`): say nothing, as a
    command that SIGPIPE ends says nothing, and exit 141 (128 + SIGPIPE) as it does.

    stdout is pointed at /dev/null so the interpreter's last flush at exit does not
    fail again (Python's own advice for SIGPIPE)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return statuses.BROKEN_PIPE
