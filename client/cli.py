"""The `bashfleet` command: a local fleet, a worker, and every call a person makes.

Readable text for people, `--json` for scripts. `run` exits with the command's own
status (128+N when a signal ended it, 124 on a timeout kill, 125 for a system error,
130 after Ctrl-C: `bashfleet.client.exit_status`, the one mapping), so `bashfleet run 'make test'
&& deploy` works as with plain bash: a timeout kills the command unless
`--background-on-timeout` says otherwise. Ctrl-C, `--follow` and stdin:
`bashfleet.client.foreground`. A reader that goes away (`bashfleet schema | head`) ends any
command quietly with 141, as SIGPIPE ends `yes | head`'s `yes`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TextIO, cast

from bashfleet.client import exit_status as statuses
from bashfleet.client import images_cli, owner_cli, snapshot_cli, workspace_cli
from bashfleet.client.exit_status import SYSTEM_ERROR as EXIT_SYSTEM_ERROR
from bashfleet.client.exit_status import TIMEOUT as EXIT_TIMEOUT
from bashfleet.client.exit_status import USAGE as EXIT_USAGE
from bashfleet.worker.wire.control import NO_LINE, SessionOutput
from bashfleet.worker.wire.models import (
    CallResult,
    CheckResult,
    HostInfo,
    Policy,
    RunRequest,
    TruncationInfo,
)

if TYPE_CHECKING:
    from pydantic import BaseModel

    from bashfleet.client.dialects import Dialect
    from bashfleet.client.fleet import Fleet
    from bashfleet.client.foreground import ForegroundRun, Stream
    from bashfleet.worker.wire.events import JobEvent

    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

#: The dialects `schema` and `mcp` take, and `schema`'s styles (`bashfleet.client.dialects.DIALECTS`
#: and `bashfleet.client.dialects.base.SCHEMA_STYLES`, which a unit test holds these to: importing
#: the dialects here would slow every `bashfleet --help`).
DIALECT_NAMES = ("claude", "claude-code", "codex", "modes", "native", "pi", "pipe")
SCHEMA_STYLES = ("anthropic", "openai", "openai-responses", "mcp", "function")

#: What a CLI user does when no fleet answers (not the Python API's `redis_url=`).
NO_FLEET_HINT = (
    "start a local fleet with `bashfleet up`, or set BASHFLEET_REDIS_URL to the Redis "
    "of a running fleet"
)


class NoFleet(Exception):  # noqa: N818 - said to a person as is
    """No fleet is configured or reachable: the CLI's words for it."""


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def _fleet() -> Fleet:
    """The fleet client of a person's CLI: the admin key when one is configured (or the
    local fleet's), so `check`, `kill`, `output` and `ps --all` reach every owner's jobs.
    NoFleet when none is configured (no URL and no `bashfleet up` running)."""
    from bashfleet.client.fleet import Fleet, resolve_url  # noqa: PLC0415 - keep `--help` fast

    if not resolve_url():
        raise NoFleet(f"no fleet to talk to: {NO_FLEET_HINT}")
    # No URL handed over: a client that found the local fleet finds it again where it
    # must (`bashfleet events` across a `down` and `up` hears the new fleet).
    return Fleet(admin=True)


# ------------------------------------------------------------------------------ run


class Spinner(io.TextIOBase):
    """A spinner on stderr while a foreground call runs (only at a terminal), naming the
    call's host once it is known (`label()` is asked at each frame).

    It stands in for `sys.stderr` while it spins: whatever else is written there (the
    Ctrl-C notice, a warning) first stops it for good and clears its line, so a spinner
    line is never left behind nor drawn over a message.
    """

    FRAME_S = 0.1

    def __init__(self, label: Callable[[], str], out: TextIO) -> None:
        super().__init__()
        self._label = label
        self._out = out
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._drawn = False
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._spin, name="bashfleet-spinner",
                                        daemon=True)

    def _spin(self) -> None:
        for frame in itertools.cycle("|/-\\"):
            if self._done.wait(self.FRAME_S):
                return
            label = self._label()
            with self._lock:
                if self._done.is_set():
                    return
                took = time.monotonic() - self._started
                self._out.write(f"\r\033[K{frame} {label} {took:5.1f}s")
                self._out.flush()
                self._drawn = True

    def stop(self) -> None:
        """Stop spinning and clear the spinner's line (once; safe from any thread)."""
        with self._lock:
            if not self._done.is_set():
                self._done.set()
                if self._drawn:
                    self._out.write("\r\033[K")
                    self._out.flush()

    def write(self, text: str) -> int:
        """Someone else speaks on stderr: the spinner gives way first."""
        self.stop()
        return self._out.write(text)

    def flush(self) -> None:
        self._out.flush()

    def isatty(self) -> bool:
        return self._out.isatty()

    def fileno(self) -> int:
        return self._out.fileno()

    @contextlib.contextmanager
    def spinning(self) -> Iterator[None]:
        """Spin (standing in for sys.stderr) until the block ends, however it ends."""
        previous = sys.stderr
        sys.stderr = cast("TextIO", self)
        self._thread.start()
        try:
            yield
        finally:
            self.stop()
            self._thread.join()
            sys.stderr = previous


class HostLabel:
    """The spinner's words: `queued on HOST` while the call waits in that host's queue,
    `running on HOST` once a worker took it, `waiting for a host` while it waits for
    any (asked of the fleet at most every LOOKUP_S, until it runs)."""

    LOOKUP_S = 0.5

    def __init__(self, fleet: Fleet, call_id: str, host: str | None) -> None:
        self._fleet = fleet
        self._call_id = call_id
        self._host = host
        self._started = False
        self._next = 0.0

    def __call__(self) -> str:
        now = time.monotonic()
        if not self._started and now >= self._next:
            self._next = now + self.LOOKUP_S
            with contextlib.suppress(Exception):  # a spinner's words never fail a call
                progress = self._fleet.call_progress(self._call_id)
                self._host = progress.host or self._host
                self._started = progress.started
        if self._host is None:
            return "waiting for a host"
        return f"{'running' if self._started else 'queued'} on {self._host}"


def _spinner(
    fleet: Fleet, run: ForegroundRun, host: str | None
) -> contextlib.AbstractContextManager[None]:
    """A spinner for a foreground call at a terminal; nothing otherwise."""
    if not sys.stderr.isatty():
        return contextlib.nullcontext()
    return Spinner(HostLabel(fleet, run.call_id, host), sys.stderr).spinning()


def _notice(name: str, info: TruncationInfo | None, path: str | None, host: str) -> str | None:
    if info is None or not info.truncated:
        return None
    where = f" Full output: {path} on {host}" if path else ""
    return (
        f"[{name}: showing {info.shown_lines} of {info.total_lines} lines "
        f"({info.shown_bytes} of {info.total_bytes} bytes).{where}]"
    )


def print_result(result: CallResult, *, job_id_on_stdout: bool = True) -> None:
    """Print a call's result for a person: output on its streams, notices on stderr.

    A call that started a background job (`--mode background`, or one that went to the
    background) prints the job's id alone on stdout, last, so `X=$(bashfleet run --mode
    background CMD)` holds it: its output so far and how to check and kill it go to
    stderr. Not when the job's output is followed on stdout (`job_id_on_stdout=False`)."""
    id_only = result.job is not None and job_id_on_stdout
    if result.stdout:
        out = sys.stderr if id_only else sys.stdout
        out.write(result.stdout if result.stdout.endswith("\n") else result.stdout + "\n")
    if result.stderr:
        sys.stderr.write(result.stderr if result.stderr.endswith("\n") else result.stderr + "\n")
    spill = result.spill
    for name, info, path in (
        ("stdout", result.stdout_truncation, spill.stdout_path if spill else None),
        ("stderr", result.stderr_truncation, spill.stderr_path if spill else None),
    ):
        line = _notice(name, info, path, result.host)
        if line:
            print(line, file=sys.stderr)
    if result.error_digest:
        print("[errors in the cut part:]", file=sys.stderr)
        for line in result.error_digest:
            print(f"  {line}", file=sys.stderr)
    if result.cancelled:
        print("[call cancelled; its processes were killed]", file=sys.stderr)
    elif result.error is not None:
        print(f"bashfleet: {result.error.kind}: {result.error.message}", file=sys.stderr)
    if result.timed_out and not result.backgrounded:
        print(f"[timed out after {result.duration_s:.1f}s; processes killed. More time: "
              "--timeout S or --mode slow; to leave it running instead: "
              "--background-on-timeout]", file=sys.stderr)
    if result.job is not None:
        job = result.job
        print(
            f"[job {job.id} running on {job.host} (pid {job.pid}); "
            f"output: {job.output_path}; `bashfleet check {job.id}`, `bashfleet kill {job.id}`]",
            file=sys.stderr, flush=True,
        )
        if job_id_on_stdout:
            print(job.id, flush=True)


def _run_request(args: argparse.Namespace) -> RunRequest:
    """The RunRequest of `bashfleet run`'s arguments (a bad one: CallRejected)."""
    from bashfleet.client.fleet import run_request  # noqa: PLC0415 - keep `bashfleet --help` fast

    options: dict[str, Any] = {
        "host": args.host, "mode": args.mode, "timeout": args.timeout, "cwd": args.cwd,
        "session": args.session, "isolation": args.isolation, "network": args.network,
        "tags": _tag_filter(args.tag), "workspace": args.workspace,
    }
    if args.mode != "background":
        # A person's (or a script's) `run` fails at its timeout, as `timeout(1)` does:
        # `run 'make' && deploy` must never deploy an unfinished build.
        on_timeout = "background" if args.background_on_timeout else "kill"
        options["policy"] = Policy(name="cli", on_timeout=on_timeout)
    return run_request(" ".join(args.command), options)


def cmd_run(args: argparse.Namespace) -> int:
    from bashfleet.client import attach  # noqa: PLC0415
    from bashfleet.client.foreground import ForegroundRun, StdinWatch  # noqa: PLC0415

    if args.image or args.build:
        return _run_in_new_workspace(args)

    if args.tty or (not args.no_stdin and attach.piped_stdin()):
        return _run_interactive(args, tty=args.tty)
    fleet = _fleet()
    request = _run_request(args)
    if args.mode == "background":
        StdinWatch().check()
        return _report_run(fleet, fleet.execute(request), args)
    run = ForegroundRun(fleet, request, follow=args.follow and not args.json)
    quiet = args.json or args.follow
    with contextlib.nullcontext() if quiet else _spinner(fleet, run, args.host):
        outcome = run.run()
    if outcome.result is None:
        return outcome.status if outcome.status is not None else EXIT_SYSTEM_ERROR
    result = outcome.result
    if run.follower is not None:
        result = run.follower.finish(result)
        if result.job is not None and outcome.status is None:
            print_result(result, job_id_on_stdout=False)
            return _follow(fleet, result.job.id, stderr=keeps_stderr(fleet, result),
                           offsets=run.follower.offsets())
    status = _report_run(fleet, result, args)
    return outcome.status if outcome.status is not None else status


def _run_in_new_workspace(args: argparse.Namespace) -> int:
    """`run --image`/`--build`: the call in a workspace made for it from the image,
    deleted after it unless a job of the call still runs there (then its TTL ends it)."""
    if args.workspace or args.session:
        print("bashfleet run: --image and --build make a workspace of their own: not with "
              "--workspace or --session", file=sys.stderr)
        return EXIT_USAGE
    fleet = _fleet()
    workspace = fleet.workspace(host=args.host, image=args.image, build=args.build,
                                user=args.user, isolation=args.isolation, network=args.network,
                                ttl_s=RUN_IMAGE_TTL_S)
    args.workspace, args.image, args.build = workspace.id, None, None
    try:
        return cmd_run(args)
    finally:
        if any(job.running for job in workspace.jobs()):
            print(f"[workspace {workspace.id} stays while its job runs; "
                  f"`bashfleet workspace rm {workspace.id}` ends it]", file=sys.stderr)
        else:
            workspace.delete()


#: How long a workspace `run --image` made lives unused when a job of the call runs on.
RUN_IMAGE_TTL_S = 24 * 3600.0


def _report_run(fleet: Fleet, result: CallResult, args: argparse.Namespace) -> int:
    """Print a call's result (or follow the job it started); the exit status."""
    if args.json:
        print(result.model_dump_json(indent=2))
        return statuses.of_call(result)
    if not (args.follow and result.job is not None):
        print_result(result)
        hint = cwd_hint(result, args.cwd)
        if hint:
            print(hint, file=sys.stderr)
        return statuses.of_call(result)
    # Following streams the job's files from their first byte: showing the call's own
    # (possibly cut) output first would repeat it. Its notices still go to stderr.
    print_result(result.model_copy(update={
        "stdout": "", "stderr": "", "stdout_truncation": None, "stderr_truncation": None,
    }), job_id_on_stdout=False)
    return _follow(fleet, result.job.id, stderr=keeps_stderr(fleet, result))


def keeps_stderr(fleet: Fleet, result: CallResult) -> bool:
    """Whether the job a call started keeps its stderr in a file of its own, to follow
    apart from its stdout: a call that went on as a job does (its spill files); a job
    started in the background does where its host writes one (asked of the host: today
    they write both streams to one file, and that is all there is to follow)."""
    from bashfleet.client.errors import UnknownJob  # noqa: PLC0415

    if result.spill is not None and result.spill.stderr_path is not None:
        return True
    if result.job is None:
        return False
    try:
        fleet.read_output(result.job.id, offset=0, limit=1, stream="stderr")
    except UnknownJob:  # "no separate stderr"
        return False
    return True


#: Directories every workspace has of its own, whatever the host holds there.
PRIVATE_DIRS = ("/tmp", "/var/tmp")


def cwd_hint(result: CallResult, cwd: str | None) -> str | None:
    """Why a `--cwd` the call's workspace has no such directory for may exist all the
    same (on the host, on this machine): a line for the person, or None."""
    if result.error is None or result.error.kind != "bad_cwd" or not cwd:
        return None
    path = os.path.normpath(cwd)
    private = next((d for d in PRIVATE_DIRS if path == d or path.startswith(d + "/")), None)
    if private is not None:
        return (f"[{private} in a workspace is its own: the host's {private} is not seen "
                "there. A directory a call starts in must be in its view: under a root "
                "the host allows as workspaces (its BASHFLEET_WORKSPACE_ALLOW), or made in "
                "the workspace]")
    if os.path.isdir(path):
        return (f"[{path} is here on this machine, but not in the workspace's view: its "
                "calls see the host read-only but for bashfleet's state and other "
                "workspaces, and /tmp, /var/tmp and HOME of their own; a project "
                "directory is one under a root the host allows (BASHFLEET_WORKSPACE_ALLOW)]")
    return None


def _follow(
    fleet: Fleet, job_id: str, *, stderr: bool = False, offsets: dict[str, int] | None = None
) -> int:
    """Stream a job's output until it ends, every byte once and in order; its exit status.

    The bytes come from `read_output`, exact slices at our own offsets: a check cuts
    what it shows (2000 lines by default) and reads from the offset of anyone's last
    check. Checks only tell whether the job still runs; they read from our offset and
    keep nothing (`grep` matches no line). A job's end is known before the final read,
    so the last bytes it wrote are never missed. The completion line the worker
    appends to the output file is not the job's output: its status goes to stderr.
    `stderr`: the job keeps a separate stderr file (an auto-backgrounded call);
    `offsets`: where to start in each file (what following the call printed already).
    """
    completion = re.compile(r"\n\n\[background process (?:completed|failed: [^\]\n]*)\]\n\Z")
    targets: list[tuple[Stream, TextIO]] = [("stdout", sys.stdout)]
    if stderr:
        targets.append(("stderr", sys.stderr))
    offsets = {name: (offsets or {}).get(name, 0) for name, _ in targets}
    held = dict.fromkeys(offsets, "")  # a tail that looks like the completion line

    def drain(name: Stream, out: TextIO) -> bool:
        """Write what the stream has past our offset; True when anything was new."""
        start = offsets[name]
        while True:
            chunk = fleet.read_output(job_id, offset=offsets[name], limit=1 << 20, stream=name)
            text, offsets[name] = held[name] + chunk.text, chunk.next_offset
            # Held back until the job is known to have ended (then it is dropped).
            match = completion.search(text) if chunk.eof else None
            held[name] = match.group(0) if match else ""
            out.write(text[: match.start()] if match else text)
            out.flush()
            if chunk.eof or chunk.next_offset == chunk.offset:
                return offsets[name] > start

    delay = 0.05
    try:
        while True:
            state: CheckResult = fleet.check(job_id, offset=offsets["stdout"], grep=NO_LINE)
            moved = [drain(name, out) for name, out in targets]
            if not state.running:
                _print_check(state.model_copy(update={"output": "", "stderr_output": ""}))
                return statuses.of_process(state.exit_code, state.signal)
            delay = 0.05 if any(moved) else min(delay * 2, 0.5)
            time.sleep(delay)  # polling a remote job: back off while it is quiet
    except KeyboardInterrupt:
        print(f"\n[stopped following; job {job_id} keeps running: "
              f"`bashfleet kill {job_id}` ends it]", file=sys.stderr)
        return statuses.INTERRUPTED


# ------------------------------------------------------ interactive: tty, stdin, attach


def _session_status(out: SessionOutput | None) -> int:
    """The exit status of `run --tty` / piped `run` / `attach` for the job's last output."""
    if out is None:
        return 0  # detached: it runs on
    return statuses.of_process(out.exit_code, out.signal)


def _run_interactive(args: argparse.Namespace, *, tty: bool) -> int:
    """`run --tty` (a PTY job, this terminal attached) or `run` with piped stdin (a pipe
    job, stdin forwarded, output streamed): the command's exit status."""
    from bashfleet.client import attach  # noqa: PLC0415

    if args.json or args.follow or args.mode != "default":
        print("bashfleet run: --tty and piped stdin take no --json, --follow or --mode "
              "(pass --no-stdin to run without forwarding stdin)", file=sys.stderr)
        return EXIT_USAGE
    fleet = _fleet()
    from bashfleet.client.attach import window_size  # noqa: PLC0415

    found = window_size(0) if tty else None
    size = {"rows": found[0], "cols": found[1]} if found else None
    result = fleet.run(
        " ".join(args.command), host=args.host, mode="background", cwd=args.cwd,
        session=args.session, isolation=args.isolation, network=args.network,
        tags=_tag_filter(args.tag), stdin="pty" if tty else "pipe", term_size=size,
        workspace=args.workspace,
        check=False,
    )
    if result.job is None:
        print_result(result)
        return statuses.of_call(result)
    try:
        if tty:
            last = attach.attach(fleet, result.job.id)
        else:
            last = attach.forward_stdin(fleet, result.job.id)
    except KeyboardInterrupt:
        print(f"\n[job {result.job.id} keeps running: `bashfleet attach {result.job.id}`, "
              f"`bashfleet kill {result.job.id}`]", file=sys.stderr)
        return statuses.INTERRUPTED
    return _session_status(last)


def cmd_attach(args: argparse.Namespace) -> int:
    from bashfleet.client import attach  # noqa: PLC0415

    key = attach.parse_detach_key(args.detach_key)  # ValueError: a usage error
    last = attach.attach(_fleet(), args.id, detach_key=key,
                         header=f"[attached to job {args.id}; {attach.key_name(key)} detaches]")
    if last is not None:
        print(f"\r\n[job {args.id} ended: {_ending_text(last)}]", file=sys.stderr)
    return _session_status(last)


def _ending_text(out: SessionOutput) -> str:
    if out.signal is not None:
        return f"killed by signal {out.signal}"
    return f"exit code {out.exit_code}" if out.exit_code is not None else "exit status unknown"


def cmd_write(args: argparse.Namespace) -> int:
    from bashfleet.worker.wire.control import Collect  # noqa: PLC0415

    collect = Collect(wait_s=args.wait, settle_s=0.3, input_wait_s=2.0)
    fleet = _fleet()
    if args.close and not args.text:
        # Only the end of input: no line was given, so none is sent before it.
        out = fleet.close_stdin(args.id, collect=collect)
    else:
        text = " ".join(args.text) + ("" if args.no_newline else "\n")
        out = fleet.write_stdin(args.id, text, collect=collect)
        if args.close:
            out = fleet.close_stdin(args.id, collect=collect)
    if args.json:
        print(out.model_dump_json(indent=2))
        return 0
    if out.output:
        sys.stdout.write(out.output if out.output.endswith("\n") else out.output + "\n")
    state = "running" if out.running else _ending_text(out)
    if out.input_wait is not None:
        state += f"; waiting for input after printing {json.dumps(out.input_wait.prompt)}"
    print(f"[job {out.id} on {out.host}: {state}]", file=sys.stderr)
    return 0


# ----------------------------------------------------------------------- check, kill


def _print_check(check: CheckResult) -> None:
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
    check = _fleet().check(args.id, grep=args.grep)
    if args.json:
        print(check.model_dump_json(indent=2))
    else:
        _print_check(check)
    return 0


def cmd_kill(args: argparse.Namespace) -> int:
    check = _fleet().kill(args.id)
    if args.json:
        print(check.model_dump_json(indent=2))
    else:
        _print_check(check)
    return 0


def cmd_output(args: argparse.Namespace) -> int:
    chunk = _fleet().read_output(args.id, offset=args.offset, limit=args.limit, grep=args.grep,
                                 stream=args.stream)
    sys.stdout.write(chunk.text)
    if not chunk.eof:
        print(
            f"[bytes {chunk.offset}-{chunk.next_offset} of {chunk.size}; "
            f"next: bashfleet output {args.id} --offset {chunk.next_offset}"
            f"{' --stream stderr' if args.stream == 'stderr' else ''}]",
            file=sys.stderr,
        )
    return 0


# ---------------------------------------------------------------------- ps, hosts


def _table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def _blank(value: object) -> object:
    return "-" if value is None else value


def _exit_column(exit_code: object, signal_number: object) -> object:
    """`ps`'s EXIT: the exit code, or the signal that ended the job (`SIGTERM`)."""
    if exit_code is None and isinstance(signal_number, int):
        try:
            return signal.Signals(signal_number).name
        except ValueError:
            return f"signal {signal_number}"
    return _blank(exit_code)


def _dump(item: BaseModel) -> dict[str, Any]:
    return item.model_dump(mode="json")


def _tag_filter(pairs: Sequence[str] | None) -> dict[str, str]:
    """`--tag NAME=VALUE` options as a mapping; ValueError for one without `=`."""
    tags: dict[str, str] = {}
    for pair in pairs or ():
        name, equals, value = pair.partition("=")
        if not equals or not name:
            raise ValueError(f"--tag takes NAME=VALUE, not {pair!r}")
        tags[name] = value
    return tags


def cmd_ps(args: argparse.Namespace) -> int:
    jobs = _fleet().jobs(
        host=args.host, all_owners=args.all, tags=_tag_filter(args.tag), owner=args.owner
    )
    if args.json:
        _print_json([_dump(job) for job in jobs])
        return 0
    rows = []
    for job in jobs:
        data = _dump(job)
        state = data.get("state") or ("running" if data.get("running") else "ended")
        rows.append(
            [data.get("id"), data.get("host"), data.get("pid"), state,
             _exit_column(data.get("exit_code"), data.get("signal")),
             str(data.get("command", ""))[:60]]
        )
    print(_table(rows, ["ID", "HOST", "PID", "STATE", "EXIT", "COMMAND"]) if rows else "no jobs")
    return 0


def isolation_text(sandbox: dict[str, Any] | None) -> str:
    """A host's isolation in a few words: `process, cgroup v1`; `NONE` when its calls
    run unsandboxed (the reason goes under the table); `?` for a worker that does not say."""
    if not sandbox:
        return "?"
    level = sandbox.get("isolation") or "?"
    parts = ["NONE" if level == "none" else level]
    parts.append(f"cgroup {sandbox['cgroup']}" if sandbox.get("cgroup") else "ulimit")
    if level != "none" and sandbox.get("tenancy") == "multi":
        parts.append("ids per workspace")
    elif level != "none":
        # Every workspace of the host runs as one uid: one tenant's processes, files and
        # keyring are another's to reach (README "Security").
        parts.append("single-tenant: one uid for every workspace")
    if sandbox.get("run_as") and sandbox.get("tenancy") != "multi":
        parts.append(f"as {sandbox['run_as']}")
    if sandbox.get("network"):
        parts.append(f"network {sandbox['network']}"
                     + (" (host allowed)" if sandbox.get("network_host") else ""))
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
        view = _fleet().wait(args.id, timeout=args.timeout)
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
    stream = _fleet().events(host=args.host, kinds=kinds, tags=_tag_filter(args.tag),
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


def cmd_hosts(args: argparse.Namespace) -> int:
    fleet = _fleet()
    known = fleet.hosts()
    hosts = shown_hosts(known, time.time(), all_hosts=args.all)
    if len(hosts) < len(known):
        hidden = len(known) - len(hosts)
        print(f"[{hidden} host(s) dead for more than {DEAD_HOST_SHOWN_S / 3600:g} h not "
              "shown: --all lists them]", file=sys.stderr)
    if args.json:
        _print_json([_dump(host) for host in hosts])
        return 0
    rows = []
    for host in hosts:
        data = _dump(host)
        rows.append(
            [data.get("host"), "alive" if data.get("alive") else "dead",
             f"{data.get('busy', 0)}/{data.get('slots', 0)}", data.get("queued", 0),
             ",".join(data.get("labels") or []) or "-", isolation_text(data.get("sandbox"))]
        )
    if not rows:
        print("no hosts")
        return 0
    print(_table(rows, ["HOST", "STATE", "BUSY/SLOTS", "QUEUED", "LABELS", "ISOLATION"]))
    for host in hosts:
        sandbox = _dump(host).get("sandbox") or {}
        for problem in (sandbox.get("problem"), sandbox.get("cgroup_problem")):
            if problem and host.alive:
                print(f"{host.host}: {problem}", file=sys.stderr)
    # Calls for any host (or any of a pool) wait in queues no row above counts.
    shared = fleet.shared_queues()
    print("queued for any host: " + ", ".join(
        f"{name.removeprefix('bashfleet.').removesuffix('.exec')} {count}"
        for name, count in shared.items()
    ))
    return 0


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
    for warning in local.unsandboxed_warnings(_fleet().hosts(), hosts):
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
    fleet = _fleet()
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


#: Subcommands that run the build machine's own side, by module: their arguments are
#: that module's (`bashfleet worker --help` is the supervisor's own help).
WORKER_SIDE = {
    "worker": ("bashfleet.worker.fleet.supervisor",
               "serve calls on this machine (--host, --concurrency, --label)"),
    "gc": ("bashfleet.worker.retention", "remove old spill and job files of this machine's worker "
           "(--dry-run, --json, --max-age, --max-bytes)"),
}


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
    _print_json(tools[args.dialect] if args.dialect else tools)
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
    from bashfleet.worker.settings import Settings  # noqa: PLC0415

    mcp_server.serve(dialect, session, host=args.host, cwd=args.cwd,
                     resumable=args.session is not None, started_by=Settings().owner_name(),
                     made_of={"image": args.image, "build": args.build, "user": args.user})
    return 0


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
    workspace_cli.add_commands(sub)
    images_cli.add_commands(sub)
    snapshot_cli.add_commands(sub)
    owner_cli.add_owner_commands(sub)
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
    up.set_defaults(func=cmd_up)

    down = sub.add_parser("down", help="stop the local fleet and end what its hosts run")
    down.set_defaults(func=cmd_down)

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
    check.set_defaults(func=cmd_check)

    kill = sub.add_parser("kill", help="kill a background job")
    kill.add_argument("id", help="job id (or the id of the call that started it)")
    kill.add_argument("--json", action="store_true",
                      help="print the job's final check as JSON")
    kill.set_defaults(func=cmd_kill)

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
    output.set_defaults(func=cmd_output)

    ps = sub.add_parser("ps", help="list background jobs")
    ps.add_argument("--host", help="only jobs of this host")
    ps.add_argument("--all", action="store_true",
                    help="every owner's jobs (needs the admin key), not only this user's")
    ps.add_argument("--tag", action="append", metavar="NAME=VALUE",
                    help="only jobs with this tag (repeatable: all of them)")
    ps.add_argument("--owner", help="only jobs of this owner")
    ps.add_argument("--json", action="store_true", help="print the jobs as a JSON list")
    ps.set_defaults(func=cmd_ps)

    hosts = sub.add_parser("hosts", help="list hosts and their load")
    hosts.add_argument("--all", action="store_true", help="also hosts dead for more than an "
                       "hour (their records expire a day after their last heartbeat)")
    hosts.add_argument("--json", action="store_true", help="print the hosts as a JSON list")
    hosts.set_defaults(func=cmd_hosts)


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
    workspace_cli.add_image_options(run)
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
    workspace_cli.add_network_options(run)
    run.add_argument("--tag", action="append", metavar="NAME=VALUE",
                     help="a tag of the job it starts (repeatable; ps, wait and events see it)")
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument("command", nargs=argparse.REMAINDER, help="the bash command")
    run.set_defaults(func=cmd_run)
    return run


def _add_event_commands(sub: SubParsers) -> None:
    """`wait` and `events`: job ends, heard from any client."""
    wait = sub.add_parser("wait", help="wait until a background job ends; exit with its status")
    wait.add_argument("id", help="job id (or the id of the call that started it)")
    wait.add_argument("--timeout", type=float, help="give up after S seconds (exit 124)")
    wait.add_argument("--json", action="store_true", help="print the job's final view")
    wait.set_defaults(func=cmd_wait)

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
    events.set_defaults(func=cmd_events)


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
    write.set_defaults(func=cmd_write)

    attach = sub.add_parser("attach", help="attach this terminal to an interactive job")
    attach.add_argument("id", help="job id")
    attach.add_argument("--detach-key", default="^]", metavar="KEY",
                        help=f"the key that detaches, leaving the job running (default ^], "
                        f"Ctrl-]): {DETACH_KEY_FORMAT}".replace("%", "%%"))
    attach.set_defaults(func=cmd_attach)


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
    schema.set_defaults(func=cmd_schema)

    mcp = sub.add_parser("mcp", help="serve a dialect's tools over MCP (stdio)")
    mcp.add_argument("--dialect", required=True, metavar="DIALECT",
                     help=f"the dialect served: {dialects}")
    mcp.add_argument("--session", help="session id to create or resume (default: a new one)")
    mcp.add_argument("--host", help="pin the session to this host (default: its first host)")
    mcp.add_argument("--cwd", help="the session's working directory on the host")
    workspace_cli.add_image_options(mcp)
    mcp.set_defaults(func=cmd_mcp)


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
    parser = build_parser()
    try:
        args, rest = _parse(parser, argv)
    except BrokenPipeError:
        # `--help` into a reader that went (`| head -1`): Python 3.11.2's argparse lets the
        # failed write through, later ones drop it themselves.
        return _reader_gone()
    if args.cmd in WORKER_SIDE:
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
        status: int = args.func(args)
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
    from bashfleet.client.errors import BashfleetError, FleetUnavailable  # noqa: PLC0415

    if isinstance(exc, ValidationError) and exc.title == "Settings":
        # A BASHFLEET_* variable's value: one line, not pydantic's paragraphs.
        text, status = f"bashfleet: {settings_problem(exc)}", EXIT_USAGE
    elif isinstance(exc, NoFleet):
        text, status = f"bashfleet: {exc}", EXIT_SYSTEM_ERROR
    elif isinstance(exc, FleetUnavailable):
        text, status = (f"bashfleet: {exc}\nbashfleet: is the fleet up? {NO_FLEET_HINT}",
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


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
