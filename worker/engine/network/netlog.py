"""Refusals under `egress`, recorded as the guard records them under `allow`.

An `egress` workspace has no guard (no process of its own beside its keeper): its rules
log what they refuse to NFLOG group `network.EGRESS_LOG_GROUP` in its namespace, at most
`network.EGRESS_LOG_RATE` packets a second (the kernel drops the rest of a flood before
it costs this process anything), and one thread of the worker's process reads every
watched workspace's log:

    workspace netns: refuse chain ─ NFLOG group 8 ─► netlink socket (made in that netns)
                                                         │  poll(2), one thread for all
    keeper's pidfd (readable once it ended) ─────────────┤
                                                         ▼
                                        <id>.denied (JSON lines, `netguard.Recorder`)
                                        ─► `denied` events, the next call's result

A netlink socket holds its namespace: it is closed when the keeper ends (its pidfd), so
no workspace's namespace, nor its link, outlives it. A workspace is watched from its
first call in this process (`watch`, a no-op once it is); a second process that watches
it too is refused the group by the kernel (one reader a group and namespace), which is
fine: the first one records.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import select
import socket
import threading
from dataclasses import dataclass

from bashfleet.worker.engine.isolate import kernel, netguard
from bashfleet.worker.engine.network.network import EGRESS_LOG_GROUP, denied_path
from bashfleet.worker.settings import Settings

log = logging.getLogger("bashfleet.network")


@dataclass
class _Watched:
    keeper: int
    sock: socket.socket
    pidfd: int
    recorder: netguard.Recorder

    def close(self) -> None:
        self.sock.close()
        for fd in (self.pidfd, self.recorder.fd):
            with contextlib.suppress(OSError):
                os.close(fd)


class _Reader:
    """The thread that reads every watched workspace's log (started with the first)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_fd: dict[int, _Watched] = {}
        self.keepers: set[int] = set()
        self.poller = select.poll()
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.poller.register(self.wake_r, select.POLLIN)
        threading.Thread(target=self._loop, name="bashfleet-netlog", daemon=True).start()

    def add(self, watched: _Watched) -> None:
        with self.lock:
            self.by_fd[watched.sock.fileno()] = watched
            self.by_fd[watched.pidfd] = watched
            self.poller.register(watched.sock.fileno(), select.POLLIN)
            self.poller.register(watched.pidfd, select.POLLIN)
        with contextlib.suppress(BlockingIOError):
            os.write(self.wake_w, b"\0")

    def _loop(self) -> None:
        while True:
            for fd, _ in self.poller.poll():
                if fd == self.wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 4096)
                    continue
                with self.lock:
                    watched = self.by_fd.get(fd)
                if watched is not None:
                    self._serve(fd, watched)

    def _serve(self, fd: int, watched: _Watched) -> None:
        if fd == watched.pidfd:
            self._drop(watched)  # the keeper ended: its namespace may go
            return
        try:
            data = watched.sock.recv(65536, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:  # a burst overran the socket: lost, not fatal
                return
            self._drop(watched)
            return
        for target in netguard.log_targets(data):
            watched.recorder.record("address", target)

    def _drop(self, watched: _Watched) -> None:
        with self.lock:
            for fd in (watched.sock.fileno(), watched.pidfd):
                self.by_fd.pop(fd, None)
                with contextlib.suppress(KeyError, ValueError):
                    self.poller.unregister(fd)
            self.keepers.discard(watched.keeper)
        watched.close()


_reader: list[_Reader] = []
_start_lock = threading.Lock()


def watch(keeper_pid: int, ws_id: str, settings: Settings) -> None:
    """Record what the workspace's `egress` rules refuse (once per keeper and process;
    a failure is logged, never the call's)."""
    with _start_lock:
        if not _reader:
            _reader.append(_Reader())
    reader = _reader[0]
    with reader.lock:
        if keeper_pid in reader.keepers:
            return
        reader.keepers.add(keeper_pid)
    try:
        watched = _open(keeper_pid, ws_id, settings)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            return  # another process of the worker's reads its log: not tried again here
        with reader.lock:
            reader.keepers.discard(keeper_pid)
        if exc.errno != errno.ESRCH:
            log.warning("workspace %s: its refusals cannot be recorded: %s", ws_id, exc)
        return
    reader.add(watched)


def watching(keeper_pid: int) -> bool:
    """Whether this process records the refusals of the keeper's workspace now."""
    return bool(_reader) and keeper_pid in _reader[0].keepers


def _open(keeper_pid: int, ws_id: str, settings: Settings) -> _Watched:
    pidfd = os.pidfd_open(keeper_pid)
    try:
        sock = _nflog_in(keeper_pid)
    except BaseException:
        os.close(pidfd)
        raise
    try:
        denied = os.open(denied_path(settings, ws_id), os.O_WRONLY | os.O_APPEND | os.O_CREAT
                         | os.O_CLOEXEC, 0o600)
    except BaseException:
        sock.close()
        os.close(pidfd)
        raise
    return _Watched(keeper_pid, sock, pidfd, netguard.Recorder(denied))


def _nflog_in(keeper_pid: int) -> socket.socket:
    """A netlink socket bound to the egress log group, made in the keeper's network
    namespace by a thread that enters it (a namespace is a thread's own) and ends there."""
    return kernel.in_network_namespace(
        keeper_pid, functools.partial(netguard.nflog_socket, EGRESS_LOG_GROUP),
        "bashfleet-netlog-open")
