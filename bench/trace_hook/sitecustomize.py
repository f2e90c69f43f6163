"""Time marks inside a worker's processes, for `bench.trace_call` only.

Put on PYTHONPATH (with BASHFLEET_TRACE_FILE naming a file) by `bench.trace_call`, this
wraps, as each module is imported, the functions one call goes through, and appends
`<time> <pid> <step> >` / `<` lines to the file at their entry and return. A function a
later version names otherwise is left out (its step is missing from the table).
Nothing is wrapped unless BASHFLEET_TRACE_FILE is set.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

OUT = os.environ.get("BASHFLEET_TRACE_FILE", "")
_lock = threading.Lock()

#: Per module, the functions (`name` or `Class.name`) to time and the step they are.
STEPS: dict[str, list[tuple[str, str]]] = {
    # Called once a BRPOP's answer is there to read: the message reached the worker.
    "kombu.transport.redis": [("Channel._brpop_read", "message read (BRPOP)")],
    "bashfleet.worker.fleet.tasks": [
        ("verify", "verify"), ("run_exec", "exec"), ("run_call", "engine"),
        ("deliver", "deliver (a reply FINISH held back)"),
    ],
    "bashfleet.worker.fleet.registry": [
        ("send_claim", "CLAIM script sent"), ("finish_and_reply", "FINISH script + reply"),
    ],
    # The claim's answer is read here, just before bash starts (sent before the call was
    # prepared).
    "bashfleet.worker.fleet.exec_watch": [("ExecWatcher.starting", "CLAIM script answered")],
    "bashfleet.worker.engine.call": [
        ("prepare", "prepare"), ("workspace_of", "workspace taken"),
        ("child_env", "child env"), ("_open_streams", "spill files"),
        ("_spawn", "spawn"), ("_open_files", "output files made"),
        ("_Launch._arm", "startup script"),
        ("_wait", "wait for exit"), ("_finished", "result built"),
        ("_after", "workspace given back"),
    ],
    "bashfleet.worker.engine.isolate.launcher": [
        ("KeeperConnection.start", "keeper starts bash (C -> P)"),
        ("KeeperConnection.wait_status", "keeper reports exit (S)"),
    ],
    "bashfleet.worker.fleet.flower": [("set_final_args", "Flower's final args")],
}


_fd: dict[int, int] = {}
"""The trace file, opened once per process (by pid: a forked child opens its own)."""


def mark(step: str) -> None:
    """Append one time mark: one write (an open and a close a mark would cost ten times
    what most steps take)."""
    line = f"{time.time():.6f} {os.getpid()} {step}\n".encode()
    with _lock:
        fd = _fd.get(os.getpid())
        if fd is None:
            fd = _fd[os.getpid()] = os.open(
                OUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.write(fd, line)


def timed(owner: Any, attr: str, step: str) -> None:
    """Replace `owner.attr` (a module's function, or `Class.method`) by a timed one."""
    if "." in attr:
        cls_name, attr = attr.split(".", 1)
        owner = getattr(owner, cls_name, None)
    fn = getattr(owner, attr, None)
    if fn is None or getattr(fn, "_timed", False):
        return

    @functools.wraps(fn)
    def inner(*args: Any, **kwargs: Any) -> Any:
        mark(f"{step} >")
        try:
            return fn(*args, **kwargs)
        finally:
            mark(f"{step} <")

    inner._timed = True  # type: ignore[attr-defined]
    setattr(owner, attr, inner)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the modules of STEPS as usual, and times their functions once loaded."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in STEPS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        load: Callable[[ModuleType], None] = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            for attr, step in STEPS[fullname]:
                timed(module, attr, step)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if OUT:
    sys.meta_path.insert(0, _Finder())
