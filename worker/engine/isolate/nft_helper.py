"""Where a root worker's nftables rules are loaded: a small process of its own, and the
worker's side of it (`load`).

libnftables waits on its netlink socket with select(2), and glibc aborts the whole
process (`bit out of range 0 - FD_SETSIZE on fd_set`) when that socket is numbered 1024
or more. An exec consumer running hundreds of calls holds thousands of descriptors, and
its other threads open and close them all the time: no look at the count before the
library opens its socket keeps that socket under 1024. So the library is never loaded in
a worker process; this helper holds a few dozen descriptors at most. A ruleset in a
fresh namespace takes ~1.3 ms p50 through it, ~1.0 ms in the worker's own process, ~5 ms
through `nft -f` and nsenter (a process per ruleset), measured side by side here.

Standard library only: the worker starts it as `python -I -S .../isolate/bootstrap.py nft_helper
FD`, in the host's namespaces, as the worker's user (root), one per worker process that loads rules,
at its first ruleset:

    worker process ──SOCK_SEQPACKET (FD)──► helper        ends when FD reads EOF
      per ruleset: a new stream socketpair;                  │ a thread per request
      sends [netns fd, one end] on FD,                       │ (at most MAX_LOADS):
      writes the ruleset to the other end, shuts its         │ reads the ruleset,
      writing side, reads the answer to EOF                  │ setns(net), libnftables,
                                                             ▼ answers, ends
    answer: `OK`, or `E` and nft's error text

A thread that entered a workspace's namespace ends with its request: it is never reused.
The helper takes no new request while MAX_LOADS are loading (what waits stays in the
socket's queue, its descriptors not yet the helper's), so it never holds more than
3 + 3 x MAX_LOADS descriptors. The worker's end closing (the worker ended) ends it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence

from bashfleet.worker.engine import isolate
from bashfleet.worker.engine.isolate import kernel

#: Rulesets loaded at once in the helper (each a thread, a netns descriptor, a socket to
#: the worker and libnftables' netlink socket).
MAX_LOADS = 8
#: Seconds a ruleset gets, the wait for a free loading thread included.
LOAD_TIMEOUT_S = 20.0
OK = b"OK"
ERROR = b"E"


# ---------------------------------------------------------------------------- helper


def serve(channel: socket.socket) -> int:
    """Load each ruleset the worker sends, until its end closes."""
    library = kernel.nftables()
    slots = threading.BoundedSemaphore(MAX_LOADS)
    while True:
        slots.acquire()
        try:
            message, fds, _, _ = socket.recv_fds(channel, 16, 2)
        except OSError:
            return 1
        if not message:
            return 0
        if len(fds) != 2:
            _close(fds)
            slots.release()
            continue
        threading.Thread(target=_load_one, args=(library, fds[0], fds[1], slots),
                         daemon=True).start()


def _load_one(library: ctypes.CDLL | None, netns: int, reply_fd: int,
              slots: threading.BoundedSemaphore) -> None:
    reply = socket.socket(fileno=reply_fd)
    try:
        reply.settimeout(LOAD_TIMEOUT_S)
        answer = _answer(library, netns, _read_all(reply))
        reply.sendall(answer)
    except OSError:
        pass  # the worker gave up on this ruleset; it learns nothing more
    finally:
        reply.close()
        _close([netns])
        slots.release()
    # The thread ends here, in the workspace's namespace: it is never reused.


def _answer(library: ctypes.CDLL | None, netns: int, text: bytes) -> bytes:
    if library is None:
        return ERROR + b"libnftables is not installed (Debian: libnftables1)"
    try:
        kernel.setns(netns, kernel.CLONE_NEWNET)
    except OSError as exc:
        return ERROR + f"could not enter the workspace's network namespace: {exc}".encode()
    problem = kernel.nft_run(library, text.decode(errors="replace"))
    return OK if problem is None else ERROR + problem.encode()


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _close(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


# ---------------------------------------------------------------------------- worker


class HelperError(OSError):
    """The helper could not be started, or ended before it answered."""


class Helper:
    """The worker's side: one helper process, started at the first ruleset and again
    after it ended."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._channel: socket.socket | None = None

    def load(self, netns_path: str, text: str) -> str | None:
        """Load `text` in the network namespace at `netns_path`; None, or nft's error.
        Raises HelperError when the helper did not answer, OSError when the namespace
        could not be opened."""
        channel = self._running()
        netns = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
        mine, theirs = socket.socketpair()
        try:
            with mine:
                try:
                    socket.send_fds(channel, [b"L"], [netns, theirs.fileno()])
                finally:
                    theirs.close()
                    os.close(netns)
                mine.settimeout(LOAD_TIMEOUT_S)
                mine.sendall(text.encode())
                mine.shutdown(socket.SHUT_WR)
                answer = _read_all(mine)
        except OSError as exc:
            raise HelperError(f"the nftables helper did not answer: {exc}") from None
        if answer == OK:
            return None
        if answer.startswith(ERROR):
            return answer[len(ERROR):].decode(errors="replace")
        raise HelperError("the nftables helper ended before it answered")

    def _running(self) -> socket.socket:
        with self._lock:
            if self._channel is None or self._proc is None or self._proc.poll() is not None:
                self._channel = self._start()
            return self._channel

    def _start(self) -> socket.socket:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                isolate.command("nft_helper", str(theirs.fileno())),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),), env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        except OSError as exc:
            mine.close()
            raise HelperError(f"could not start the nftables helper: {exc}") from None
        finally:
            theirs.close()
        return mine

    def close(self) -> None:
        """End the helper (its channel closed, it ends) and wait for it."""
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None
            if self._proc is not None:
                try:
                    self._proc.wait(LOAD_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
                self._proc = None

    @property
    def pid(self) -> int | None:
        """The helper's pid, while one was started."""
        return None if self._proc is None else self._proc.pid


def main(argv: list[str]) -> int:
    return serve(socket.socket(fileno=int(argv[1])))


if __name__ == "__main__":  # pragma: no cover - run as the helper
    sys.exit(main(sys.argv))


__all__: Sequence[str] = ["ERROR", "LOAD_TIMEOUT_S", "MAX_LOADS", "OK", "Helper", "HelperError",
                          "serve"]
