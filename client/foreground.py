"""A foreground call as a person at a terminal runs it (`bashfleet run`): Ctrl-C, live
output, and a word about stdin.

- Ctrl-C cancels the remote call: after DETACH_WINDOW_S (the time to change one's mind)
  the call is cancelled on its host (`Fleet.cancel`: withdrawn if queued, its processes
  killed, its slot freed), its output so far is shown, and `run` exits 130. A second
  Ctrl-C within that window leaves it running as a background job instead
  (`Fleet.detach`): its id and how to reach and end it are printed. A third stops
  waiting altogether. SIGTERM (a CI runner stopping the job) cancels at once.
- `--follow` streams the output as the host writes it (the call's spill files, read
  through the fleet), complete lines only, every byte once; when the call ends, what is
  left comes from its result (or its kept files), and a call that went on as a job is
  followed on.
- The command's stdin is /dev/null on its host: data piped (or redirected) into
  `bashfleet run` is never read, so a warning says so as soon as there is some; at a
  terminal, once the person types something the command will not get.

The call runs in a thread; the main thread waits for it, so signals are handled at once
whatever the call is doing.
"""

from __future__ import annotations

import os
import select
import signal
import stat
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TextIO

from bashfleet.client import exit_status
from bashfleet.client._core.sending import new_call_id
from bashfleet.client.errors import BashfleetError, UnknownJob

if TYPE_CHECKING:
    from bashfleet.client.cli.plain import Handover
    from bashfleet.worker.wire.models import CallResult, OutputChunk, RunRequest

#: After a first Ctrl-C, how long a second one may still leave the call running as a job.
DETACH_WINDOW_S = 1.0
#: How often the waiting loop wakes (signals, followed output, typed input).
TICK_S = 0.1
#: Longest pause between two reads of a followed call's output (backing off while quiet).
FOLLOW_MAX_DELAY_S = 0.5
#: Bytes read per slice of followed output.
FOLLOW_SLICE_BYTES = 1 << 20
#: After SIGTERM, how long the cancelled call's answer is waited for.
TERM_WAIT_S = 10.0
#: `run`'s status after Ctrl-C (128 + SIGINT) and after SIGTERM (128 + SIGTERM), as bash's.
EXIT_INTERRUPTED = exit_status.INTERRUPTED
EXIT_TERMINATED = exit_status.TERMINATED

Stream = Literal["stdout", "stderr"]


def say(text: str) -> None:
    """A line for the person, on stderr."""
    print(text, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- stdin


def stdin_kind() -> Literal["terminal", "pipe", "file", "none"]:
    """What the CLI's stdin is: a terminal, a pipe (or socket), a file with data, or
    nothing worth a word (/dev/null, an empty file, no stdin at all)."""
    try:
        if sys.stdin is None or sys.stdin.closed:
            return "none"
        fd = sys.stdin.fileno()
        if os.isatty(fd):
            return "terminal"
        info = os.fstat(fd)
    except (OSError, ValueError):
        return "none"
    if stat.S_ISFIFO(info.st_mode) or stat.S_ISSOCK(info.st_mode):
        return "pipe"
    return "file" if stat.S_ISREG(info.st_mode) and info.st_size > 0 else "none"


def piped_stdin(fd: int = 0) -> bool:
    """True when `fd` is a pipe, a socket or a file (data to forward), not a terminal,
    /dev/null or closed."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISREG(mode)


STDIN_NOTICE = (
    "bashfleet: warning: the command's stdin is /dev/null on its host; {what} is not "
    "passed to it (put the data in a file on the host, or in the command)"
)


class StdinWatch:
    """Warns, once, when the CLI's stdin holds something the command will not get: a
    file with data, data in a pipe (an empty pipe, or one closed unwritten, is fine), or
    what a person types at the terminal while the call runs."""

    def __init__(self) -> None:
        self._kind = stdin_kind()
        if self._kind == "file":
            self._warn("the file `bashfleet run` reads as stdin")

    def _warn(self, what: str) -> None:
        self._kind = "none"
        say(STDIN_NOTICE.format(what=what))

    def check(self) -> None:
        """Look (without waiting) for input on a pipe or the terminal."""
        if self._kind not in ("pipe", "terminal"):
            return
        try:
            ready = bool(select.select([sys.stdin], [], [], 0)[0])
            # A pipe: read a byte (nobody else will) to tell data from its end.
            data = ready and (self._kind == "terminal" or bool(os.read(sys.stdin.fileno(), 1)))
        except (OSError, ValueError):
            self._kind = "none"
            return
        if data:
            self._warn("what is piped into `bashfleet run`" if self._kind == "pipe"
                       else "what you type here")
        elif ready:
            self._kind = "none"  # the pipe ended without data: nothing to say


# --------------------------------------------------------------------------- signals


class Interrupts:
    """Ctrl-C and SIGTERM, counted by handlers and acted on by the waiting loop.

    The classes here are plain ones, not dataclasses: `bashfleet run`'s plain path
    loads this module, and `dataclasses` loads `inspect`, which costs more than its
    call's round trip."""

    def __init__(self, sigint: int = 0, *, sigterm: bool = False) -> None:
        self.sigint = sigint
        self.sigterm = sigterm

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if signum == signal.SIGTERM:
            self.sigterm = True
        else:
            self.sigint += 1

    @contextmanager
    def installed(self) -> Iterator[Interrupts]:
        """Handle SIGINT and SIGTERM while the block runs (main thread only)."""
        previous = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


# ---------------------------------------------------------------------------- follow


class _FollowedStream:
    """One stream of a followed call: where reading stopped, what is printed."""

    def __init__(self, name: Stream, out: TextIO) -> None:
        self.name = name
        self.out = out
        self.offset = 0
        self.held = ""  # a last line still waiting for its newline
        self.printed_lines = 0


class Follower:
    """Streams a running call's output from its files on the host, complete lines only."""

    def __init__(self, fleet: Any, call_id: str,
                 streams: list[_FollowedStream] | None = None) -> None:
        self.fleet = fleet
        self.call_id = call_id
        self.streams = streams if streams is not None else []
        self._delay = 0.0
        self._next = 0.0

    @classmethod
    def of(cls, fleet: Any, call_id: str) -> Follower:
        """A follower of both streams (a call keeps stdout and stderr apart)."""
        return cls(fleet, call_id, [_FollowedStream("stdout", sys.stdout),
                                    _FollowedStream("stderr", sys.stderr)])

    def poll(self) -> None:
        """Print what is new, backing off while nothing is."""
        now = time.monotonic()
        if now < self._next:
            return
        moved = any([self._drain(stream, final=False) for stream in self.streams])
        self._delay = TICK_S if moved else min(max(self._delay, TICK_S) * 2, FOLLOW_MAX_DELAY_S)
        self._next = now + self._delay

    def _read(self, stream: _FollowedStream) -> OutputChunk | None:
        try:
            return self.fleet.read_output(  # type: ignore[no-any-return]
                self.call_id, offset=stream.offset, limit=FOLLOW_SLICE_BYTES, stream=stream.name
            )
        except UnknownJob:
            return None  # not started yet, or its output is kept in memory: nothing to read

    def _drain(self, stream: _FollowedStream, *, final: bool) -> bool:
        """Print the stream's new complete lines (all of it when `final`, the last line
        without a newline too, even when an earlier poll read it); True if any."""
        moved = False
        while (chunk := self._read(stream)) is not None and chunk.next_offset > stream.offset:
            stream.offset = chunk.next_offset
            complete, newline, stream.held = (stream.held + chunk.text).rpartition("\n")
            if newline:
                self._show(stream, complete + newline)
                moved = True
            if chunk.eof:
                break
        if final and stream.held:
            self._show(stream, stream.held)
            stream.held = ""
            moved = True
        return moved

    @staticmethod
    def _show(stream: _FollowedStream, text: str) -> None:
        stream.out.write(text)
        stream.out.flush()
        stream.printed_lines += text.count("\n")

    def finish(self, result: CallResult) -> CallResult:
        """Print the rest once the call answered; the result without what was printed.

        A call whose files were kept (its output was cut, or it went on as a job) is
        read to the end of its files; otherwise its result holds all of its output, of
        which the lines already printed are left out.
        """
        kept = result.spill is not None and result.spill.stdout_path is not None
        for stream in self.streams:
            if kept:
                self._drain(stream, final=True)
            else:
                text = result.stdout if stream.name == "stdout" else result.stderr
                rest = "".join(text.splitlines(keepends=True)[stream.printed_lines:])
                stream.out.write(rest)
                stream.out.flush()
        return result.model_copy(update={
            "stdout": "", "stderr": "", "stdout_truncation": None, "stderr_truncation": None,
        })

    def offsets(self) -> dict[str, int]:
        """Where each stream's reading stopped (to follow a job on from there)."""
        return {stream.name: stream.offset for stream in self.streams}


# ------------------------------------------------------------------------ the run


class Outcome(NamedTuple):
    """How a foreground run ended for the person: its result (None: not waited for) and
    the exit status it imposes (None: the command's own)."""

    result: CallResult | None = None
    status: int | None = None


class ForegroundRun:
    """One foreground call: sent from a thread, waited for in the main thread."""

    def __init__(self, fleet: Any, request: RunRequest, *, follow: bool,
                 sent: Handover | None = None) -> None:
        # The id is chosen before the call is sent, so a Ctrl-C at any moment reaches it.
        self.call_id = request.call_id or new_call_id()
        self.request = request.model_copy(update={"call_id": self.call_id})
        self.fleet = fleet
        # A call the CLI's plain path sent already: waited for, not sent again, with what
        # was pressed while the plain path waited.
        self.sent = sent
        self.follower = Follower.of(fleet, self.call_id) if follow else None
        self._done = threading.Event()
        self._result: CallResult | None = None
        self._error: BaseException | None = None
        self._first_ctrl_c: float | None = None
        # Ctrl-Cs counted when the cancel or detach went out (None: not yet). Only one
        # pressed after that stops the waiting: the result that names the job (or says
        # the call was cancelled) is still to come.
        self._acted_at: int | None = None

    def _send(self) -> None:
        try:
            if self.sent is None:
                self._result = self.fleet.execute(self.request, check=False)
            else:
                self._result = self.fleet.wait_sent(self.call_id, self.sent.queue,
                                                    self.sent.host, self.sent.channel)
        except BaseException as exc:  # handed to the main thread, raised there
            self._error = exc
        finally:
            self._done.set()

    def run(self) -> Outcome:
        """Send the call and wait for it, acting on Ctrl-C and SIGTERM."""
        typed = StdinWatch()
        typed.check()
        sender = threading.Thread(target=self._send, name="bashfleet-run", daemon=True)
        pressed = self.sent.interrupts if self.sent is not None else Interrupts()
        with pressed.installed() as interrupts:
            sender.start()
            while not self._done.wait(TICK_S):
                typed.check()
                if self.follower is not None:
                    self.follower.poll()
                cut_short = self._on_signals(interrupts)
                if cut_short is not None:
                    return cut_short
        if self._result is None:
            raise self._error or RuntimeError("the call ended without an answer")
        status = EXIT_INTERRUPTED if self._first_ctrl_c is not None else None
        return Outcome(result=self._result, status=status)

    def _on_signals(self, interrupts: Interrupts) -> Outcome | None:
        """Act on what was pressed since the last tick; an Outcome to stop waiting."""
        if interrupts.sigterm:
            self._cancel()
            self._done.wait(TERM_WAIT_S)
            return Outcome(result=self._result, status=EXIT_TERMINATED)
        if not interrupts.sigint:
            return None
        if self._first_ctrl_c is None:
            self._first_ctrl_c = time.monotonic()
            say(f"\n^C: cancelling call {self.call_id} in {DETACH_WINDOW_S:g}s; press "
                "Ctrl-C again to leave it running as a background job instead")
        elif self._acted_at is not None:
            if interrupts.sigint > self._acted_at:
                return self._stop_waiting()
        elif interrupts.sigint >= 3:
            return self._stop_waiting()
        elif interrupts.sigint == 2:
            self._acted_at = interrupts.sigint
            self._detach()
        elif time.monotonic() - self._first_ctrl_c > DETACH_WINDOW_S:
            self._acted_at = interrupts.sigint
            self._cancel()
        return None

    def _stop_waiting(self) -> Outcome:
        say(f"[no longer waiting for call {self.call_id}]")
        return Outcome(status=EXIT_INTERRUPTED)

    def _cancel(self) -> None:
        try:
            stopped = self.fleet.cancel(self.call_id)
        except BashfleetError as exc:
            say(f"bashfleet: could not cancel call {self.call_id}: {exc}")
            return
        if stopped:
            say(f"[cancelling call {self.call_id}: its processes are being killed]")

    def _detach(self) -> None:
        try:
            detached = self.fleet.detach(self.call_id)
        except BashfleetError as exc:
            say(f"bashfleet: could not leave call {self.call_id} running: {exc}")
            detached = False
        if detached:
            say(f"[leaving call {self.call_id} running as a background job]")
            return
        say(f"[call {self.call_id} cannot go on as a job (not running yet, or ended); "
            "cancelling it]")
        self._cancel()
