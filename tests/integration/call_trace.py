"""The life of one call, traced: the frames from the client's `Fleet.run` to the Redis
push, and from the worker's exec task to the keeper's request, with the modules each
process ran on the way (`sys.setprofile`, in the test process and, through a
`sitecustomize` put on the worker's PYTHONPATH, in its consumers).

A path is a list of `module:qualname` rows, outermost first. The hop count of a path is
its length less one (the first row is where it starts)."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

#: The frames of one call between where the path starts and where it ends.
Path_ = list[str]

#: The environment variable naming the file a traced worker appends its paths to.
TRACE_ENV = "BASHFLEET_TEST_CALL_TRACE"

#: Loaded by every Python process of a worker started with the directory on PYTHONPATH
#: (not the keeper's: it runs `python -I -S`). Standard library only. It records, per
#: exec task, the frames from `handle_exec` to each `proto.send` (a keeper request) and
#: the bashfleet modules the task's thread entered.
SITECUSTOMIZE = '''
import json, os, sys, threading

_OUT = os.environ.get("BASHFLEET_TEST_CALL_TRACE")


def _row(frame):
    return f"{frame.f_globals.get('__name__', '?')}:{frame.f_code.co_qualname}"


_local = threading.local()


def _profile(frame, event, arg):
    if event not in ("call", "return"):
        return
    code = frame.f_code
    name = frame.f_globals.get("__name__", "")
    if event == "call" and code.co_name == "handle_exec" and name.endswith("fleet.tasks"):
        _local.modules = set()
        _local.paths = []
        return
    modules = getattr(_local, "modules", None)
    if modules is None:
        return
    if event == "return" and code.co_name == "handle_exec" and name.endswith("fleet.tasks"):
        with open(_OUT, "a") as out:
            out.write(json.dumps({"process": "worker", "paths": _local.paths,
                                  "modules": sorted(modules)}) + "\\n")
        _local.modules = None
        return
    if event == "call" and name.startswith("bashfleet."):
        modules.add(name)
        if code.co_name == "send" and name.endswith("engine.isolate.proto"):
            chain = []
            f = frame
            while f is not None:
                chain.append(_row(f))
                if f.f_code.co_name == "handle_exec":
                    break
                f = f.f_back
            _local.paths.append(chain[::-1])


if _OUT:
    sys.setprofile(_profile)
    threading.setprofile(_profile)
'''


def worker_env(folder: Path) -> dict[str, str]:
    """The environment that makes a worker trace its calls into `folder/trace.jsonl`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return {"PYTHONPATH": str(folder), TRACE_ENV: str(folder / "trace.jsonl")}


def worker_traces(folder: Path) -> list[dict[str, Any]]:
    """What a traced worker recorded, one entry per exec task."""
    trace = folder / "trace.jsonl"
    if not trace.exists():
        return []
    return [json.loads(line) for line in trace.read_text().splitlines() if line]


@dataclass
class ClientTrace:
    """The client's side of one call: the frames from the entry to the first Redis call
    made under `push` (the function that pushes the call), and the modules it ran."""

    paths: list[Path_] = field(default_factory=list)
    modules: set[str] = field(default_factory=set)


def _row(frame: FrameType) -> str:
    return f"{frame.f_globals.get('__name__', '?')}:{frame.f_code.co_qualname}"


@contextmanager
def traced_client(entry: str, push: str) -> Iterator[ClientTrace]:
    """Trace the calling thread: from a frame named `entry` (a qualname) to each call into
    the redis package made under a frame named `push`."""
    trace = ClientTrace()
    inside = [False]

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        name = frame.f_globals.get("__name__", "")
        if frame.f_code.co_qualname == entry and name.startswith("bashfleet."):
            inside[0] = True
        if not inside[0]:
            return
        if name.startswith("bashfleet."):
            trace.modules.add(name)
            return
        caller = frame.f_back
        if not name.startswith("redis") or caller is None \
                or not caller.f_globals.get("__name__", "").startswith("bashfleet."):
            return
        chain: list[str] = []
        f: FrameType | None = caller
        under_push = False
        while f is not None:
            chain.append(_row(f))
            under_push = under_push or f.f_code.co_qualname.endswith(push)
            if f.f_code.co_qualname == entry:
                break
            f = f.f_back
        if under_push:
            trace.paths.append(chain[::-1])

    previous: Callable[..., Any] | None = sys.getprofile()
    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        yield trace
    finally:
        sys.setprofile(previous)
        threading.setprofile(None)


def hops(path: Path_) -> int:
    """The calls a path makes from its first frame to its last."""
    return len(path) - 1


#: Where README's lines about the traced path sit.
BLOCK_START = "<!-- call-path: written by tests/integration/test_call_path.py -->"
BLOCK_END = "<!-- /call-path -->"


def path_lines(client: Path_, worker: Path_) -> str:
    """The two traced paths as README shows them: each process's frames in order (the
    function names, not their modules) and its hop count."""
    def line(where: str, path: Path_) -> str:
        names = " → ".join(f"`{row.split(':', 1)[1]}`" for row in path)
        return f"- {where} ({hops(path)} hops): {names}"
    return "\n".join([line("client, to the Redis push", client),
                      line("worker, to the keeper's request", worker)])


def readme_block(text: str) -> str:
    """The lines between README's call-path markers."""
    start = text.index(BLOCK_START) + len(BLOCK_START)
    return text[start:text.index(BLOCK_END, start)].strip("\n")


def with_block(text: str, lines: str) -> str:
    """`text` with `lines` between its call-path markers."""
    start = text.index(BLOCK_START) + len(BLOCK_START)
    return f"{text[:start]}\n{lines}\n{text[text.index(BLOCK_END, start):]}"


def table_modules(text: str) -> dict[str, set[str]]:
    """The modules README's life-of-a-call table names, by the process that runs them
    (`client` or `worker`): the keeper's rows (its own process, run by `python -I -S`,
    not traced) and the consumer's (it runs before the task) left out."""
    found: dict[str, set[str]] = {"client": set(), "worker": set()}
    for row in text.splitlines():
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].isdigit():
            continue
        where, named = cells[1], [part.strip("`") for part in cells[2].split()
                                  if part.strip("`,").endswith(".py")]
        if where == "keeper":
            continue
        folder = ""
        for name in named:
            part = name.strip("`,")
            if part.startswith("_core/"):
                part = f"client/{part}"
            if "/" in part:
                folder = part.rsplit("/", 1)[0]
            elif folder:
                part = f"{folder}/{part}"
            else:
                part = f"worker/engine/{part}"
            if part == "worker/fleet/consumer.py":
                continue
            module = "bashfleet." + part.removesuffix(".py").replace("/", ".")
            side = "client" if module.startswith("bashfleet.client.") else "worker"
            found[side].add(module.replace("client._async.", "client._sync."))
    return found
