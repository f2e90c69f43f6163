"""The options of every `bashfleet` command, and which function runs each."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from bashfleet.client.cli import (
    agents,
    common,
    images,
    interactive,
    jobs,
    local_fleet,
    owners,
    snapshots,
    workspaces,
)

# The module, by another name: `run` is the name of its subparser below.
from bashfleet.client.cli import run as run_command

if TYPE_CHECKING:
    from bashfleet.client.cli.common import SubParsers


# ------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    """The `bashfleet` argument parser. Every option has help text (a unit test walks
    the tree)."""
    parser = argparse.ArgumentParser(
        prog="bashfleet", description="Run bash calls on a fleet of build machines.",
        epilog="Exit status: the command's own; 128+N when signal N ended it; 124 on a "
        "timeout kill; 125 for a system error (did not run, worker lost); 130 after "
        "Ctrl-C; 141 when the reader of its output went away (`| head`); 2 for usage.",
    )
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    _add_fleet_commands(sub)
    run = _add_run_command(sub)
    _add_job_commands(sub)
    _add_event_commands(sub)
    _add_agent_commands(sub)
    _add_session_commands(sub, run)
    workspaces.add_commands(sub)
    images.add_commands(sub)
    snapshots.add_commands(sub)
    owners.add_owner_commands(sub)
    from bashfleet.client.integrations import swerex_server  # noqa: PLC0415 - SWE-ReX loads when it runs
    swerex_server.add_parser(sub)
    return parser


def _add_fleet_commands(sub: SubParsers) -> None:
    """`up`, `down`, and the build machine's own commands (`worker`, `gc`)."""
    up = sub.add_parser("up", help="start a local fleet: Redis, workers, Flower")
    up.add_argument("--hosts", default="local", help="comma-separated host ids (default: local)")
    up.add_argument("--concurrency", type=int, default=4, help="command slots per worker "
                    "(default 4)")
    up.add_argument("--flower", action=argparse.BooleanOptionalAction, default=True,
                    help="also start Flower, the fleet's web UI (default: on; its URL, user "
                    "and password file are printed)")
    up.add_argument("--flower-port", type=int, default=5555,
                    help="Flower's port on 127.0.0.1 (default 5555)")
    up.add_argument("--label", action="append", metavar="L",
                    help="a pool label of the hosts this command starts (repeatable), for "
                    "--label L of run and workspace create")
    up.add_argument("--detach", action="store_true", help="return once the fleet is up")
    up.set_defaults(func=local_fleet.cmd_up)

    down = sub.add_parser("down", help="stop the local fleet and end what its hosts run")
    down.set_defaults(func=local_fleet.cmd_down)

    for name, (_, text) in local_fleet.WORKER_SIDE.items():
        # No options here: they are the module's own, passed through (see `main`).
        sub.add_parser(name, help=text, add_help=False)


def _add_job_commands(sub: SubParsers) -> None:
    """`check`, `kill`, `output`, `ps`, `hosts`: background jobs and the fleet's state."""
    check = sub.add_parser("check", help="state and new output of a background job")
    check.add_argument("id", help="job id (or the id of the call that started it)")
    check.add_argument("--grep", help="only lines matching this regular expression (RE2; "
                       "`^` and `$` are a line's start and end)")
    check.add_argument("--json", action="store_true",
                       help="print the check as JSON (id, host, running, exit_code, signal, "
                       "output, offset...)")
    check.set_defaults(func=jobs.cmd_check)

    kill = sub.add_parser("kill", help="kill a background job")
    kill.add_argument("id", help="job id (or the id of the call that started it)")
    kill.add_argument("--json", action="store_true",
                      help="print the job's final check as JSON")
    kill.set_defaults(func=jobs.cmd_kill)

    output = sub.add_parser("output", help="read the full output of a call or job")
    output.add_argument("id", help="job or call id")
    output.add_argument("--offset", type=int, default=0,
                        help="first byte to read (default 0; the next offset is printed)")
    output.add_argument("--limit", type=int, default=65536,
                        help="most bytes to read (default 65536)")
    output.add_argument("--grep", help="only lines matching this regular expression (RE2; "
                        "`^` and `$` are a line's start and end)")
    output.add_argument("--stream", choices=("stdout", "stderr"), default="stdout",
                        help="which stream of a call or job that keeps stderr apart "
                        "(default stdout: the only one of a combined output)")
    output.set_defaults(func=jobs.cmd_output)

    ps = sub.add_parser("ps", help="list background jobs")
    ps.add_argument("--host", help="only jobs of this host")
    ps.add_argument("--all", action="store_true",
                    help="every owner's jobs (needs the admin key), not only this user's")
    ps.add_argument("--tag", action="append", metavar="NAME=VALUE",
                    help="only jobs with this tag (repeatable: all of them)")
    ps.add_argument("--owner", help="only jobs of this owner")
    ps.add_argument("--json", action="store_true", help="print the jobs as a JSON list")
    ps.set_defaults(func=jobs.cmd_ps)

    hosts = sub.add_parser("hosts", help="list hosts and their load")
    hosts.add_argument("--all", action="store_true", help="also hosts dead for more than an "
                       "hour (their records expire a day after their last heartbeat)")
    hosts.add_argument("--json", action="store_true", help="print the hosts as a JSON list")
    hosts.add_argument("--alive", nargs="?", const="", metavar="HOST",
                       help="exit 0 only when HOST's worker heartbeat is live (default: this "
                       "machine's host id, BASHFLEET_HOST or its hostname): a healthcheck")
    hosts.set_defaults(func=jobs.cmd_hosts)


def _add_run_command(sub: SubParsers) -> argparse.ArgumentParser:
    """`run`: one bash call on the fleet."""
    run: argparse.ArgumentParser = sub.add_parser("run", help="run a command on the fleet")
    run.add_argument("--host", help="host id (default: any host)")
    run.add_argument("--mode", choices=["default", "slow", "background"], default="default",
                     help="default: wait (120 s timeout); slow: wait up to 15 minutes; "
                     "background: start a job and print its id on stdout at once")
    run.add_argument("--timeout", type=float,
                     help="seconds before the command is killed (exit 124); default 120, "
                          "15 minutes with --mode slow")
    run.add_argument("--background-on-timeout", action="store_true",
                     help="at the timeout, leave the command running as a background job "
                          "instead of killing it (its id is printed on stdout)")
    run.add_argument("--workspace", metavar="W",
                     help="run in this workspace (`bashfleet workspace create`), on its host; "
                     "default: a throwaway one, ended with the call and its jobs")
    workspaces.add_image_options(run)
    run.add_argument("--cwd", help="working directory (relative: from the workspace's "
                     "directory, or the session's cwd)")
    run.add_argument("--session",
                     help="session id: the call runs on the session's host, in its cwd, with "
                          "its exported variables, and what it changes there holds for the "
                          "session's next call (kept in Redis: any process, any machine)")
    run.add_argument("--follow", action="store_true",
                     help="stream the output as the host writes it (also a background job's)")
    run.add_argument("--isolation", choices=["process", "strict", "none"],
                     help="the sandbox (default: the host's; stronger is granted, weaker "
                     "refused)")
    workspaces.add_network_options(run)
    run.add_argument("--tag", action="append", metavar="NAME=VALUE",
                     help="a tag of the job it starts (repeatable; ps, wait and events see it)")
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument("command", nargs=argparse.REMAINDER, help="the bash command")
    run.set_defaults(func=run_command.cmd_run)
    return run


def _add_event_commands(sub: SubParsers) -> None:
    """`wait` and `events`: job ends, heard from any client."""
    wait = sub.add_parser("wait", help="wait until a background job ends; exit with its status")
    wait.add_argument("id", help="job id (or the id of the call that started it)")
    wait.add_argument("--timeout", type=float, help="give up after S seconds (exit 124)")
    wait.add_argument("--json", action="store_true", help="print the job's final view")
    wait.set_defaults(func=jobs.cmd_wait)

    events = sub.add_parser("events", help="job starts and ends as they happen, fleet-wide")
    events.add_argument("--host", help="only jobs of this host")
    events.add_argument("--kind", action="append", choices=["started", "ended", "denied"],
                        help="only events of this kind (repeatable; denied: what workspaces' "
                        "network policies refused)")
    events.add_argument("--tag", action="append", metavar="NAME=VALUE",
                        help="only jobs with this tag (repeatable: all of them)")
    events.add_argument("--since", help="an event's seq to resume after, or `all` (every "
                        "event kept); default: from now")
    events.add_argument("--count", type=int, help="stop after N events")
    events.add_argument("--json", action="store_true", help="one JSON object a line")
    events.set_defaults(func=jobs.cmd_events)


def _add_session_commands(sub: SubParsers, run: argparse.ArgumentParser) -> None:
    """`write`, `attach`, and `run`'s options for input: interactive jobs."""
    from bashfleet.client.attach import DETACH_KEY_FORMAT  # noqa: PLC0415 - small, no dependencies

    run.add_argument("--tty", action="store_true",
                     help="run in a terminal (PTY) and attach this one to it (Ctrl-] detaches)")
    run.add_argument("--no-stdin", action="store_true",
                     help="do not forward a piped stdin (default: forwarded to the command)")
    write = sub.add_parser("write", help="send input to an interactive job; show its output")
    write.add_argument("id", help="job id")
    write.add_argument("text", nargs="*", help="the text (words joined by spaces; a newline "
                       "is added); options may come before or after it")
    write.add_argument("-n", "--no-newline", action="store_true", help="add no newline")
    write.add_argument("--close", action="store_true",
                       help="end the job's input after the text (alone: only end it)")
    write.add_argument("--wait", type=float, default=5.0,
                       help="most seconds to wait for output (default 5)")
    write.add_argument("--json", action="store_true", help="print the job's answer as JSON")
    write.set_defaults(func=interactive.cmd_write)

    attach = sub.add_parser("attach", help="attach this terminal to an interactive job")
    attach.add_argument("id", help="job id")
    attach.add_argument("--detach-key", default="^]", metavar="KEY",
                        help=f"the key that detaches, leaving the job running (default ^], "
                        f"Ctrl-]): {DETACH_KEY_FORMAT}".replace("%", "%%"))
    attach.set_defaults(func=interactive.cmd_attach)


def _add_agent_commands(sub: SubParsers) -> None:
    """`schema` and `mcp`: the dialects as an agent sees them."""
    dialects = ", ".join(common.DIALECT_NAMES)
    schema = sub.add_parser("schema", help="print the tool schemas of the dialects as JSON")
    schema.add_argument("--dialect", metavar="DIALECT",
                        help=f"one dialect: {dialects} (default: all, by name)")
    schema.add_argument("--style", choices=common.SCHEMA_STYLES, default="anthropic",
                        help="the shape of the API that takes the tools: anthropic (Messages "
                        "API), openai (Chat Completions: type function, function {...}), "
                        "openai-responses (Responses API: flat, strict false), mcp "
                        "(tools/list), function (the bare name, description, parameters) "
                        "(default: anthropic)")
    schema.add_argument("--cwd", help="working directory shown in descriptions (modes)")
    schema.set_defaults(func=agents.cmd_schema)

    mcp = sub.add_parser("mcp", help="serve a dialect's tools over MCP (stdio)")
    mcp.add_argument("--dialect", required=True, metavar="DIALECT",
                     help=f"the dialect served: {dialects}")
    mcp.add_argument("--session", help="session id to create or resume (default: a new one)")
    mcp.add_argument("--host", help="pin the session to this host (default: its first host)")
    mcp.add_argument("--cwd", help="the session's working directory on the host")
    workspaces.add_image_options(mcp)
    mcp.set_defaults(func=agents.cmd_mcp)
