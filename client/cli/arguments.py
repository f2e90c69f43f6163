"""The options of every `bashfleet` command, and which function runs each.

Only argparse and the standard library load here: `bashfleet --help` and every command's
parsing cost no more. A command's function is named, not imported (`"run:cmd_run"`: the
module of `bashfleet.client.cli` and the function), and `command` imports its module once
the command is chosen, so `bashfleet run` never loads what `workspace cp` or `mcp` need.
"""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Callable, Sequence

#: `typing.TYPE_CHECKING` without loading `typing` (`bashfleet --help` does not need it).
TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]
else:  # generic only to type checkers
    SubParsers = argparse._SubParsersAction

#: The dialects `schema` and `mcp` take, and `schema`'s styles (`bashfleet.client.dialects.DIALECTS`
#: and `bashfleet.client.dialects.base.SCHEMA_STYLES`, which a unit test holds these to: importing
#: the dialects here would slow every `bashfleet --help`).
DIALECT_NAMES = ("claude", "claude-code", "codex", "modes", "native", "pi", "pipe")
SCHEMA_STYLES = ("anthropic", "openai", "openai-responses", "mcp", "function")

#: Limits `workspace create --limit` takes (`WorkspaceLimits`' fields).
LIMIT_NAMES = ("memory_mb", "procs", "cpus", "disk_mb", "open_files")

#: Subcommands that run the build machine's own side, by module: their arguments are
#: that module's (`bashfleet worker --help` is the supervisor's own help).
WORKER_SIDE = {
    "worker": ("bashfleet.worker.fleet.supervisor",
               "serve calls on this machine (--host, --concurrency, --label)"),
    "gc": ("bashfleet.worker.retention", "remove old spill and job files of this machine's worker "
           "(--dry-run, --json, --max-age, --max-bytes)"),
}

#: Where `bashfleet swerex` reads its token when `--auth-token` is not given.
SWEREX_TOKEN_VARIABLE = "BASHFLEET_SWEREX_AUTH_TOKEN"  # noqa: S105 - a variable name

#: Where a command's function lives when its name has no dot: this package.
PACKAGE = "bashfleet.client.cli"


def command(target: str) -> Callable[[argparse.Namespace], int]:
    """The function a command's `func` names (`"module:function"`: a module of this
    package, or a full dotted name), its module imported now."""
    module, _, name = target.partition(":")
    found: Callable[[argparse.Namespace], int] = getattr(
        importlib.import_module(module if "." in module else f"{PACKAGE}.{module}"), name)
    return found


# ------------------------------------------------------------------------- parser


class _Unlisted:
    """The parser of a command that was not asked for: it names the command in the list
    of commands and drops the options given to it (it never parses any). Not an
    ArgumentParser: building one costs more than `bashfleet --help` may spend on forty.

    Its verbs (`workspace create`...) are listed the same way, under a real subparsers
    action, so the tree of commands is whole whatever was asked for."""

    def __init__(self, prog: str | None = None, **kwargs: Any) -> None:
        self.prog = prog
        self._actions: list[argparse.Action] = []

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        return _DROPPED

    def add_mutually_exclusive_group(self, **kwargs: Any) -> _Unlisted:
        return self

    def set_defaults(self, **kwargs: Any) -> None:
        return None

    def add_subparsers(self, **kwargs: Any) -> SubParsers:
        action = SubParsers(option_strings=[], prog=self.prog or "",
                            parser_class=_Unlisted,  # type: ignore[arg-type]
                            dest=kwargs.get("dest", argparse.SUPPRESS),
                            required=kwargs.get("required", False),
                            metavar=kwargs.get("metavar"))
        self._actions.append(action)
        return action


#: What adding an option to an `_Unlisted` parser gives back.
_DROPPED = argparse.Action(option_strings=[], dest="dropped")


class _Commands(SubParsers):
    """`bashfleet`'s commands: the one `chosen` (every one when None) gets a parser
    that takes its options, the others an `_Unlisted` one."""

    chosen: str | None = None

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        listed = self.chosen is None or name == self.chosen
        self._parser_class = (argparse.ArgumentParser if listed
                              else _Unlisted)  # type: ignore[assignment]
        return super().add_parser(name, **kwargs)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The `bashfleet` argument parser. Every option has help text and every command a
    function that exists (unit tests walk the tree).

    With `argv`, the parser of what it asks for: the command it names takes its options,
    every other command is listed with its help line alone (`_Unlisted`), so parsing
    `run` or printing `bashfleet --help` never builds the options of forty commands."""
    parser = argparse.ArgumentParser(
        prog="bashfleet", description="Run bash calls on a fleet of build machines.",
        epilog="Exit status: the command's own; 128+N when signal N ended it; 124 on a "
        "timeout kill; 125 for a system error (did not run, worker lost); 130 after "
        "Ctrl-C; 141 when the reader of its output went away (`| head`); 2 for usage.",
    )
    chosen = None if argv is None else next((w for w in argv if not w.startswith("-")), "")
    sub: _Commands = parser.add_subparsers(  # type: ignore[assignment]
        dest="cmd", required=True, metavar="COMMAND", action=_Commands)
    sub.chosen = chosen
    _add_fleet_commands(sub)
    run = _add_run_command(sub)
    _add_job_commands(sub)
    _add_event_commands(sub)
    _add_agent_commands(sub)
    _add_session_commands(sub, run)
    _add_workspace_commands(sub)
    _add_image_commands(sub)
    _add_snapshot_commands(sub)
    _add_owner_commands(sub)
    _add_swerex_command(sub)
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
    up.set_defaults(func="local_fleet:cmd_up")

    down = sub.add_parser("down", help="stop the local fleet and end what its hosts run")
    down.set_defaults(func="local_fleet:cmd_down")

    for name, (_, text) in WORKER_SIDE.items():
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
    check.set_defaults(func="jobs:cmd_check")

    kill = sub.add_parser("kill", help="kill a background job")
    kill.add_argument("id", help="job id (or the id of the call that started it)")
    kill.add_argument("--json", action="store_true",
                      help="print the job's final check as JSON")
    kill.set_defaults(func="jobs:cmd_kill")

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
    output.set_defaults(func="jobs:cmd_output")

    ps = sub.add_parser("ps", help="list background jobs")
    ps.add_argument("--host", help="only jobs of this host")
    ps.add_argument("--all", action="store_true",
                    help="every owner's jobs (needs the admin key), not only this user's")
    ps.add_argument("--tag", action="append", metavar="NAME=VALUE",
                    help="only jobs with this tag (repeatable: all of them)")
    ps.add_argument("--owner", help="only jobs of this owner")
    ps.add_argument("--json", action="store_true", help="print the jobs as a JSON list")
    ps.set_defaults(func="jobs:cmd_ps")

    hosts = sub.add_parser("hosts", help="list hosts and their load")
    hosts.add_argument("--all", action="store_true", help="also hosts dead for more than an "
                       "hour (their records expire a day after their last heartbeat)")
    hosts.add_argument("--json", action="store_true", help="print the hosts as a JSON list")
    hosts.add_argument("--alive", nargs="?", const="", metavar="HOST",
                       help="exit 0 only when HOST's worker heartbeat is live (default: this "
                       "machine's host id, BASHFLEET_HOST or its hostname): a healthcheck")
    hosts.set_defaults(func="jobs:cmd_hosts")


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
    _add_image_options(run)
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
    _add_network_options(run)
    run.add_argument("--tag", action="append", metavar="NAME=VALUE",
                     help="a tag of the job it starts (repeatable; ps, wait and events see it)")
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument("command", nargs=argparse.REMAINDER, help="the bash command")
    run.set_defaults(func="run:cmd_run")
    return run


def _add_event_commands(sub: SubParsers) -> None:
    """`wait` and `events`: job ends, heard from any client."""
    wait = sub.add_parser("wait", help="wait until a background job ends; exit with its status")
    wait.add_argument("id", help="job id (or the id of the call that started it)")
    wait.add_argument("--timeout", type=float, help="give up after S seconds (exit 124)")
    wait.add_argument("--json", action="store_true", help="print the job's final view")
    wait.set_defaults(func="jobs:cmd_wait")

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
    events.set_defaults(func="jobs:cmd_events")


#: How `--detach-key` is written (`bashfleet attach --help`, docs/cli.md;
#: `bashfleet.client.attach.parse_detach_key` reads it).
DETACH_KEY_FORMAT = (
    "^X or ctrl-X for Ctrl-X (X a letter or one of @ [ \\ ] ^ _ ?; ^? is DEL), "
    "a Python escape such as \\x1d, or one plain character"
)


def _add_session_commands(sub: SubParsers, run: argparse.ArgumentParser) -> None:
    """`write`, `attach`, and `run`'s options for input: interactive jobs."""
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
    write.set_defaults(func="interactive:cmd_write")

    attach = sub.add_parser("attach", help="attach this terminal to an interactive job")
    attach.add_argument("id", help="job id")
    attach.add_argument("--detach-key", default="^]", metavar="KEY",
                        help=f"the key that detaches, leaving the job running (default ^], "
                        f"Ctrl-]): {DETACH_KEY_FORMAT}".replace("%", "%%"))
    attach.set_defaults(func="interactive:cmd_attach")


def _add_agent_commands(sub: SubParsers) -> None:
    """`schema` and `mcp`: the dialects as an agent sees them."""
    dialects = ", ".join(DIALECT_NAMES)
    schema = sub.add_parser("schema", help="print the tool schemas of the dialects as JSON")
    schema.add_argument("--dialect", metavar="DIALECT",
                        help=f"one dialect: {dialects} (default: all, by name)")
    schema.add_argument("--style", choices=SCHEMA_STYLES, default="anthropic",
                        help="the shape of the API that takes the tools: anthropic (Messages "
                        "API), openai (Chat Completions: type function, function {...}), "
                        "openai-responses (Responses API: flat, strict false), mcp "
                        "(tools/list), function (the bare name, description, parameters) "
                        "(default: anthropic)")
    schema.add_argument("--cwd", help="working directory shown in descriptions (modes)")
    schema.set_defaults(func="agents:cmd_schema")

    mcp = sub.add_parser("mcp", help="serve a dialect's tools over MCP (stdio)")
    mcp.add_argument("--dialect", required=True, metavar="DIALECT",
                     help=f"the dialect served: {dialects}")
    mcp.add_argument("--session", help="session id to create or resume (default: a new one)")
    mcp.add_argument("--host", help="pin the session to this host (default: its first host)")
    mcp.add_argument("--cwd", help="the session's working directory on the host")
    _add_image_options(mcp)
    mcp.set_defaults(func="agents:cmd_mcp")


# --------------------------------------------------------------------- workspaces


def _add_workspace_commands(sub: SubParsers) -> None:
    """`workspace` (with its own subcommands) and `cp`."""
    workspace = sub.add_parser("workspace", help="make, list, renew and remove workspaces")
    verbs = workspace.add_subparsers(dest="verb", required=True, metavar="VERB")
    _add_create(verbs)
    ls = verbs.add_parser("ls", help="this owner's live workspaces, however they were made")
    ls.add_argument("--json", action="store_true", help="print them as a JSON list")
    ls.add_argument("--mcp", action="store_true",
                    help="also those of the MCP servers (`bashfleet mcp`) you started, each "
                    "owned by its session (`workspace rm` removes them)")
    ls.set_defaults(func="workspaces:cmd_ls")
    network = verbs.add_parser("network", help="put another network policy in force in a "
                               "live workspace (its processes keep running)")
    network.add_argument("id", metavar="WORKSPACE", help="workspace id")
    network.add_argument("policy", metavar="POLICY",
                         help="none, egress, allow=DOMAIN,*.DOMAIN,CIDR,... (host only for a "
                         "workspace made so)")
    network.add_argument("--json", action="store_true", help="print its view as JSON")
    network.set_defaults(func="workspaces:cmd_network")
    for verb, text, func in (
        ("info", "a workspace's view, with its disk bytes and processes counted",
         "workspaces:cmd_info"),
        ("renew", "mark workspaces used now: their TTL starts again", "workspaces:cmd_renew"),
        ("rm", "end workspaces: their processes killed, their files removed",
         "workspaces:cmd_rm"),
    ):
        parser = verbs.add_parser(verb, help=text)
        parser.add_argument("ids", nargs="+", metavar="WORKSPACE", help="workspace id")
        parser.add_argument("--json", action="store_true", help="print the views as JSON")
        parser.set_defaults(func=func)
    _add_snapshot_verbs(verbs)

    cp = sub.add_parser(
        "cp", help="copy files between here and a workspace (W:PATH names a workspace's)",
        description="Copy a file or a directory between this machine and a workspace. "
        "One side is W:PATH (PATH relative to the workspace's directory, or absolute as its "
        "calls see it). A directory is copied as a whole: DST becomes a copy of it (made if "
        "missing, its files overwritten). A file goes to DST, or into DST when DST is a "
        "directory or ends with /.")
    cp.add_argument("src", help="local path, or W:PATH")
    cp.add_argument("dst", help="local path, or W:PATH")
    cp.set_defaults(func="workspaces:cmd_cp")


def _add_create(verbs: SubParsers) -> None:
    create = verbs.add_parser("create", help="make a workspace; print its id on stdout")
    create.add_argument("--host", help="the host (default: the live host with the fewest "
                        "of the owner's workspaces, then the least loaded)")
    create.add_argument("--label", help="a live host of this label")
    create.add_argument("--path", help="an existing host directory under a root the host "
                        "allows (BASHFLEET_WORKSPACE_ALLOW); default: a fresh directory, "
                        "removed with the workspace")
    create.add_argument("--ttl", type=float, metavar="S",
                        help="seconds it lives unused (default: the host's, 1 h)")
    create.add_argument("--isolation", choices=["process", "strict", "none"],
                        help="its sandbox (default: the host's; weaker is refused)")
    _add_network_options(create)
    create.add_argument("--limit", action="append", metavar="NAME=VALUE",
                        help=f"a limit of its processes together: {', '.join(LIMIT_NAMES)} "
                        "(repeatable; never above the host's)")
    create.add_argument("--mount", action="append", metavar="VIEW=SUBDIR",
                        help="show its subdirectory SUBDIR at the absolute path VIEW in its "
                        "calls' view (repeatable: --mount /logs=logs)")
    create.add_argument("--tag", action="append", metavar="NAME=VALUE",
                        help="a tag of the workspace (repeatable)")
    _add_image_options(create, snapshot=True)
    create.add_argument("--json", action="store_true", help="print its view as JSON")
    create.set_defaults(func="workspaces:cmd_create")


def _add_network_options(parser: argparse.ArgumentParser) -> None:
    """--network POLICY and --no-network (workspace create, run)."""
    parser.add_argument("--network", metavar="POLICY", default=None,
                        help="its network policy: egress (the host's default: the internet, "
                        "never the fleet, the host or private ranges), none, "
                        "allow=DOMAIN,*.DOMAIN,CIDR,... (only those), or host (where the "
                        "host allows it)")
    parser.add_argument("--no-network", dest="network", action="store_const", const="none",
                        help="the same as --network none")


def _add_image_options(parser: argparse.ArgumentParser, *, snapshot: bool = False) -> None:
    """--image, --build and --user (workspace create, run, mcp); --snapshot too."""
    made = parser.add_mutually_exclusive_group()
    if snapshot:
        made.add_argument("--snapshot", metavar="SNAPSHOT",
                          help="a snapshot of this owner's: its files are the workspace's, in "
                          "the same paths (on the snapshot's host unless --host/--label say)")
    made.add_argument("--image", metavar="REF",
                      help="an OCI image whose root filesystem is the workspace's / "
                      "(python:3.12-slim, registry:5000/app@sha256:...), pulled onto the host "
                      "unless it holds it")
    made.add_argument("--build", metavar="DIR",
                      help="a local directory with a Dockerfile: built on the host (cached "
                      "by its content), its image the workspace's /")
    parser.add_argument("--user", help="who its calls run as inside (a name, uid or "
                        "uid:gid; default: the image's USER, else root)")
    parser.add_argument("--build-network", metavar="POLICY",
                        help="the network of --build's RUN steps (their own namespace): "
                        "egress (default: the internet, never the fleet, the host's loopback "
                        "or private ranges), none, or host where the host allows it")


# ---------------------------------------------------------------------- snapshots


def _add_snapshot_verbs(verbs: SubParsers) -> None:
    """`workspace snapshot`, `workspace fork`, `workspace restore`."""
    snap = verbs.add_parser("snapshot", help="freeze a workspace's files (it runs on); print "
                            "the snapshot's id")
    snap.add_argument("workspace", metavar="WORKSPACE", help="the workspace (it runs on)")
    snap.add_argument("--ttl", type=float, metavar="S",
                      help="seconds the snapshot is kept (default: the host's, a day)")
    snap.add_argument("--tag", action="append", metavar="NAME=VALUE",
                      help="a tag of the snapshot (repeatable)")
    snap.add_argument("--json", action="store_true", help="print it as JSON")
    snap.set_defaults(func="snapshots:cmd_snapshot")
    fork = verbs.add_parser("fork", help="new workspaces with a workspace's files now (none "
                            "of its processes); print their ids, one a line")
    fork.add_argument("workspace", metavar="WORKSPACE", help="the workspace forked")
    fork.add_argument("--host", help="make them on this host (default: the workspace's; "
                      "another gets its snapshot through the fleet's registry)")
    fork.add_argument("--label", help="make them on live hosts of this label")
    fork.add_argument("-n", type=int, default=1, metavar="N", help="how many (default 1)")
    fork.add_argument("--ttl", type=float, metavar="S",
                      help="seconds each lives unused (default: the source's)")
    fork.add_argument("--tag", action="append", metavar="NAME=VALUE",
                      help="a tag of each fork (repeatable)")
    fork.add_argument("--json", action="store_true", help="print their views as JSON")
    fork.set_defaults(func="snapshots:cmd_fork")
    restore = verbs.add_parser("restore", help="put a workspace's files back to a snapshot "
                               "of it (its processes are ended)")
    restore.add_argument("workspace", metavar="WORKSPACE", help="the workspace put back")
    restore.add_argument("snapshot", metavar="SNAPSHOT",
                         help="a snapshot of it (or of the one it was made from)")
    restore.add_argument("--json", action="store_true", help="print the result as JSON")
    restore.set_defaults(func="snapshots:cmd_restore")


def _add_snapshot_commands(sub: SubParsers) -> None:
    """`snapshot ls` and `snapshot rm`."""
    snapshot = sub.add_parser("snapshot", help="list and remove this owner's snapshots")
    verbs = snapshot.add_subparsers(dest="verb", required=True, metavar="VERB")
    ls = verbs.add_parser("ls", help="this owner's snapshots across the fleet")
    ls.add_argument("--json", action="store_true", help="print them as a JSON list")
    ls.set_defaults(func="snapshots:cmd_ls")
    rm = verbs.add_parser("rm", help="delete snapshots (their layers go once no workspace "
                          "stands on them)")
    rm.add_argument("ids", nargs="+", metavar="SNAPSHOT", help="snapshot id")
    rm.set_defaults(func="snapshots:cmd_rm")


# ------------------------------------------------------------- images, owners, swerex


def _add_image_commands(sub: SubParsers) -> None:
    """`images` with its verbs."""
    parser = sub.add_parser("images", help="list, pull and remove the images hosts hold")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    ls = verbs.add_parser("ls", help="the images each live host holds")
    pull = verbs.add_parser("pull", help="pull an image onto a host (or every live host) "
                            "unless it holds it already")
    pull.add_argument("ref", metavar="REF", help="image reference: [registry/]name[:tag] "
                      "or name@sha256:digest")
    pull.add_argument("--refresh", action="store_true",
                      help="ask the registry where the tag points now, even if held")
    rm = verbs.add_parser("rm", help="remove an image no workspace uses (admin key)")
    rm.add_argument("ref", metavar="REF", help="a reference it was pulled as, or its digest")
    for verb, func in ((ls, "images:cmd_ls"), (pull, "images:cmd_pull"), (rm, "images:cmd_rm")):
        verb.add_argument("--host", help="one host (default: every live host)")
        verb.add_argument("--json", action="store_true", help="print the result as JSON")
        verb.set_defaults(func=func)


def _add_owner_commands(sub: SubParsers) -> None:
    """`owner add` and `redis-acl`."""
    owner = sub.add_parser("owner", help="owners' keys (operator side: needs the fleet key)")
    verbs = owner.add_subparsers(dest="verb", required=True, metavar="VERB")
    add = verbs.add_parser("add", help="print the owner key of NAME: a client holding it "
                           "acts as NAME only and reads NAME's records only")
    add.add_argument("name", metavar="NAME", help="the owner (1-64 letters, digits, _.:@-; "
                     "no '::', which names a sub-owner)")
    add.add_argument("--env", action="store_true",
                     help="print BASHFLEET_OWNER_KEY=... lines to hand over (with a local "
                     "fleet's BASHFLEET_REDIS_URL for clients, its clients' Redis user)")
    add.set_defaults(func="owners:cmd_owner_add")

    users = sub.add_parser("redis-acl", help="print the Redis ACL file of a fleet: the "
                           "workers' user and the clients' (deploy/OPERATIONS.md)")
    users.add_argument("--worker-password-file", required=True,
                       help="file holding the password of the workers' user")
    users.add_argument("--client-password-file", required=True,
                       help="file holding the password of the clients' user")
    users.set_defaults(func="owners:cmd_redis_acl")


def _add_swerex_command(sub: SubParsers) -> None:
    """`swerex`: SWE-ReX's runtime server over a workspace (its module, and SWE-ReX, load
    only when it runs)."""
    parser = sub.add_parser(
        "swerex", help="serve SWE-ReX's runtime protocol over a workspace (HTTP)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--host", help="make the workspace on this host")
    where.add_argument("--label", help="make it on a live host of this pool")
    parser.add_argument("--bind", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--auth-token", default=os.environ.get(SWEREX_TOKEN_VARIABLE),
                        help="the token clients send as X-API-Key "
                        f"(default ${SWEREX_TOKEN_VARIABLE})")
    parser.add_argument("--ttl", type=float, help="seconds the workspace lives unused")
    root = parser.add_mutually_exclusive_group()
    root.add_argument("--image", metavar="REF",
                      help="an OCI image whose root filesystem is the workspace's / (pulled "
                           "onto the host; it needs bash for SWE-ReX's sessions)")
    root.add_argument("--build", metavar="DIR",
                      help="a local directory with a Dockerfile, built on the host: the "
                           "image of the workspace's /")
    parser.add_argument("--user", help="who the calls run as inside (default: the image's "
                                       "USER, else root)")
    parser.set_defaults(func="bashfleet.client.integrations.swerex_server:run")
