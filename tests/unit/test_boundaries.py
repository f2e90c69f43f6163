"""The layout's import boundaries (which part of the package may import what), checked
two ways.

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

#: The two subpackages of the one import name, for the rules below.
W, C = "bashfleet.worker", "bashfleet.client"
#: Libraries only bashfleet.worker.fleet (and the client) may import.
BROKER_LIBS = ("celery", "kombu", "redis", "vine")
#: Celery and its own libraries: bashfleet.worker.fleet alone imports them (a client
#: builds its task messages itself: `bashfleet.worker.wire.messages`).
CELERY_LIBS = ("celery", "kombu", "vine")


@dataclass(frozen=True)
class Rule:
    """Modules under `folder` (or the one file) may not import any of `forbidden`;
    with `only_worker`, their imports from `bashfleet.worker` must start with one of
    those."""

    folder: str
    forbidden: tuple[str, ...] = ()
    only_worker: tuple[str, ...] | None = None


RULES = (
    Rule("worker/wire", (*BROKER_LIBS, "psutil", f"{W}.engine", f"{W}.fleet", C)),
    Rule("worker/engine", (*BROKER_LIBS, f"{W}.fleet", C)),
    Rule("worker/__init__.py", (*BROKER_LIBS, f"{W}.fleet", C)),
    Rule("worker/settings.py", (*BROKER_LIBS, f"{W}.fleet", C)),
    Rule("worker/retention.py", (*BROKER_LIBS, f"{W}.fleet", C)),
    Rule("worker/fleet", (C,)),
    Rule("worker/fleet/connect.py", (*CELERY_LIBS, f"{W}.fleet.transport",
                                     f"{W}.fleet.celery_apps")),
    Rule("client", CELERY_LIBS,
         only_worker=(f"{W}.wire", f"{W}.settings", f"{W}.state_dir", f"{W}.fleet.connect")),
    Rule("client/dialects", (*BROKER_LIBS, f"{C}.fleet", f"{C}.mcp_server",
                             f"{C}.mcp_backend")),
    # The core decides, the I/O layer does: no Redis, no I/O layer, no front end.
    Rule("client/_core", (*BROKER_LIBS, f"{W}.fleet", f"{C}._async", f"{C}._sync",
                          f"{C}.fleet", f"{C}.aio", f"{C}.cli", f"{C}.mcp_server",
                          f"{C}.mcp_backend", f"{C}.dialects")),
    # The asyncio layer is the source the blocking one is generated from, never the
    # other way round (and neither reaches the front ends).
    Rule("client/_async", (f"{C}._sync", f"{C}.fleet", f"{C}.aio", f"{C}.cli",
                           f"{C}.mcp_server", f"{C}.mcp_backend")),
    # Where the state directory is: read by clients, so the standard library only.
    Rule("worker/state_dir.py", (*BROKER_LIBS, "pydantic", "pydantic_settings", "psutil",
                                 f"{W}.engine", f"{W}.fleet", f"{W}.settings", C)),
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
                elif (rule.only_worker is not None and _within(module, W)
                      and module != W
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
        "from bashfleet.worker.fleet import registry\nfrom bashfleet.worker.wire import names\n"
    )
    rules = (RULES[1], RULES[7])
    assert violations(tmp_path, rules) == [
        "worker/engine/sneaky.py:2: redis (forbidden in worker/engine)",
        "worker/engine/sneaky.py:2: redis.Redis (forbidden in worker/engine)",
        "client/cli.py:1: bashfleet.worker.fleet (client imports only "
        "('bashfleet.worker.wire', 'bashfleet.worker.settings', 'bashfleet.worker.state_dir', "
        "'bashfleet.worker.fleet.connect'))",
        "client/cli.py:1: bashfleet.worker.fleet.registry (client imports only "
        "('bashfleet.worker.wire', 'bashfleet.worker.settings', 'bashfleet.worker.state_dir', "
        "'bashfleet.worker.fleet.connect'))",
    ]


def test_a_client_module_importing_celery_is_caught(tmp_path: Path) -> None:
    client = tmp_path / "client"
    client.mkdir()
    (client / "fleet.py").write_text("from kombu.exceptions import OperationalError\n")
    assert violations(tmp_path, (RULES[7],)) == [
        "client/fleet.py:1: kombu.exceptions (forbidden in client)",
        "client/fleet.py:1: kombu.exceptions.OperationalError (forbidden in client)",
    ]


#: The one module that holds Lua: the fleet and the client only run its texts.
LUA_MODULE = "worker/wire/lua.py"


def lua_outside(root: Path) -> list[str]:
    """Modules of worker/ and client/ other than LUA_MODULE whose text calls Redis
    from Lua."""
    return [str(path.relative_to(root)) for folder in ("worker", "client")
            for path in sorted((root / folder).rglob("*.py"))
            if path != root / LUA_MODULE and "redis.call(" in path.read_text(encoding="utf-8")]


def test_all_lua_is_in_one_module() -> None:
    assert lua_outside(ROOT) == []
    assert "redis.call(" in (ROOT / LUA_MODULE).read_text(encoding="utf-8")


def test_lua_elsewhere_is_caught(tmp_path: Path) -> None:
    fleet = tmp_path / "worker" / "fleet"
    fleet.mkdir(parents=True)
    (fleet / "stray.py").write_text("GET = \"return redis.call('GET', KEYS[1])\"\n")
    (tmp_path / "client").mkdir()
    assert lua_outside(tmp_path) == ["worker/fleet/stray.py"]


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
        ("import bashfleet.client.dialects",
         (*BROKER_LIBS, f"{W}.fleet", f"{W}.engine", f"{C}.fleet")),
        # The Python API: Fleet and AsyncFleet speak Redis, never Celery.
        ("import bashfleet.client; from bashfleet.client import Fleet, AsyncFleet",
         CELERY_LIBS),
        ("import bashfleet.client.fleet, bashfleet.client.aio, bashfleet.client.records, "
         "bashfleet.client.sessions", CELERY_LIBS),
        # The core is pure: not even redis.
        ("import bashfleet.client._core.events, bashfleet.client._core.identity, "
         "bashfleet.client._core.messages, bashfleet.client._core.output, "
         "bashfleet.client._core.records, bashfleet.client._core.routing, "
         "bashfleet.client._core.seal, bashfleet.client._core.watch",
         (*BROKER_LIBS, f"{W}.fleet")),
        ("import bashfleet.worker.wire.models, bashfleet.worker.wire.control, "
         "bashfleet.worker.wire.names, bashfleet.worker.wire.auth, "
         "bashfleet.worker.wire.records, bashfleet.worker.wire.lua",
         (*BROKER_LIBS, "psutil", f"{W}.engine")),
        ("import bashfleet.worker", (*BROKER_LIBS, "psutil", f"{W}.engine", f"{W}.fleet")),
        ("import bashfleet.worker.engine.call, bashfleet.worker.engine.jobs.jobs",
         (*BROKER_LIBS, f"{W}.fleet")),
        ("import bashfleet.worker.retention", (*BROKER_LIBS, f"{W}.fleet")),
    ],
)
def test_importing_a_room_loads_nothing_it_must_not(
    statement: str, absent: tuple[str, ...]
) -> None:
    loaded = _loaded_after(statement)
    assert [m for m in loaded if any(_within(m, name) for name in absent)] == []
