"""The holder binary: where a worker finds it, or builds it.

A workspace's holder (`isolate/holder.c`) is what stays of it while its Python keeper
sleeps: pid 1 of its namespaces, a static C program of ~0.1 MiB. It must be static: it
is exec'd inside the workspace's view, whose paths are the workspace's own files (no
ld.so or libc.so may be loaded from there). The package ships its source; a worker
uses `Settings.holder` when given (a container image builds it in a stage of its own),
else builds it once into its state directory, named by the source's digest, with
`cc -static -O2` (~0.2 s), where a compiler and a static libc (Debian's gcc and
libc6-dev) are there. Where neither, workspaces keep their Python keepers awake and
the worker says why at start.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from bashfleet.worker.engine.isolate import SPAWN_NAME
from bashfleet.worker.settings import Settings

SOURCE = Path(__file__).parent / "isolate" / "holder.c"
#: Linked into the same binary: a call's first process (`bashfleet-spawn`, spawn.c).
SPAWN_SOURCE = SOURCE.with_name("spawn.c")
SOURCES = (SOURCE, SPAWN_SOURCE)
#: What the binary started as a call's first process (`SPAWN_NAME`) prints for `--probe`.
SPAWN_PROBE_ANSWER = b"bashfleet-spawn 1\n"
#: Seconds a build may take (one small file: ~0.2 s; a loaded machine: more).
BUILD_TIMEOUT_S = 60.0


def binary_name(source: bytes) -> str:
    """The built binary's file name: the source's digest, so that a new version of the
    package builds its own."""
    return f"holder-{hashlib.sha256(source).hexdigest()[:16]}"


def build_argv(cc: str, sources: Sequence[str], output: str) -> list[str]:
    """How the holder is compiled: static (nothing loaded at exec), optimised."""
    return [cc, "-static", "-O2", "-o", output, *sources]


_lock = threading.Lock()
_found: dict[Path, tuple[str | None, str | None]] = {}


def find(settings: Settings) -> tuple[str | None, str | None]:
    """(path of the holder binary, None) or (None, why there is none); built on first
    need and remembered per state directory."""
    if settings.holder is not None:
        path = settings.holder
        ok = path.is_file() and os.access(path, os.X_OK)
        return (str(path), None) if ok else (None, f"holder {path} is not an executable file")
    with _lock:
        if settings.state_dir not in _found:
            _found[settings.state_dir] = build_into(settings.state_dir / "bin")
        return _found[settings.state_dir]


def build_into(folder: Path) -> tuple[str | None, str | None]:
    """(the holder built into `folder`, None), at once when it is there already, or
    (None, why not). Several processes may build into one folder at the same time:
    each writes a file of its own and renames it into place."""
    try:
        source = b"".join(path.read_bytes() for path in SOURCES)
    except OSError as exc:
        return None, f"the holder's source is not installed ({exc.strerror})"
    target = folder / binary_name(source)
    if target.is_file():
        return str(target), None
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler (cc) to build the holder with"
    folder.mkdir(parents=True, exist_ok=True, mode=0o755)
    partial = folder / f".{target.name}.{os.getpid()}"
    try:
        done = subprocess.run(build_argv(cc, [str(path) for path in SOURCES], str(partial)),
                              capture_output=True,
                              timeout=BUILD_TIMEOUT_S, check=False)
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip().splitlines()
            return None, f"the holder did not build: {said[-1] if said else done.returncode}"
        os.replace(partial, target)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"the holder did not build: {exc}"
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    return str(target), None


_spawners: dict[str, bool] = {}


def spawner(settings: Settings) -> str | None:
    """The holder, when it can also be a call's first process (`SPAWN_NAME`): a holder
    built from this package's sources can; a prebuilt one (`Settings.holder`) of an older
    one cannot, and is asked once (`--probe`). None: keepers fork their calls."""
    path, _ = find(settings)
    if path is None:
        return None
    with _lock:
        known = _spawners.get(path)
    if known is None:
        try:
            done = subprocess.run([SPAWN_NAME, "--probe"], executable=path, capture_output=True,
                                  timeout=BUILD_TIMEOUT_S, check=False)
            known = done.returncode == 0 and done.stdout == SPAWN_PROBE_ANSWER
        except (OSError, subprocess.TimeoutExpired):
            known = False
        with _lock:
            _spawners[path] = known
    return path if known else None
