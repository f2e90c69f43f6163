"""Workspaces from images, and the host's root in layers, as a person uses them with the
CLI against a local fleet (`bashfleet up`) that pulls from a real registry on 127.0.0.1
(TLS, basic auth: `tests/integration/registry.py`, images made here from Debian's
packages)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from integration.registry import Registry, pushed_images, running_registry
from privilege import needs_root

from .helpers import Cli, local_fleet

pytestmark = needs_root("a root fleet gives ids per workspace")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture(scope="module")
def refs(registry: Registry) -> dict[str, str]:
    return pushed_images(registry)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> Iterator[Cli]:
    state_dir = tmp_path_factory.mktemp("cli-images-fleet")
    env = {"BASHFLEET_REGISTRY_AUTH_FILE": str(registry.auth_file),
           "BASHFLEET_REGISTRY_CERTS_DIR": str(registry.certs_dir)}
    with local_fleet(state_dir, "--hosts", "box", "--concurrency", "2", "--no-flower",
                     env=env) as running:
        yield running


def _digest(*roots: str) -> str:
    total = hashlib.sha256()
    for root in roots:
        for folder, subdirs, files in os.walk(root):
            subdirs.sort()
            for name in sorted(files):
                info = os.lstat(os.path.join(folder, name))
                total.update(f"{folder}/{name}:{info.st_size}:{info.st_mtime_ns}".encode())
    return total.hexdigest()


def test_hosts_say_each_workspace_has_ids_of_its_own(fleet: Cli) -> None:
    hosts = fleet("hosts")
    assert hosts.returncode == 0, hosts.stderr
    assert "ids per workspace" in hosts.stdout


def test_cp_into_a_new_top_level_directory_of_a_host_root_workspace(
    fleet: Cli, tmp_path: Path
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "app.py").write_text("print('hello from /dst')\n")
    before = _digest("/usr/local", "/etc/apt")
    made = fleet("workspace", "create", "--ttl", "600")
    assert made.returncode == 0, made.stderr
    ws_id = made.stdout.strip()
    try:
        copied = fleet("cp", str(source), f"{ws_id}:/dst")
        assert copied.returncode == 0, copied.stderr
        # Root inside; the host's /usr/local is the host's, read-only (an image's is its
        # own to write).
        ran = fleet("run", "--workspace", ws_id,
                    "python3 /dst/app.py && id -u && (echo x > /usr/local/bin/mine) 2>&1")
        assert ran.returncode != 0, ran.stdout
        assert ran.stdout.startswith("hello from /dst\n0\n"), ran.stdout
        assert "Read-only file system" in ran.stdout, ran.stdout
    finally:
        assert fleet("workspace", "rm", ws_id).returncode == 0
    assert not Path("/dst").exists() and not Path("/usr/local/bin/mine").exists()
    assert _digest("/usr/local", "/etc/apt") == before


def test_a_workspace_from_an_image_takes_files_and_runs_as_its_root(
    fleet: Cli, refs: dict[str, str], tmp_path: Path
) -> None:
    made = fleet("workspace", "create", "--image", refs["debian"], "--json", timeout=300)
    assert made.returncode == 0, made.stderr
    view = json.loads(made.stdout)
    assert view["image"].startswith(refs["debian"] + "@sha256:")  # pinned by digest
    ws_id = view["id"]
    source = tmp_path / "src"
    source.mkdir()
    (source / "notes.txt").write_text("from the client\n")
    try:
        copied = fleet("cp", str(source), f"{ws_id}:/dst")
        assert copied.returncode == 0, copied.stderr
        ran = fleet("run", "--workspace", ws_id,
                    "cat /dst/notes.txt; id -u; grep -o bookworm /etc/os-release | head -1")
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout == "from the client\n0\nbookworm\n"
        back = tmp_path / "back"
        assert fleet("cp", f"{ws_id}:/dst", str(back)).returncode == 0
        assert (back / "notes.txt").read_text() == "from the client\n"
    finally:
        assert fleet("workspace", "rm", ws_id).returncode == 0
    assert not Path("/dst").exists()


def test_run_image_makes_a_workspace_for_the_call_and_ends_it(
    fleet: Cli, refs: dict[str, str]
) -> None:
    before = json.loads(fleet("workspace", "ls", "--json").stdout)
    ran = fleet("run", "--image", refs["nobash"], "echo via-sh; test -e /bin/bash || echo none",
                timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "via-sh\nnone\n"
    after = json.loads(fleet("workspace", "ls", "--json").stdout)
    assert len(after) == len(before)  # deleted with the call
    user = fleet("run", "--image", refs["user"], "id -u; pwd; echo $GREETING", timeout=300)
    assert user.stdout == "1000\n/work\nhello\n", user.stderr
    as_root = fleet("run", "--image", refs["user"], "--user", "root", "id -u", timeout=300)
    assert as_root.stdout == "0\n", as_root.stderr


def test_images_ls_shows_what_the_host_pulled(fleet: Cli, refs: dict[str, str]) -> None:
    pulled = fleet("images", "pull", refs["debian"], timeout=300)
    assert pulled.returncode == 0, pulled.stderr
    listed = fleet("images", "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    assert any(refs["debian"] in info["refs"] for info in json.loads(listed.stdout))
