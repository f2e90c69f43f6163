"""What runs beside a workspace's pasta where the worker is not root (`usernet`).

Standard library only: the worker starts it as `python -I -S
.../isolate/bootstrap.py usernet_tether MODE CONFIG`, outside the workspace (the host's PID, mount
and network namespaces, the worker's user), with descriptors of the workspace's user and network
namespaces inherited at the numbers CONFIG names:

    tether CONFIG  (the ruleset on stdin)
        child: setns(user) setns(net) ── libnftables ──► the workspace's rules; exit
        child: PR_SET_PDEATHSIG(SIGKILL) ── exec ──► pasta (its `-P` is the worker's
               ready pipe: pasta writes its pid there once the namespace is linked)
        itself: polls a pidfd of the keeper and pasta's; the keeper gone, SIGKILL to
               pasta, then exit. SIGTERM (the worker changing the policy): the same.
    rules CONFIG   (the ruleset on stdin): setns(user) setns(net), load it, exit.

Why a process of its own: pasta keeps the namespace alive (its sockets and descriptors
hold it) and so never sees it end; nothing else outside the workspace lives exactly as
long as the keeper. Killed itself, it takes pasta along (the death signal). Why not
`nft` through nsenter: entering the user namespace gives capabilities an exec drops (the
worker's uid is not root there); libnftables works in the process that entered.
Failures go to stderr, which the worker reads when no pid comes.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
from typing import Any

from bashfleet.worker.engine.isolate import kernel

PR_SET_PDEATHSIG = 1


def load_rules(userns: int, netns: int, text: str) -> str | None:
    """Enter the namespaces (this process must be single-threaded) and load `text`
    through libnftables; None, or what went wrong."""
    try:
        kernel.setns(userns, kernel.CLONE_NEWUSER)
        kernel.setns(netns, kernel.CLONE_NEWNET)
    except OSError as exc:
        return f"could not enter the workspace's network namespace: {exc}"
    library = kernel.nftables()
    if library is None:
        return "libnftables is not installed (Debian: libnftables1)"
    problem = kernel.nft_run(library, text)
    return None if problem is None else "nft: " + problem[:500]


def _rules_in_child(config: dict[str, Any], text: str) -> bool:
    """Load the rules from a child (the tether itself stays in the host's namespaces,
    where pasta must start)."""
    child = os.fork()
    if child == 0:  # pragma: no cover - the child exits
        problem = load_rules(int(config["userns"]), int(config["netns"]), text)
        if problem:
            os.write(2, problem.encode() + b"\n")
        os._exit(1 if problem else 0)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _pasta(argv: list[str], parent: int, keeper: int) -> None:  # pragma: no cover - execs
    """In the child: die with the tether, then become pasta."""
    try:
        kernel.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the tether died before the line above
            os._exit(1)
        os.close(keeper)
        # Python ignores these; an exec keeps that, and Debian 12's pasta takes a SIGPIPE
        # it finds ignored for a failure ("Couldn't install signal handlers").
        for signum in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.execv(argv[0], argv)  # noqa: S606 - pasta's own argv, no shell
    except OSError as exc:
        os.write(2, f"could not start {argv[0]}: {exc}\n".encode())
    os._exit(127)


class _StoppedError(Exception):
    """SIGTERM: the worker ends this workspace's link (another policy)."""


def _stop(signum: int, frame: object) -> None:
    del signum, frame
    raise _StoppedError


def tether(config: dict[str, Any], text: str) -> int:
    """Load the rules, start pasta, and end it with the keeper (see the module)."""
    keeper = int(config["keeper"])
    if text and not _rules_in_child(config, text):
        return 1
    signal.signal(signal.SIGTERM, _stop)
    me = os.getpid()
    pasta = os.fork()
    if pasta == 0:  # pragma: no cover - the child execs
        _pasta(list(config["argv"]), me, keeper)
    try:
        # pasta holds the namespaces and the ready pipe now: our copies would keep them.
        for fd in (int(config["userns"]), int(config["netns"]), int(config["ready"])):
            with contextlib.suppress(OSError):
                os.close(fd)
        poller = select.poll()
        poller.register(keeper, select.POLLIN | select.POLLHUP)
        poller.register(os.pidfd_open(pasta), select.POLLIN | select.POLLHUP)
        poller.poll()  # the keeper or pasta ended
    except _StoppedError:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pasta, signal.SIGKILL)
        os.waitpid(pasta, 0)
    return 0


def main(argv: list[str]) -> int:
    mode, config = argv[1], json.loads(argv[2])
    text = sys.stdin.read()
    if mode == "rules":
        problem = load_rules(int(config["userns"]), int(config["netns"]), text)
        if problem:
            print(problem, file=sys.stderr)
        return 1 if problem else 0
    return tether(config, text)


if __name__ == "__main__":  # pragma: no cover - the worker starts it
    try:
        CODE = main(sys.argv)
    except BaseException as exc:  # any failure is said, never a hang
        with contextlib.suppress(OSError):
            os.write(2, f"usernet tether failed: {exc!r}\n".encode())
        CODE = 1
    os._exit(CODE)
