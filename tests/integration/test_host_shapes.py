"""The hosts users run workers on, made here in their shapes: Docker's overlay2 (an
overlay mounted for each running container under /var/lib/docker), the kubelet's pod
volumes (a tmpfs per secret under /var/lib/kubelet), and the worker's own state where
deploy/ puts it (under /var/lib). Calls, workspaces, image workspaces, snapshots and
forks work there as on a clean host, and a tenant reads in those mounts what any local
account could, no more."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from privilege import needs_root

from bashfleet.worker.engine import sandbox
from bashfleet.worker.engine.snapshots import snapshots

from .engine_helpers import (
    Engine,
    Janitor,
    _janitor_fixture,  # noqa: F401 - the `janitor` fixture
    engine_with,
)
from .registry import Registry

pytestmark = needs_root("a root worker's workspaces")

NOBODY = 65534


def _mount(*argv: str) -> None:
    subprocess.run(["mount", *argv], check=True, capture_output=True)


@contextlib.contextmanager
def _made(path: Path) -> Iterator[Path]:
    """`path` made for the test (it must not exist), and removed after, its mounts first."""
    assert not path.exists()
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        mounted = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text()
                   .splitlines() if line.split()[4].startswith(f"{path}/")]
        for point in sorted(mounted, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], check=False)
        shutil.rmtree(path)


@pytest.fixture(name="shaped_host")
def _shaped_host_fixture() -> Iterator[dict[str, Path]]:
    """A running container's overlay as Docker's overlay2 mounts it, and a pod's secret
    volume as the kubelet mounts it, both under /var/lib, with their modes."""
    tag = uuid.uuid4().hex[:8]
    with _made(Path(f"/var/lib/bf-docker-{tag}")) as docker, \
            _made(Path(f"/var/lib/bf-kubelet-{tag}")) as kubelet:
        docker.chmod(0o710)
        layer = docker / "overlay2" / tag
        for name in ("lower", "diff", "work", "merged"):
            (layer / name).mkdir(parents=True)
        (layer / "lower" / "etc").mkdir()
        (layer / "lower" / "etc" / "hostname").write_text("container\n")
        _mount("-t", "overlay", "overlay", "-o", f"lowerdir={layer}/lower,upperdir="
               f"{layer}/diff,workdir={layer}/work", str(layer / "merged"))
        volume = kubelet / "pods" / tag / "volumes" / "kubernetes.io~secret" / "token"
        volume.mkdir(parents=True)
        _mount("-t", "tmpfs", "-o", "mode=1777", "tmpfs", str(volume))
        (volume / "token").write_text("pod-token\n")
        (volume / "token").chmod(0o600)
        (volume / "ca.crt").write_text("pod-ca\n")
        (volume / "ca.crt").chmod(0o644)
        yield {"docker": docker, "merged": layer / "merged", "volume": volume}


@pytest.fixture(name="var_engine")
def _var_engine_fixture(shaped_host: dict[str, Path], janitor: Janitor,
                        image_registry: Registry) -> Iterator[Engine]:
    """A root worker's engine whose state is under /var/lib, as deploy/ puts it, on the
    shaped host."""
    del shaped_host
    with _made(Path(f"/var/lib/bf-state-{uuid.uuid4().hex[:8]}")) as base, \
            engine_with(base, janitor, registry_auth_file=image_registry.auth_file,
                        registry_certs_dir=image_registry.certs_dir) as engine:
        assert sandbox.host_ids(engine.settings) is not None, "run scripts/bootstrap.sh as root"
        yield engine


def _out(engine: Engine, command: str, **fields: Any) -> str:
    result = engine.run(command, timeout_s=120.0, **fields)
    assert result.error is None and result.exit_code == 0, result
    return result.stdout


def test_calls_workspaces_snapshots_and_forks_work_on_a_docker_and_kubelet_host(
        var_engine: Engine, shaped_host: dict[str, Path]) -> None:
    assert str(var_engine.settings.state_dir).startswith("/var/lib/")
    assert _out(var_engine, "echo throwaway") == "throwaway\n"
    source = var_engine.workspace()
    assert _out(var_engine, "echo one > a.txt; mkdir -p /opt2; echo root > /opt2/r; cat a.txt",
                workspace=source.id, cwd=None) == "one\n"
    snap, _ = snapshots.take(source, var_engine.settings, ttl_s=600)
    fork = var_engine.workspace(snapshot=snap.id)
    assert _out(var_engine, "cat a.txt /opt2/r", workspace=fork.id, cwd=None) == "one\nroot\n"


def test_a_tenant_reads_in_docker_and_kubelet_mounts_what_a_local_account_could(
        var_engine: Engine, shaped_host: dict[str, Path]) -> None:
    merged, volume = shaped_host["merged"], shaped_host["volume"]
    # What an unprivileged account of the host reads there: the pod's CA, not its
    # 0600 token, nothing under Docker's 0710 directory.
    probes = [merged / "etc" / "hostname", volume / "token", volume / "ca.crt"]
    as_nobody = [subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                                 "--clear-groups", "cat", str(p)], capture_output=True,
                                text=True, check=False).stdout for p in probes]
    assert as_nobody == ["", "", "pod-ca\n"]
    ws = var_engine.workspace()
    seen = var_engine.run("; ".join(f"cat {p}" for p in probes), workspace=ws.id, cwd=None)
    assert seen.error is None, seen
    assert seen.stdout == "pod-ca\n", seen
    assert seen.stderr.count("Permission denied") == 2, seen.stderr


def test_an_image_workspace_works_with_the_state_under_var(
        var_engine: Engine, registry_images: dict[str, str]) -> None:
    ws = var_engine.workspace(image=registry_images["debian"])
    assert _out(var_engine, "echo made > /etc/made; cat /etc/made /etc/debian_version | head -1",
                workspace=ws.id, cwd=None) == "made\n"
    snap, _ = snapshots.take(ws, var_engine.settings, ttl_s=600)
    fork = var_engine.workspace(snapshot=snap.id)
    assert _out(var_engine, "cat /etc/made", workspace=fork.id, cwd=None) == "made\n"


def test_a_project_directory_on_a_file_system_without_id_maps_is_shown_read_only(
        janitor: Janitor, tmp_path: Path) -> None:
    """A project on an overlay (the kernel maps no ids there) is shown read-only, its
    files the host's: the workspace starts and says so by the error of a write, never
    by failing every call."""
    with _made(Path(f"/opt/bf-overlay-{uuid.uuid4().hex[:8]}")) as top:
        for name in ("lower", "upper", "work", "merged"):
            (top / name).mkdir()
        _mount("-t", "overlay", "overlay", "-o", f"lowerdir={top}/lower,upperdir="
               f"{top}/upper,workdir={top}/work", str(top / "merged"))
        project = top / "merged" / "project"
        project.mkdir()
        (project / "README").write_text("project\n")
        with engine_with(tmp_path, janitor, workspace_allow=(str(top / "merged"),)) as engine:
            ws = engine.workspace(path=str(project))
            result = engine.run("cat README; touch new 2>&1 | grep -c 'Read-only'",
                                workspace=ws.id, cwd=None)
            assert result.error is None, result
            assert result.stdout == "project\n1\n", result
