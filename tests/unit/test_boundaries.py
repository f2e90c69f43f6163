"""The layout's import boundaries (DESIGN.md "Layout"), checked two ways.

Statically, every import statement of every module is read (AST) and held against the
rules below; at run time, importing a room in a fresh interpreter must not load the
libraries it must not use. A planted forbidden import shows the check catches one.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Libraries only worker.fleet (and the client) may import.
BROKER_LIBS = ("celery", "kombu", "redis", "vine")
#: Celery and its own libraries: worker.fleet alone imports them (a client builds its
#: task messages itself: `worker.wire.messages`).
CELERY_LIBS = ("celery", "kombu", "vine")


@dataclass(frozen=True)
class Rule:
    """Modules under `folder` (or the one file) may not import any of `forbidden`;
    with `only_worker`, their imports from `worker` must start with one of those."""

    folder: str
    forbidden: tuple[str, ...] = ()
    only_worker: tuple[str, ...] | None = None


RULES = (
    Rule("worker/wire", (*BROKER_LIBS, "psutil", "worker.engine", "worker.fleet", "client")),
    Rule("worker/engine", (*BROKER_LIBS, "worker.fleet", "client")),
    Rule("worker/__init__.py", (*BROKER_LIBS, "worker.fleet", "client")),
    Rule("worker/settings.py", (*BROKER_LIBS, "worker.fleet", "client")),
    Rule("worker/retention.py", (*BROKER_LIBS, "worker.fleet", "client")),
    Rule("worker/fleet", ("client",)),
    Rule("worker/fleet/connect.py", (*CELERY_LIBS, "worker.fleet.transport",
                                     "worker.fleet.celery_apps")),
    Rule("client", CELERY_LIBS,
         only_worker=("worker.wire", "worker.settings", "worker.fleet.connect")),
    Rule("client/dialects", (*BROKER_LIBS, "client.fleet", "client.mcp_server")),
    # The core decides, the I/O layer does: no Redis, no I/O layer, no front end.
    Rule("client/_core", (*BROKER_LIBS, "worker.fleet", "client._async", "client._sync",
                          "client.fleet", "client.aio", "client.cli", "client.mcp_server",
                          "client.dialects")),
    # The asyncio layer is the source the blocking one is generated from, never the
    # other way round (and neither reaches the front ends).
    Rule("client/_async", ("client._sync", "client.fleet", "client.aio", "client.cli",
                           "client.mcp_server")),
)


def imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of every import in a file, `from a import b` as `a.b` too."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _files(root: Path, folder: str) -> list[Path]:
    target = root / folder
    return [target] if target.suffix == ".py" else sorted(target.rglob("*.py"))


def violations(root: Path, rules: tuple[Rule, ...] = RULES) -> list[str]:
    """Every import that crosses a boundary, as `path:line: module (rule)`."""
    found = []
    for rule in rules:
        for path in _files(root, rule.folder):
            for line, module in imported_modules(path):
                where = f"{path.relative_to(root)}:{line}: {module}"
                if any(_within(module, bad) for bad in rule.forbidden):
                    found.append(f"{where} (forbidden in {rule.folder})")
                elif (rule.only_worker is not None and _within(module, "worker")
                      and module != "worker"
                      and not any(_within(module, ok) for ok in rule.only_worker)):
                    found.append(f"{where} ({rule.folder} imports only {rule.only_worker})")
    return found


def test_no_module_crosses_a_boundary() -> None:
    assert violations(ROOT) == []


def test_a_forbidden_import_is_caught(tmp_path: Path) -> None:
    engine = tmp_path / "worker" / "engine"
    engine.mkdir(parents=True)
    (engine / "sneaky.py").write_text("import os\nfrom redis import Redis\n")
    client = tmp_path / "client"
    client.mkdir()
    (client / "cli.py").write_text(
        "from worker.fleet import registry\nfrom worker.wire import names\n"
    )
    rules = (RULES[1], RULES[7])
    assert violations(tmp_path, rules) == [
        "worker/engine/sneaky.py:2: redis (forbidden in worker/engine)",
        "worker/engine/sneaky.py:2: redis.Redis (forbidden in worker/engine)",
        "client/cli.py:1: worker.fleet (client imports only "
        "('worker.wire', 'worker.settings', 'worker.fleet.connect'))",
        "client/cli.py:1: worker.fleet.registry (client imports only "
        "('worker.wire', 'worker.settings', 'worker.fleet.connect'))",
    ]


def test_a_client_module_importing_celery_is_caught(tmp_path: Path) -> None:
    client = tmp_path / "client"
    client.mkdir()
    (client / "fleet.py").write_text("from kombu.exceptions import OperationalError\n")
    assert violations(tmp_path, (RULES[7],)) == [
        "client/fleet.py:1: kombu.exceptions (forbidden in client)",
        "client/fleet.py:1: kombu.exceptions.OperationalError (forbidden in client)",
    ]


def _loaded_after(statement: str) -> list[str]:
    """Top-level packages (and worker/client submodules) loaded by `statement`."""
    code = (
        f"import sys; {statement}; "
        "print('\\n'.join(sorted(m for m in sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return done.stdout.split()


@pytest.mark.parametrize(
    ("statement", "absent"),
    [
        ("import client.dialects", (*BROKER_LIBS, "worker.fleet", "worker.engine", "client.fleet")),
        # The Python API: Fleet and AsyncFleet speak Redis, never Celery.
        ("import client; from client import Fleet, AsyncFleet", CELERY_LIBS),
        ("import client.fleet, client.aio, client.records, client.sessions", CELERY_LIBS),
        # The core is pure: not even redis.
        ("import client._core.events, client._core.identity, client._core.messages, "
         "client._core.output, client._core.records, client._core.routing, "
         "client._core.seal, client._core.watch", (*BROKER_LIBS, "worker.fleet")),
        ("import worker.wire.models, worker.wire.control, worker.wire.names, "
         "worker.wire.auth, worker.wire.records", (*BROKER_LIBS, "psutil", "worker.engine")),
        ("import worker", (*BROKER_LIBS, "psutil", "worker.engine", "worker.fleet")),
        ("import worker.engine.call, worker.engine.jobs", (*BROKER_LIBS, "worker.fleet")),
        ("import worker.retention", (*BROKER_LIBS, "worker.fleet")),
    ],
)
def test_importing_a_room_loads_nothing_it_must_not(
    statement: str, absent: tuple[str, ...]
) -> None:
    loaded = _loaded_after(statement)
    assert [m for m in loaded if any(_within(m, name) for name in absent)] == []
