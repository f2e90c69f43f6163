"""The package's import graph: no cycle anywhere, and the code that runs inside the
namespaces (`bashfleet.worker.engine.isolate`) on the standard library alone.

Read statically (AST): a module's import-time imports are those of its body, outside
functions and outside `if TYPE_CHECKING:` (those never run). A planted cycle and a
planted third-party import show each check catches one.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from bashfleet.worker.engine import isolate

ROOT = Path(__file__).resolve().parents[2]

#: The repository's folders and the import name each installs as (setup.py).
TOP_LEVEL = {"worker": "bashfleet.worker", "client": "bashfleet.client"}

ISOLATE = "bashfleet.worker.engine.isolate"


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package under `root`, by its dotted name."""
    found = {}
    for folder, name in TOP_LEVEL.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = [name, *path.relative_to(root / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _import_time_nodes(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """The import statements a module's body runs when it is imported."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                found += _import_time_nodes(node.body)
            found += _import_time_nodes(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse,
                          node.finalbody):
                found += _import_time_nodes(block)
        elif isinstance(node, ast.With | ast.ClassDef):
            found += _import_time_nodes(node.body)
    return found


def _every_import(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement names: `from a import b` as `a` and `a.b`."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = module.split(".")
        anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
        base = ".".join([*anchor, *([base] if base else [])])
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports when it is imported."""
    known = modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        edges = set()
        for node in _import_time_nodes(tree.body):
            targets = _targets(node, name, path.name == "__init__.py")
            if isinstance(node, ast.ImportFrom):
                # `from a import b`: module a.b when it is one, else a name of a.
                base, *named = targets
                edges |= {t if t in known else base for t in named}
            else:
                edges |= set(targets)
        graph[name] = {target for target in edges if target in known and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path that returns to its start) for every strongly connected
    group of modules that has one (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)
    return [_a_cycle_in(graph, group) for group in groups]


def _a_cycle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A path through `group` from its first module back to it (breadth first)."""
    start = min(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & group):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {sorted(group)}")


def test_the_package_has_no_import_cycle() -> None:
    found = cycles(import_graph(ROOT))
    assert found == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_graph_sees_the_package() -> None:
    graph = import_graph(ROOT)
    assert f"{ISOLATE}.keeper" in graph[f"{ISOLATE}.launcher"]
    assert "bashfleet.worker.engine.call" in graph


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_planted_cycle_is_found_and_shown(tmp_path: Path) -> None:
    _write(tmp_path, {
        "worker/__init__.py": "",
        "worker/a.py": "from bashfleet.worker import b\n",
        "worker/b.py": "from . import c\n",
        "worker/c.py": "import bashfleet.worker.a\n",
        "client/__init__.py": "",
    })
    assert cycles(import_graph(tmp_path)) == [
        ["bashfleet.worker.a", "bashfleet.worker.b", "bashfleet.worker.c", "bashfleet.worker.a"]
    ]


def test_imports_that_do_not_run_at_import_make_no_cycle(tmp_path: Path) -> None:
    _write(tmp_path, {
        "worker/__init__.py": "",
        "worker/a.py": "from bashfleet.worker import b\n",
        "worker/b.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from bashfleet.worker import a\n"
            "def late():\n    from bashfleet.worker import a\n"
        ),
        "client/__init__.py": "",
    })
    graph = import_graph(tmp_path)
    assert graph["bashfleet.worker.a"] == {"bashfleet.worker.b"}
    assert cycles(graph) == []


def foreign_imports(root: Path) -> list[str]:
    """Every import in the isolate package (at any depth: a function's too) of anything
    but the standard library, `__future__` and the package itself."""
    known = modules(root)
    found = []
    for name, path in known.items():
        if name != ISOLATE and not name.startswith(ISOLATE + "."):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _every_import(tree):
            targets = _targets(node, name, path.name == "__init__.py")
            if isinstance(node, ast.ImportFrom):
                # `from bashfleet.worker.engine import isolate` names the package itself.
                targets = [t for t in targets[1:] if t in known] or targets[:1]
            for target in targets:
                top = target.split(".")[0]
                own = target == ISOLATE or target.startswith(ISOLATE + ".")
                if not own and top not in sys.stdlib_module_names and top != "__future__":
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {target}")
    return found


def test_the_isolate_package_imports_only_the_standard_library_and_itself() -> None:
    assert foreign_imports(ROOT) == []


def test_a_foreign_import_in_the_isolate_package_is_caught(tmp_path: Path) -> None:
    _write(tmp_path, {
        "worker/engine/isolate/__init__.py": "import os\n",
        "worker/engine/isolate/keeper.py": (
            "import json\nfrom bashfleet.worker.engine.isolate import proto\n"
            "from bashfleet.worker.engine import isolate\n"
            "def late():\n    from bashfleet.worker.engine import sandbox\n    import psutil\n"
        ),
        "worker/engine/isolate/proto.py": "",
        "worker/engine/sandbox.py": "",
        "client/__init__.py": "",
    })
    assert foreign_imports(tmp_path) == [
        "worker/engine/isolate/keeper.py:5: bashfleet.worker.engine.sandbox",
        "worker/engine/isolate/keeper.py:6: psutil",
    ]


@pytest.mark.parametrize("entry", isolate.ENTRIES)
def test_every_entry_is_a_module_run_as_main(entry: str) -> None:
    text = (ROOT / "worker" / "engine" / "isolate" / f"{entry}.py").read_text(encoding="utf-8")
    assert 'if __name__ == "__main__":' in text


def test_the_bootstrap_starts_under_isolated_mode_and_names_its_entries() -> None:
    done = subprocess.run([*isolate.command("launcher")[:4], "no_such_entry"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 1
    assert "ENTRY one of ('launcher'," in done.stderr


def test_runs_knows_an_entry_by_its_command_line() -> None:
    argv = isolate.command("job_supervisor", "/tmp/spec.json")
    assert isolate.runs(argv, "job_supervisor")
    assert isolate.runs("\0".join(argv).encode() + b"\0", "job_supervisor")
    assert not isolate.runs(argv, "launcher")
    assert not isolate.runs(["python3", "job_supervisor", "x"], "job_supervisor")
    with pytest.raises(ValueError, match="not a process of its own"):
        isolate.command("keeper")
