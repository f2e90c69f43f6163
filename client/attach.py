"""A person's terminal on an interactive job, and a local stdin forwarded to one.

    bashfleet attach j3f2c9a1b7d4e5f6        # keystrokes to the job's PTY, its output here
    bashfleet run --tty python3              # start a PTY job and attach to it
    printf 'a\\nb\\n' | bashfleet run 'sort -r'   # piped stdin forwarded, output streamed

`attach` puts the local terminal in raw mode and relays: every key goes to the job's
terminal (`write_stdin`, Ctrl-C included: it is the remote terminal's), the job's
output comes back as written (long-polled reads, `Collect(raw=True)`), and the local
window size follows (`resize` at start and on SIGWINCH). The detach key (Ctrl-] by
default) leaves the job running. The output is the bytes the job wrote, with the escape
sequences that could act on the local terminal beyond drawing (OSC: titles, clipboard
writes, hyperlinks; DCS, APC, PM, SOS) removed: a command may have been written by a
model under a prompt injection.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any, BinaryIO

from bashfleet.client.cli.arguments import DETACH_KEY_FORMAT
from bashfleet.worker.wire.control import Collect, SessionOutput
from bashfleet.worker.wire.models import ByteTail, TailLines

if TYPE_CHECKING:
    from bashfleet.client.fleet import Fleet

#: Ctrl-]: the detach key (telnet's), sent by no common program.
DETACH_KEY = b"\x1d"
#: Longest a read waits for output before asking again (a long poll).
POLL_S = 1.0
#: Bytes of local input forwarded at a time: one write the host takes whole or not at all
#: (`bashfleet.worker.engine.jobs.interactive.WRITE_CHUNK`), so a retry never sends anything twice.
CHUNK = 32 * 1024
#: A control string not terminated within this many bytes is dropped whole.
MAX_HELD = 4096
#: Bytes before the session's read offset searched for its current line, which a
#: terminal shows first when it attaches (`current_line`).
REPLAY_BYTES = 4096

#: The characters caret notation names, after `^`: Ctrl-@ (NUL) to Ctrl-_ (0x1f), ^? (DEL).
_CARET = re.compile(r"(?:\^|(?i:ctrl|c)[-+])([@A-Za-z\[\\\]^_?])")


def parse_detach_key(text: str) -> bytes:
    """The byte `--detach-key` names: `^]` / `^x` / `ctrl-x` / `C-x` (any case) for a
    control key, `\\x1d` (a Python escape), or one plain ASCII character. ValueError,
    saying the format, for anything else (`^x` once meant the two keys `^` then `x`)."""
    caret = _CARET.fullmatch(text)
    if caret is not None:
        char = caret.group(1)
        return b"\x7f" if char == "?" else bytes([ord(char.upper()) ^ 0x40])
    try:
        key = text.encode("ascii").decode("unicode_escape").encode("latin-1")
    except (UnicodeError, ValueError):
        key = b""
    if len(key) != 1 or key[0] > 0x7F:
        raise ValueError(f"--detach-key takes one key, not {text!r}: {DETACH_KEY_FORMAT}")
    return key


def key_name(key: bytes) -> str:
    """How a person reads a detach key: `Ctrl-]`, `Ctrl-X`, `DEL`, `'~'`."""
    if key == b"\x7f":
        return "DEL"
    if len(key) == 1 and key[0] < 0x20:
        return f"Ctrl-{chr(key[0] ^ 0x40)}"
    return repr(key.decode("latin-1"))


# A terminal control string: OSC (ESC ]), DCS (ESC P), SOS (ESC X), PM (ESC ^), APC (ESC _),
# 7- or 8-bit, ended by BEL (OSC) or ST (ESC \ or U+009C). The stream is UTF-8 bytes, as a
# UTF-8 terminal reads them: an 8-bit control is its code point's two bytes (C2 9D), never
# a lone 0x9D, which is a continuation byte of an ordinary character (`❯` is E2 9D AF):
# taken for an introducer, it made every byte after such a character vanish.
_C1_INTRO = rb"\xc2[\x90\x98\x9d\x9e\x9f]"
_PAYLOAD = rb"(?:[^\x07\x1b\xc2]|\xc2(?!\x9c))*"
_CONTROL_STRING = re.compile(
    rb"(?:\x1b[\]PX^_]|" + _C1_INTRO + rb")" + _PAYLOAD + rb"(?:\x07|\xc2\x9c|\x1b\\)"
)
_UNFINISHED = re.compile(
    rb"(?:\x1b[\]PX^_]|" + _C1_INTRO + rb")" + _PAYLOAD + rb"(?:\x1b|\xc2)?\Z|[\x1b\xc2]\Z"
)


@dataclass
class TerminalFilter:
    """Removes control strings from a stream of output chunks (one may span chunks)."""

    held: bytes = b""

    def feed(self, data: bytes) -> bytes:
        """What of `held + data` may reach the terminal now."""
        data = self.held + data
        self.held = b""
        data = _CONTROL_STRING.sub(b"", data)
        unfinished = _UNFINISHED.search(data)
        if unfinished is not None:
            rest = data[unfinished.start():]
            self.held = rest if len(rest) <= MAX_HELD else b""
            data = data[: unfinished.start()]
        return data


@dataclass
class _Relay:
    """The state two threads share while a job's output is relayed."""

    fleet: Fleet
    job_id: str
    out: BinaryIO
    raw: bool
    done: threading.Event = field(default_factory=threading.Event)
    last: SessionOutput | None = None
    error: BaseException | None = None
    filter: TerminalFilter = field(default_factory=TerminalFilter)

    def pump_output(self) -> None:
        """Read the job's output until it ends (or the relay stops), writing it out.

        A terminal's first read does not wait (`wait_s=0`), and its answer is preceded by
        the job's current line (`current_line`): the prompt the job waits at, which the
        person would otherwise not see until it printed again, and what a reader that died
        without detaching took of that line (see `current_line`)."""
        collect = (Collect(wait_s=POLL_S, settle_s=0, raw=True, truncation=ByteTail(max_bytes=1))
                   if self.raw else Collect(wait_s=POLL_S, settle_s=0, truncation=TailLines(
                       max_lines=1 << 30, max_bytes=64 * 1024 * 1024)))
        first = self.raw
        try:
            while not self.done.is_set():
                asked = collect.model_copy(update={"wait_s": 0.0}) if first else collect
                out: SessionOutput = self.fleet.read(self.job_id, collect=asked)
                if first:
                    first = False
                    line = current_line(self.fleet, self.job_id, out.start_offset)
                    if line:
                        self.out.write(line.encode())
                data = (self.filter.feed(base64.b64decode(out.raw_b64 or "")) if self.raw
                        else out.output.encode())
                if data:
                    self.out.write(data)
                    self.out.flush()
                if not out.running and not out.more:
                    self.last = out
                    break
        except BaseException as exc:  # reported by the caller, once the terminal is back
            self.error = exc
        finally:
            self.done.set()


def current_line(fleet: Fleet, job_id: str, end: int) -> str:
    """The job's last line up to byte `end` (where the session's last read stopped), as
    text (escape sequences removed, secrets redacted); "" when there is none, or when
    output came after `end` (a read of the file then stops at a whole line).

    A reader that dies without detaching (its terminal closed, the process killed)
    leaves its last long-poll read on the host, which takes the next output (up to
    POLL_S after its death) and shows it to nobody: a person who attached again at once
    saw "mport sys" for "import sys", the echo of the first key gone. A new terminal's
    first read waits for that read to finish (one reader at a time), and then shows what
    it took of the current line from the job's output file. Output it took past a
    newline is not shown again: that needs the host to keep where an unanswered read
    began."""
    if end <= 0:
        return ""
    start = max(0, end - REPLAY_BYTES)
    try:
        chunk = fleet.read_output(job_id, offset=start, limit=end - start)
    except Exception:  # a redraw is a courtesy: never a reason to fail an attach
        return ""
    if chunk.next_offset != end:
        return ""
    _, newline, line = chunk.text.rpartition("\n")
    if not newline and start > 0:
        return ""  # the window does not reach the line's start: an endless line
    return line


@contextlib.contextmanager
def raw_terminal(fd: int) -> Iterator[bool]:
    """The local terminal in raw mode (keys as typed, no local echo), restored after;
    yields whether `fd` is a terminal at all."""
    if not os.isatty(fd):
        yield False
        return
    import termios  # noqa: PLC0415 - a terminal's business only
    import tty  # noqa: PLC0415

    saved = termios.tcgetattr(fd)
    try:
        # TCSANOW: what the person typed ahead is kept (and sent), not flushed.
        tty.setraw(fd, termios.TCSANOW)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def window_size(fd: int) -> tuple[int, int] | None:
    """The terminal's rows and columns; None when it is no terminal or says 0x0 (a
    terminal nobody sized, as `script`'s or a CI runner's: the remote one keeps its own)."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return None
    if size.lines < 1 or size.columns < 1:
        return None
    return size.lines, size.columns


def attach(
    fleet: Fleet, job_id: str, *, detach_key: bytes = DETACH_KEY, stdin_fd: int = 0,
    out: BinaryIO | None = None, note: Callable[[str], None] | None = None,
    header: str | None = None,
) -> SessionOutput | None:
    """Relay a terminal to an interactive job until it ends (its last output returned)
    or the detach key is pressed (None: it runs on). `header` is said once the local
    terminal is raw (what is typed from then on goes to the job)."""
    out = out or sys.stdout.buffer
    say = note or (lambda text: print(text, file=sys.stderr, flush=True))
    relay = _Relay(fleet, job_id, out, raw=True)
    resized = threading.Event()
    previous = _on_winch(resized)
    with raw_terminal(stdin_fd) as is_tty:
        if header:
            say(f"{header}\r")
        size = window_size(stdin_fd) if is_tty else None
        if size is not None:
            fleet.resize(job_id, *size)
        reader = threading.Thread(target=relay.pump_output, name="bashfleet-attach", daemon=True)
        reader.start()
        detached = _forward_keys(fleet, job_id, stdin_fd, relay, detach_key=detach_key,
                                 resized=resized)
        relay.done.set()
        reader.join(POLL_S + 5)
    _restore_winch(previous)
    if relay.error is not None:
        raise relay.error
    if detached:
        say(f"\r\n[detached from job {job_id}; it keeps running: `bashfleet attach {job_id}` "
            f"comes back, `bashfleet kill {job_id}` ends it]")
        return None
    return relay.last


def _on_winch(flag: threading.Event) -> Any:
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        flag.set()

    return signal.signal(signal.SIGWINCH, handler)


def _restore_winch(previous: Any) -> None:
    if previous is not None:
        signal.signal(signal.SIGWINCH, previous)


def _forward_keys(fleet: Fleet, job_id: str, fd: int, relay: _Relay, *, detach_key: bytes,
                  resized: threading.Event) -> bool:
    """Send local input to the job until it ends; True when the person detached."""
    import select  # noqa: PLC0415

    open_input = True
    while not relay.done.is_set():
        if resized.is_set():
            resized.clear()
            size = window_size(fd)
            if size is not None:
                fleet.resize(job_id, *size)
        if not open_input:
            relay.done.wait(0.2)
            continue
        ready, _, _ = select.select([fd], [], [], 0.1)
        if not ready:
            continue
        data = os.read(fd, CHUNK)
        if detach_key and detach_key in data:
            before = data.split(detach_key, 1)[0]
            if before:
                send_input(fleet, job_id, before)
            return True
        if not data:  # end of the local input: the job's input ends too
            fleet.close_stdin(job_id, collect=Collect(read=False))
            open_input = False
            continue
        send_input(fleet, job_id, data, relay.done)
    return False


def forward_stdin(fleet: Fleet, job_id: str, *, stdin_fd: int = 0, out: BinaryIO | None = None
                  ) -> SessionOutput | None:
    """Forward a piped stdin to a `pipe` job (EOF closes its input) while its output is
    streamed out; the job's last output once it ended."""
    relay = _Relay(fleet, job_id, out or sys.stdout.buffer, raw=False)
    reader = threading.Thread(target=relay.pump_output, name="bashfleet-output", daemon=True)
    reader.start()
    pump = threading.Thread(target=_pump_input, args=(fleet, job_id, stdin_fd, relay),
                            name="bashfleet-stdin", daemon=True)
    pump.start()
    relay.done.wait()
    if relay.error is not None:
        raise relay.error
    return relay.last


#: Pause before offering input again to a process that has not read what it was given.
BACKPRESSURE_S = 0.05


def send_input(fleet: Fleet, job_id: str, data: bytes, done: threading.Event | None = None
               ) -> None:
    """Hand `data` to the job, waiting while its supervisor holds as much unread input as
    it takes (the process reads slower than we send)."""
    encoded = base64.b64encode(data).decode()
    while True:
        try:
            fleet.write_stdin(job_id, data_b64=encoded, collect=Collect(read=False))
            return
        except Exception as exc:
            if "has not read" not in str(exc) or (done is not None and done.is_set()):
                raise
            threading.Event().wait(BACKPRESSURE_S)


def _pump_input(fleet: Fleet, job_id: str, fd: int, relay: _Relay) -> None:
    """Local stdin to the job; a job that ends first stops it (data left unread is not
    the job's any more)."""
    try:
        while not relay.done.is_set():
            data = os.read(fd, CHUNK)
            if not data:
                fleet.close_stdin(job_id, collect=Collect(read=False))
                return
            send_input(fleet, job_id, data, relay.done)
    except Exception:  # the job ended meanwhile (its input is gone): the reader says how
        return
