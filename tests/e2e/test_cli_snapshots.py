"""`bashfleet workspace snapshot|fork|restore`, `workspace create --snapshot`, `bashfleet
snapshot ls|rm` and `gc`, as a person uses them against a local fleet of two hosts whose
snapshots travel through a real registry on 127.0.0.1 (`tests/integration/registry.py`)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from integration.registry import Registry, running_registry
from privilege import needs_root

from .helpers import Cli, local_fleet

pytestmark = needs_root("a root fleet gives ids per workspace")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> Iterator[Cli]:
    state_dir = tmp_path_factory.mktemp("cli-snapshots-fleet")
    env = {"BASHFLEET_REGISTRY_AUTH_FILE": str(registry.auth_file),
           "BASHFLEET_REGISTRY_CERTS_DIR": str(registry.certs_dir),
           "BASHFLEET_SNAPSHOT_REGISTRY": f"{registry.url}/bashfleet/snapshots"}
    with local_fleet(state_dir, "--hosts", "one,two", "--concurrency", "2", "--no-flower",
                     env=env) as running:
        yield running


def _ok(done: object) -> str:
    assert getattr(done, "returncode") == 0, getattr(done, "stderr")  # noqa: B009
    return str(getattr(done, "stdout"))  # noqa: B009


def test_snapshot_fork_restore_and_a_fork_on_the_other_host(fleet: Cli) -> None:
    ws = _ok(fleet("workspace", "create", "--host", "one")).strip()
    try:
        _ok(fleet("run", "--workspace", ws, "mkdir -p src && echo v1 > src/state"))
        made = fleet("workspace", "snapshot", ws, "--tag", "step=1")
        snap = _ok(made).strip()
        assert snap.startswith("s") and len(snap) == 16, made.stdout
        assert f"snapshot {snap} of {ws}" in made.stderr
        listed = json.loads(_ok(fleet("snapshot", "ls", "--json")))
        assert [(s["id"], s["tags"]) for s in listed] == [(snap, {"step": "1"})]
        assert snap in _ok(fleet("snapshot", "ls"))

        forks = _ok(fleet("workspace", "fork", ws, "-n", "3")).split()
        assert len(forks) == 3 and all(f.startswith("w") for f in forks)
        for index, fork in enumerate(forks):
            _ok(fleet("run", "--workspace", fork, f"echo fork{index} > src/state"))
        seen = [_ok(fleet("run", "--workspace", f, "cat src/state")).strip() for f in forks]
        assert seen == ["fork0", "fork1", "fork2"]
        assert _ok(fleet("run", "--workspace", ws, "cat src/state")).strip() == "v1"

        # On the other host: its layer goes through the registry.
        there = _ok(fleet("workspace", "create", "--snapshot", snap, "--host", "two")).strip()
        info = json.loads(_ok(fleet("workspace", "info", there, "--json")))[0]
        assert info["host"] == "two" and info["snapshot"] == snap
        assert _ok(fleet("run", "--workspace", there, "cat src/state")).strip() == "v1"

        _ok(fleet("run", "--workspace", ws, "echo v2 > src/state; sleep 300 &"))
        restored = fleet("workspace", "restore", ws, snap)
        _ok(restored)
        assert "process(es) that ran in it were ended" in restored.stderr
        assert _ok(fleet("run", "--workspace", ws, "cat src/state")).strip() == "v1"
        for other in (*forks, there):
            _ok(fleet("workspace", "rm", other))
        _ok(fleet("snapshot", "rm", snap))
        assert _ok(fleet("snapshot", "ls")).strip() == "no snapshots"
        gone = fleet("snapshot", "rm", snap)
        assert gone.returncode == 1 and "no such snapshot" in gone.stderr
    finally:
        fleet("workspace", "rm", ws)


def test_bad_snapshot_input_is_a_clear_error(fleet: Cli) -> None:
    missing = fleet("workspace", "create", "--snapshot", "s" + "0" * 15)
    assert missing.returncode != 0 and "no such snapshot" in missing.stderr
    assert "Traceback" not in missing.stderr
    both = fleet("workspace", "create", "--snapshot", "s" + "0" * 15, "--image", "x")
    assert both.returncode == 2 and "not allowed with" in both.stderr
    nows = fleet("workspace", "snapshot", "w" + "0" * 15)
    assert nows.returncode != 0 and "no such workspace" in nows.stderr.lower()
