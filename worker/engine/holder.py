"""The holder and spawner binaries: where a worker finds them, or builds them.

A workspace's holder (`isolate/holder.c`) is what stays of it while its Python keeper
sleeps: pid 1 of its namespaces, a static C program of ~0.1 MiB. It must be static: it
is exec'd inside the workspace's view, whose paths are the workspace's own files (no
ld.so or libc.so may be loaded from there). The package ships its source; a worker
uses `Settings.holder` when given (a container image builds it in a stage of its own),
else builds it once into its state directory, named by the source's digest, with
`cc -static -O2` (~0.2 s), where a compiler and a static libc (Debian's gcc and
libc6-dev) are there. Where neither, workspaces keep their Python keepers awake and
the worker says why at start.

The spawner (`isolate/spawn.c`, started as `bashfleet-spawn`) is a call's first process
where workspaces have ids of their own: a program of its own with no C library at all
(`-nostdlib -ffreestanding`: it starts in ~0.05 ms where a static glibc program takes
~0.3 ms on a VM, probing the CPU). `Settings.spawner` when given (asked once whether it
is one: `--probe`), else built beside the holder. Where there is none, keepers fork
their calls.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from bashfleet.worker.engine.isolate import SPAWN_NAME
from bashfleet.worker.settings import Settings

SOURCE = Path(__file__).parent / "isolate" / "holder.c"
#: A call's first process (`bashfleet-spawn`): a binary of its own, without a C library.
SPAWN_SOURCE = SOURCE.with_name("spawn.c")
#: What the spawner prints for `--probe`.
SPAWN_PROBE_ANSWER = b"bashfleet-spawn 2\n"
#: Seconds a build may take (one small file: ~0.2 s; a loaded machine: more).
BUILD_TIMEOUT_S = 60.0


def binary_name(source: bytes, kind: str = "holder") -> str:
    """A built binary's file name: its kind and its source's digest, so that a new
    version of the package builds its own."""
    return f"{kind}-{hashlib.sha256(source).hexdigest()[:16]}"


def build_argv(cc: str, sources: Sequence[str], output: str) -> list[str]:
    """How the holder is compiled: static (nothing loaded at exec), optimised."""
    return [cc, "-static", "-O2", "-o", output, *sources]


def spawn_build_argv(cc: str, sources: Sequence[str], output: str) -> list[str]:
    """How the spawner is compiled: static, with no C library (its own `_start` and
    system calls: the link fails on any call into one), no stack protector (no thread
    area to read its canary from), and no library call the compiler would make of a
    loop of its own."""
    return [cc, "-static", "-nostdlib", "-ffreestanding", "-fno-builtin",
            "-fno-stack-protector", "-fno-tree-loop-distribute-patterns", "-O2",
            "-o", output, *sources]


_lock = threading.Lock()
#: What was built (or why not) per (kind, state directory): built once a process.
_built: dict[tuple[str, Path], tuple[str | None, str | None]] = {}


def _built_once(kind: str, state_dir: Path,
                build: Callable[[Path], tuple[str | None, str | None]]
                ) -> tuple[str | None, str | None]:
    with _lock:
        if (kind, state_dir) not in _built:
            _built[kind, state_dir] = build(state_dir / "bin")
        return _built[kind, state_dir]


def find(settings: Settings) -> tuple[str | None, str | None]:
    """(path of the holder binary, None) or (None, why there is none); built on first
    need and remembered per state directory."""
    if settings.holder is not None:
        path = settings.holder
        ok = path.is_file() and os.access(path, os.X_OK)
        return (str(path), None) if ok else (None, f"holder {path} is not an executable file")
    return _built_once("holder", settings.state_dir, build_into)


def build_into(folder: Path) -> tuple[str | None, str | None]:
    """(the holder built into `folder`, None), at once when it is there already, or
    (None, why not)."""
    return _build_into(folder, "holder", SOURCE, build_argv)


def build_spawner_into(folder: Path) -> tuple[str | None, str | None]:
    """(the spawner built into `folder`, None), at once when it is there already, or
    (None, why not)."""
    return _build_into(folder, "spawner", SPAWN_SOURCE, spawn_build_argv)


def _build_into(folder: Path, kind: str, source_path: Path,
                argv: Callable[[str, Sequence[str], str], list[str]]
                ) -> tuple[str | None, str | None]:
    """Build `source_path` into `folder` as `kind` (named by its digest). Several
    processes may build into one folder at the same time: each writes a file of its own
    and renames it into place."""
    try:
        source = source_path.read_bytes()
    except OSError as exc:
        return None, f"the {kind}'s source is not installed ({exc.strerror})"
    target = folder / binary_name(source, kind)
    if target.is_file():
        return str(target), None
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, f"no C compiler (cc) to build the {kind} with"
    folder.mkdir(parents=True, exist_ok=True, mode=0o755)
    partial = folder / f".{target.name}.{os.getpid()}"
    try:
        done = subprocess.run(argv(cc, [str(source_path)], str(partial)), capture_output=True,
                              timeout=BUILD_TIMEOUT_S, check=False)
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip().splitlines()
            return None, f"the {kind} did not build: {said[-1] if said else done.returncode}"
        os.replace(partial, target)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"the {kind} did not build: {exc}"
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    return str(target), None


_probed: dict[str, bool] = {}


def spawner(settings: Settings) -> str | None:
    """The spawner binary (`SPAWN_NAME`): `Settings.spawner` when it answers the probe,
    else the one built from this package's source. None: keepers fork their calls."""
    return find_spawner(settings)[0]


def find_spawner(settings: Settings) -> tuple[str | None, str | None]:
    """(the spawner's path, None) or (None, why there is none)."""
    if settings.spawner is None:
        return _built_once("spawner", settings.state_dir, build_spawner_into)
    path = str(settings.spawner)
    with _lock:
        known = _probed.get(path)
    if known is None:
        try:
            done = subprocess.run([SPAWN_NAME, "--probe"], executable=path, capture_output=True,
                                  timeout=BUILD_TIMEOUT_S, check=False)
            known = done.returncode == 0 and done.stdout == SPAWN_PROBE_ANSWER
        except (OSError, subprocess.TimeoutExpired):
            known = False
        with _lock:
            _probed[path] = known
    return (path, None) if known else (None, f"spawner {path} is not one (it does not answer "
                                             f"`{SPAWN_NAME} --probe`)")
