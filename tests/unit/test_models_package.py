"""bashfleet.worker.wire.models as a package: one module per concern, loaded on demand.

A name imported from the package loads the module that defines it and those it stands
on, never the others; every model, wherever its fields' types are defined, validates,
dumps to JSON, reads its dump back and gives its JSON schema.
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from bashfleet.worker.wire import models

PACKAGE = "bashfleet.worker.wire.models"
SUBMODULES = ("base", "policy", "calls", "results", "jobs", "hosts", "images", "workspaces",
              "snapshots")


def _models_loaded_by(statement: str) -> set[str]:
    """The package's submodules a fresh interpreter holds after `statement`."""
    code = (f"import sys\n{statement}\n"
            f"print(' '.join(m for m in sys.modules if m.startswith('{PACKAGE}.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return {name.removeprefix(f"{PACKAGE}.") for name in out.split()}


@pytest.mark.parametrize(
    ("statement", "loaded"),
    [
        (f"import {PACKAGE}", set()),
        (f"import {PACKAGE}.calls", {"base", "policy", "calls"}),
        (f"from {PACKAGE} import RunRequest", {"base", "policy", "calls"}),
        (f"from {PACKAGE} import CallResult", {"base", "results"}),
        (f"from {PACKAGE} import MAX_COMMAND_BYTES", {"base"}),
        (f"from {PACKAGE} import JobRecord", {"base", "results", "jobs"}),
        (f"from {PACKAGE} import HostInfo", {"base", "hosts"}),
        (f"from {PACKAGE} import WorkspaceSpec", {"base", "images", "workspaces"}),
        (f"from {PACKAGE} import Snapshot", {"base", "images", "workspaces", "snapshots"}),
    ],
)
def test_a_name_loads_its_module_and_what_that_stands_on_only(
    statement: str, loaded: set[str]
) -> None:
    assert _models_loaded_by(statement) == loaded


def test_every_public_name_is_found_in_the_module_its_home_names() -> None:
    homes = models._HOMES
    assert sorted(homes) == sorted(models.__all__)
    assert set(homes.values()) == set(SUBMODULES)
    for name, home in homes.items():
        module = importlib.import_module(f"{PACKAGE}.{home}")
        assert getattr(models, name) is getattr(module, name), name
        value = getattr(module, name)
        if isinstance(value, type):
            assert value.__module__ == f"{PACKAGE}.{home}", name


def test_the_type_checkers_imports_are_the_public_names() -> None:
    # mypy sees the names through the `if TYPE_CHECKING:` imports, the runtime through
    # `_HOMES`: the same names, from the same modules.
    tree = ast.parse(Path(models.__file__).read_text())
    guarded = next(node for node in tree.body if isinstance(node, ast.If)
                   and ast.unparse(node.test) == "TYPE_CHECKING")
    imported = {alias.name: str(node.module).removeprefix(f"{PACKAGE}.")
                for node in guarded.body if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    assert imported == models._HOMES


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchModel"):
        _ = models.NoSuchModel


_IMAGE = {"ref": "python:3.12-slim", "digest": "sha256:" + "a" * 64}
_TRUNCATION = {"direction": "tail", "truncated": True, "limit": "lines", "total_lines": 9,
               "total_bytes": 90, "shown_lines": 2, "shown_bytes": 20,
               "shown_ranges": [[8, 9]]}
_JOB = {"id": "j1", "host": "h1", "pid": 7, "pgid": 7, "output_path": "/out/j1",
        "stdin": "pipe"}

#: A valid instance of every model, with its nested models set where it has them (those
#: are the types that come from other modules).
EXAMPLES: dict[str, dict[str, Any]] = {
    "Model": {},
    "TailLines": {"max_lines": 10},
    "Middle": {"max_bytes": 100, "keep_bytes": 10},
    "CharCap": {"max_chars": 5},
    "ByteTail": {"max_bytes": 5},
    "HeadTailTokens": {"max_tokens": 5},
    "InterceptRule": {"pattern": "^cat", "tool": "read", "message": "use read"},
    "Policy": {"name": "pi", "truncation": {"kind": "byte_tail", "max_bytes": 9},
               "intercept": [{"pattern": "^cat", "tool": "read", "message": "m"}]},
    "TermSize": {"rows": 40, "cols": 100},
    "CallOptions": {"command": "true", "network": "egress", "tags": {"agent": "a1"}},
    "Call": {"command": "echo hi", "call_id": "c1", "policy": {"truncation": {
        "kind": "middle"}}, "term_size": {"rows": 3, "cols": 4}, "stdin": "pty",
        "network": "allow=example.com", "workspace": "w" + "0" * 15},
    "RunRequest": {"command": "ls", "mode": "slow", "policy": {"name": "claude"}},
    "InputWait": {"idle_s": 2.5, "prompt": "> ", "pid": 9, "command": "python"},
    "TruncationInfo": _TRUNCATION,
    "SystemError_": {"kind": "cancelled", "message": models.CANCELLED_MESSAGE},
    "Spill": {"host": "h1", "stdout_path": "/out/c1.out", "stdout_bytes": 90},
    "ProcessInfo": {"pid": 9, "state": "sleeping", "cpu_s": 0.5, "command": "sleep 9"},
    "JobHandle": _JOB,
    "CallResult": {"call_id": "c1", "host": "h1", "exit_code": 0,
                   "error": {"kind": "limit", "message": "m"},
                   "stdout_truncation": _TRUNCATION, "spill": {"host": "h1"}, "job": _JOB,
                   "processes": [{"pid": 1, "state": "R", "cpu_s": 0, "command": "x"}],
                   "input_wait": {"idle_s": 1, "prompt": "", "pid": 2, "command": "y"}},
    "JobRecord": {"id": "j1", "host": "h1", "pid": 7, "pgid": 7, "start_time": 1.0,
                  "marker": "m", "command": "sleep 9", "cwd": "/", "output_path": "/o",
                  "status_path": "/s", "started_at": 2.0, "tags": {"a": "b"},
                  "stdin": "pty", "stdin_id": [1, 2]},
    "JobStatus": {"exit_code": 0, "ended_at": 3.0},
    "CheckResult": {"id": "j1", "host": "h1", "running": False, "exit_code": 1,
                    "output_truncation": _TRUNCATION},
    "OutputChunk": {"path": "/o", "offset": 0, "next_offset": 2, "size": 2, "text": "hi",
                    "eof": True},
    "JobView": {"id": "j1", "host": "h1", "pid": 7, "pgid": 7, "command": "c", "cwd": "/",
                "output_path": "/o", "started_at": 1.0, "state": "unknown",
                "running": None},
    "HostInfo": {"host": "h1", "alive": True, "labels": ["linux"],
                 "sandbox": {"isolation": "strict", "cgroup": "v2", "tenancy": "multi"}},
    "SandboxProbe": {"isolation": "process", "configured": "process"},
    "ImageInfo": {**_IMAGE, "refs": ["python:3.12-slim"]},
    "WorkspaceLimits": {"memory_mb": 512, "cpus": 1.5, "open_files": 1024},
    "WorkspaceSpec": {"owner": "user:ann", "network": "none", "limits": {"procs": 64},
                      "mounts": {"/logs": "logs"}, "snapshot": "s" + "1" * 15,
                      "build_network": "egress"},
    "WorkspaceRecord": {"id": "w" + "2" * 15, "host": "h1", "path": "/ws", "fresh": True,
                        "out_dir": "/ws-out", "isolation": "strict", "network": True,
                        "ttl_s": 60.0, "created_at": 1.0, "image": _IMAGE,
                        "limits": {"disk_mb": 10}, "ids": [100000, 65536]},
    "WorkspaceView": {"id": "w1", "host": "h1", "path": "/ws", "isolation": "none",
                      "network": "egress", "ttl_s": 60.0, "created_at": 1.0,
                      "limits": {"memory_mb": 1}},
    "SnapshotRecord": {"id": "s" + "3" * 15, "host": "h1", "workspace": "w" + "2" * 15,
                       "created_at": 1.0, "ttl_s": 9.0, "layers": ["s" + "3" * 15],
                       "path": "/ws", "image": _IMAGE, "limits": {"procs": 3},
                       "network": "none"},
    "Snapshot": {"id": "s1", "host": "h1", "workspace": "w1", "created_at": 1.0,
                 "expires_at": 2.0},
    "RestoreResult": {"workspace": "w1", "snapshot": "s1", "ended": 2},
}


def _model_classes() -> dict[str, type[BaseModel]]:
    return {name: value for name in models.__all__
            if isinstance(value := getattr(models, name), type)
            and issubclass(value, BaseModel)}


def test_every_model_has_an_example() -> None:
    assert sorted(EXAMPLES) == sorted(_model_classes())


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_model_validates_dumps_reads_its_dump_back_and_has_a_schema(name: str) -> None:
    model = _model_classes()[name]
    built = model.model_validate(EXAMPLES[name])
    dumped = built.model_dump_json()
    assert model.model_validate_json(dumped) == built
    assert model.model_validate(json.loads(dumped)) == built
    schema = model.model_json_schema()
    assert schema["type"] == "object"
    assert set(schema.get("properties", {})) == set(model.model_fields)


def test_a_record_method_builds_a_model_of_its_own_module() -> None:
    record = models.SnapshotRecord.model_validate(EXAMPLES["SnapshotRecord"])
    seen = record.as_snapshot(paused_ms=3.0)
    assert isinstance(seen, models.Snapshot)
    assert (seen.base, seen.expires_at, seen.paused_ms) == (
        f"python:3.12-slim@sha256:{'a' * 64}", 10.0, 3.0)


@pytest.mark.parametrize("submodule", SUBMODULES)
def test_each_module_alone_builds_every_model_it_defines(submodule: str) -> None:
    # In a fresh interpreter that imports this module only: the types its fields name
    # from other modules resolve when its models are first built.
    code = (
        "import json, pydantic\n"
        f"import {PACKAGE}.{submodule} as m\n"
        "built = [n for n, v in vars(m).items() if isinstance(v, type)\n"
        "         and issubclass(v, pydantic.BaseModel) and v.__module__ == m.__name__\n"
        "         and v.model_json_schema()]\n"
        "print(json.dumps(built))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    home = {name for name, module in models._HOMES.items() if module == submodule}
    assert set(json.loads(out)) == home & set(EXAMPLES)
    assert json.loads(out)
