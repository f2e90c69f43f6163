"""`bashfleet run`: the call, its spinner while it waits and runs, its result as a
person or a script reads it, `--follow`, and the exit status it ends with.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TextIO, cast

from bashfleet.client import exit_status as statuses
from bashfleet.client.cli import common
from bashfleet.client.cli.results import print_result
from bashfleet.client.exit_status import SYSTEM_ERROR as EXIT_SYSTEM_ERROR
from bashfleet.client.exit_status import USAGE as EXIT_USAGE

if TYPE_CHECKING:
    from bashfleet.client.cli.plain import Handover, Line
    from bashfleet.client.fleet import Fleet
    from bashfleet.client.foreground import ForegroundRun, Stream
    from bashfleet.worker.wire.models import CallResult, CheckResult, RunRequest


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
        self.open_fleet = fleet
        self._call_id = call_id
        self._host = host
        self._started = False
        self._next = 0.0

    def __call__(self) -> str:
        now = time.monotonic()
        if not self._started and now >= self._next:
            self._next = now + self.LOOKUP_S
            with contextlib.suppress(Exception):  # a spinner's words never fail a call
                progress = self.open_fleet.call_progress(self._call_id)
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


def _run_request(args: argparse.Namespace) -> RunRequest:
    """The RunRequest of `bashfleet run`'s arguments (a bad one: CallRejected)."""
    from bashfleet.client.fleet import run_request  # noqa: PLC0415 - keep `bashfleet --help` fast
    from bashfleet.worker.wire.models import Policy  # noqa: PLC0415

    options: dict[str, Any] = {
        "host": args.host, "mode": args.mode, "timeout": args.timeout, "cwd": args.cwd,
        "session": args.session, "isolation": args.isolation, "network": args.network,
        "tags": common.tag_filter(args.tag), "workspace": args.workspace,
    }
    if args.mode != "background":
        # A person's (or a script's) `run` fails at its timeout, as `timeout(1)` does:
        # `run 'make' && deploy` must never deploy an unfinished build.
        on_timeout = "background" if args.background_on_timeout else "kill"
        options["policy"] = Policy(name="cli", on_timeout=on_timeout)
    return run_request(" ".join(args.command), options)


def cmd_run(args: argparse.Namespace) -> int:
    if args.image or args.build:
        if args.workspace or args.session:
            print("bashfleet run: --image and --build make a workspace of their own: not "
                  "with --workspace or --session", file=sys.stderr)
            return EXIT_USAGE
        # Its light case (`bashfleet.client.cli.plain_image`) makes, runs and ends the
        # workspace with no model built; what it cannot do comes here, nothing made.
        from bashfleet.client.cli import plain_image  # noqa: PLC0415

        ran = plain_image.run(args)
        return ran if ran is not None else _run_in_new_workspace(args)
    return run_call(args)


def run_call(args: argparse.Namespace, line: Line | None = None, host: str | None = None
             ) -> int:
    """`run`'s call (in the workspace or on the host named): `line` and `host`, the light
    connections and the workspace's host when `run --image` made it on them."""
    from bashfleet.client.cli import plain  # noqa: PLC0415
    from bashfleet.client.foreground import piped_stdin  # noqa: PLC0415

    if args.tty or (not args.no_stdin and piped_stdin()):
        # Loaded for these alone: a plain `run` needs neither the terminal relay nor the
        # control requests it speaks.
        from bashfleet.client.cli import interactive  # noqa: PLC0415

        return interactive.run_interactive(args, tty=args.tty)
    # The plain case (`bashfleet.client.cli.plain`): sent and, if it ends soon, answered
    # with no model built; what it cannot do comes here before anything is sent, and a
    # call that outlasts its wait is handed over to be waited for as any other.
    ran = plain.run(args, line, host)
    if isinstance(ran, int):
        return ran
    return _run_with_fleet(args, handover=ran)


def _run_with_fleet(args: argparse.Namespace, handover: Handover | None) -> int:
    """`run` through the fleet client: the call sent (or, `handover`, sent already by the
    plain path and waited for from here), its spinner, Ctrl-C, --follow, its result."""
    from bashfleet.client.foreground import ForegroundRun, StdinWatch  # noqa: PLC0415

    fleet = common.open_fleet(light=True)
    request = _run_request(args)
    if args.mode == "background":
        StdinWatch().check()
        return _report_run(fleet, fleet.execute(request), args)
    if handover is not None:
        request = request.model_copy(update={"call_id": handover.call_id})
    run = ForegroundRun(fleet, request, follow=args.follow and not args.json,
                        sent=handover)
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
    """`run --image`/`--build` through the fleet client: the call in a workspace made for
    it from the image, deleted after it unless a job of the call still runs there (then
    its TTL ends it)."""
    fleet = common.open_fleet(light=True)
    workspace = fleet.workspace(host=args.host, image=args.image, build=args.build,
                                user=args.user, isolation=args.isolation, network=args.network,
                                ttl_s=RUN_IMAGE_TTL_S, build_network=args.build_network)
    args.workspace, args.image, args.build = workspace.id, None, None
    try:
        return run_call(args)
    finally:
        if any(job.running for job in workspace.jobs()):
            print(stays_notice(workspace.id), file=sys.stderr)
        else:
            workspace.delete()


def stays_notice(ws_id: str) -> str:
    """What `run --image` says of the workspace it made when a job of its call runs on."""
    return (f"[workspace {ws_id} stays while its job runs; "
            f"`bashfleet workspace rm {ws_id}` ends it]")


#: How long a workspace `run --image` made lives unused when a job of the call runs on.
RUN_IMAGE_TTL_S = 24 * 3600.0


def _report_run(fleet: Fleet, result: CallResult, args: argparse.Namespace) -> int:
    """Print a call's result (or follow the job it started); the exit status."""
    if args.json:
        print(result.model_dump_json(indent=2))
        return statuses.of_call(result)
    if not (args.follow and result.job is not None):
        return report_plainly(result, args)
    # Following streams the job's files from their first byte: showing the call's own
    # (possibly cut) output first would repeat it. Its notices still go to stderr.
    print_result(result.model_copy(update={
        "stdout": "", "stderr": "", "stdout_truncation": None, "stderr_truncation": None,
    }), job_id_on_stdout=False)
    return _follow(fleet, result.job.id, stderr=keeps_stderr(fleet, result))


def report_plainly(result: CallResult | Mapping[str, Any], args: argparse.Namespace) -> int:
    """Print a call's result (the model, or its JSON data) for a person, with a hint about
    its cwd when it needs one; the exit status."""
    print_result(result)
    hint = cwd_hint(result, args.cwd)
    if hint:
        print(hint, file=sys.stderr)
    if isinstance(result, Mapping):
        return statuses.of_result(result)
    return statuses.of_call(result)


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


def cwd_hint(result: CallResult | Mapping[str, Any], cwd: str | None) -> str | None:
    """Why a `--cwd` the call's workspace has no such directory for may exist all the
    same (on the host, on this machine): a line for the person, or None. `result`: the
    model, or its JSON data."""
    if isinstance(result, Mapping):
        kind = (result.get("error") or {}).get("kind")
    else:
        kind = result.error.kind if result.error is not None else None
    if kind != "bad_cwd" or not cwd:
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
    # Loaded only when a job is followed: a plain `run` checks no job.
    from bashfleet.client.cli import jobs  # noqa: PLC0415
    from bashfleet.worker.wire.control import NO_LINE  # noqa: PLC0415

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
                jobs.print_check(state.model_copy(update={"output": "", "stderr_output": ""}))
                return statuses.of_process(state.exit_code, state.signal)
            delay = 0.05 if any(moved) else min(delay * 2, 0.5)
            time.sleep(delay)  # polling a remote job: back off while it is quiet
    except KeyboardInterrupt:
        print(f"\n[stopped following; job {job_id} keeps running: "
              f"`bashfleet kill {job_id}` ends it]", file=sys.stderr)
        return statuses.INTERRUPTED
