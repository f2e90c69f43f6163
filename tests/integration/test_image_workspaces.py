"""Workspaces whose `/` is an OCI image, pulled from a real registry on 127.0.0.1 (TLS,
basic auth; `registry.py`) with the test images made here from Debian's packages."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from privilege import needs_root

from bashfleet.worker.engine import sandbox, workspaces
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import WorkspaceSpec

from .engine_helpers import (
    Engine,
    Janitor,
    _janitor_fixture,  # noqa: F401 - the `janitor` fixture
    engine_with,
    wait_until,
)
from .registry import Registry

pytestmark = needs_root("a root worker's workspaces")


@pytest.fixture(name="images_engine")
def _images_engine_fixture(tmp_path: Path, janitor: Janitor,
                           image_registry: Registry) -> Iterator[Engine]:
    with engine_with(tmp_path, janitor, registry_auth_file=image_registry.auth_file,
                     registry_certs_dir=image_registry.certs_dir) as engine:
        assert sandbox.host_ids(engine.settings) is not None, "run scripts/bootstrap.sh as root"
        yield engine


def _run(engine: Engine, ws_id: str, command: str, *, timeout_s: float = 30.0
         ) -> tuple[str, str]:
    result = engine.run(command, workspace=ws_id, cwd=None, timeout_s=timeout_s)
    assert result.error is None, result
    return result.stdout, result.stderr


def _tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for folder, subdirs, files in os.walk(root):
        subdirs.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            info = os.lstat(path)
            digest.update(f"{path}:{info.st_size}:{info.st_mode}:{info.st_uid}".encode())
    return digest.hexdigest()


def _rootfs(settings: Settings, digest: str) -> Path:
    from bashfleet.worker.engine.images import images  # noqa: PLC0415

    held = images.find(digest, settings)
    assert held is not None
    _, root = images.ensure(digest if "@" in digest else held.refs[0], settings)
    return Path(root)


def test_an_images_root_is_the_workspaces_own_and_the_image_never_changes(
    images_engine: Engine, registry_images: dict[str, str]
) -> None:
    ref = registry_images["debian"]
    record = workspaces.create(WorkspaceSpec(image=ref), images_engine.settings)
    try:
        assert record.image is not None and record.image.digest.startswith("sha256:")
        out, _ = _run(images_engine, record.id,
                      "grep -o bookworm /etc/os-release | head -1; id -u; echo $0; "
                      "echo hi > /usr/local/bin/mine; mkdir /dst; echo data > /dst/f; "
                      "cat /dst/f; getent ahostsv4 localhost | head -1 | cut -d' ' -f1")
        assert out.splitlines()[:5] == ["bookworm", "0", "bash", "data", "127.0.0.1"], out
        root = _rootfs(images_engine.settings, ref)
        before = _tree_digest(root)
        second = workspaces.create(WorkspaceSpec(image=ref), images_engine.settings)
        try:
            # Another workspace on the same image sees none of the first one's changes.
            out, _ = _run(images_engine, second.id,
                          "test -e /usr/local/bin/mine || echo clean; test -e /dst || echo no")
            assert out == "clean\nno\n"
        finally:
            workspaces.delete(second.id, images_engine.settings)
        assert _tree_digest(root) == before
        assert not (root / "dst").exists() and not (root / "usr/local/bin/mine").exists()
    finally:
        workspaces.delete(record.id, images_engine.settings)


def test_an_images_home_and_sys_are_what_docker_exec_shows(
    images_engine: Engine, registry_images: dict[str, str]
) -> None:
    """Its HOME is the image's own (its .bashrc and .profile, which a login shell reads:
    SWE-bench images activate their environment there), changed in its own layer; its
    /sys is the host's, read-only."""
    ref = registry_images["debian"]
    record = workspaces.create(WorkspaceSpec(image=ref), images_engine.settings)
    try:
        root = _rootfs(images_engine.settings, ref)
        dotfiles = {name: (root / "root" / name).read_text() for name in (".bashrc", ".profile")}
        for name, text in dotfiles.items():
            out, _ = _run(images_engine, record.id, f"echo $HOME; cat ~/{name}")
            assert out == f"/root\n{text}", name
        out, _ = _run(images_engine, record.id,
                      "echo 'export BF_LOGIN=yes' >> ~/.profile; bash -lc 'echo $BF_LOGIN'; "
                      "test -d /sys/class && echo sys; touch /sys/bf 2>/dev/null || echo ro")
        assert out == "yes\nsys\nro\n", out
        assert "BF_LOGIN" not in (root / "root" / ".profile").read_text()
    finally:
        workspaces.delete(record.id, images_engine.settings)


def test_an_images_user_workdir_and_env_hold_for_its_calls(
    images_engine: Engine, registry_images: dict[str, str]
) -> None:
    record = workspaces.create(WorkspaceSpec(image=registry_images["user"]),
                               images_engine.settings)
    try:
        out, _ = _run(images_engine, record.id, "id -u; pwd; echo $GREETING")
        assert out == "1000\n/work\nhello\n", out
        # Its user writes its HOME and the workspace's directory (its own, inside).
        out, _ = _run(images_engine, record.id,
                      f"echo $HOME; touch ~/made && touch {record.path}/made && echo wrote")
        assert out == "/home/1000\nwrote\n", out
        # A background job gets what a call gets of the image: its ENV.
        job = images_engine.run("echo job:$GREETING", workspace=record.id, cwd=None,
                                background=True)
        handle = job.job
        assert handle is not None, job
        wait_until(lambda: "job:hello" in Path(handle.output_path or "").read_text(),
                   what="the job's output")
        # Asked for another user: root (as inspect's and Harbor's `user=` ask).
        as_root = workspaces.create(WorkspaceSpec(image=registry_images["user"], user="root"),
                                    images_engine.settings)
        try:
            out, _ = _run(images_engine, as_root.id, "id -u")
            assert out == "0\n"
        finally:
            workspaces.delete(as_root.id, images_engine.settings)
    finally:
        workspaces.delete(record.id, images_engine.settings)


def test_an_image_without_bash_runs_calls_with_sh(
    images_engine: Engine, registry_images: dict[str, str]
) -> None:
    record = workspaces.create(WorkspaceSpec(image=registry_images["nobash"]),
                               images_engine.settings)
    try:
        assert record.image is not None and record.image.shell == "sh"
        out, _ = _run(images_engine, record.id, "echo from-sh; test -e /bin/bash || echo none")
        assert out == "from-sh\nnone\n", out
    finally:
        workspaces.delete(record.id, images_engine.settings)


def test_apt_get_installs_in_an_image_workspace(
    images_engine: Engine, registry_images: dict[str, str]
) -> None:
    record = workspaces.create(WorkspaceSpec(image=registry_images["debian"]),
                               images_engine.settings)
    try:
        out, err = _run(images_engine, record.id,
                        "(apt-get update -q && apt-get install -y -q --no-install-recommends "
                        "hello) >/tmp/apt.log 2>&1; tail -3 /tmp/apt.log >&2; hello",
                        timeout_s=300)
        assert out == "Hello, world!\n", err
    finally:
        workspaces.delete(record.id, images_engine.settings)


def test_an_unknown_image_is_a_clear_error_and_leaves_nothing(
    images_engine: Engine, image_registry: Registry
) -> None:
    before = set(os.listdir(images_engine.settings.workspaces_dir)) \
        if images_engine.settings.workspaces_dir.exists() else set()
    with pytest.raises(workspaces.WorkspaceError) as missing:
        workspaces.create(WorkspaceSpec(image=f"{image_registry.url}/bashfleet/none:1"),
                          images_engine.settings)
    assert missing.value.kind == "not_found", missing.value
    left = set(os.listdir(images_engine.settings.workspaces_dir)) - before \
        if images_engine.settings.workspaces_dir.exists() else set()
    assert not [name for name in left if name.startswith("w")], left
