"""What agents connect to: `schema` (a dialect's tool definitions) and `mcp` (an MCP
server over stdio).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from bashfleet.client.cli import common
from bashfleet.client.exit_status import USAGE as EXIT_USAGE

if TYPE_CHECKING:
    from bashfleet.client.dialects import Dialect


# ----------------------------------------------------------------------- schema, mcp


def _dialect_or_usage(name: str) -> Dialect | None:
    """The dialect called `name`; None (after saying which exist) when there is none."""
    from bashfleet.client.dialects import UnknownDialectError, get_dialect  # noqa: PLC0415

    try:
        return get_dialect(name)
    except UnknownDialectError as exc:
        print(f"bashfleet: {exc}", file=sys.stderr)
        return None


def cmd_schema(args: argparse.Namespace) -> int:
    from bashfleet.client.dialects import DIALECTS, schemas  # noqa: PLC0415

    names = [args.dialect] if args.dialect else list(DIALECTS)
    found = {}
    for name in names:
        dialect = _dialect_or_usage(name)
        if dialect is None:
            return EXIT_USAGE
        found[name] = dialect
    # As `bashfleet mcp --cwd` shows it: a relative path is one on this machine.
    cwd = os.path.abspath(args.cwd) if args.cwd else None
    tools = {
        name: schemas(dialect, cwd=cwd, style=args.style) for name, dialect in found.items()
    }
    common.print_json(tools[args.dialect] if args.dialect else tools)
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    import logging  # noqa: PLC0415

    from bashfleet.client import mcp_server  # noqa: PLC0415 - the MCP SDK loads only for `mcp`
    from bashfleet.client.sessions import validate_session_id  # noqa: PLC0415
    from bashfleet.worker.wire.names import validate_host  # noqa: PLC0415

    dialect = _dialect_or_usage(args.dialect)
    if dialect is None:
        return EXIT_USAGE
    session = args.session or mcp_server.new_session_id()
    try:
        validate_session_id(session)
        if args.host:
            validate_host(args.host)
    except ValueError as exc:
        print(f"bashfleet mcp: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # stdout carries the protocol: everything for people goes to stderr.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    print(f"bashfleet mcp: {dialect.name} dialect, session {session} "
          f"(resume it with --session {session})", file=sys.stderr)
    from bashfleet.client._core.settings import client_settings  # noqa: PLC0415

    mcp_server.serve(dialect, session, host=args.host, cwd=args.cwd,
                     resumable=args.session is not None,
                     started_by=client_settings().owner_name(),
                     made_of={"image": args.image, "build": args.build, "user": args.user,
                              "build_network": args.build_network})
    return 0
