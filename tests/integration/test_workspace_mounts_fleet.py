"""A workspace's mounts (`Fleet.workspace(mounts=...)`) through a real fleet: the
workspace's own subdirectories shown at absolute paths of its calls' view, wherever
that path is.

With layers on the host's root (a workspace with ids of its own), `/` is writable but
only some of the host's entries are overlays; the others are read-only binds of the
host's. Two cases failed before: a mount point under a read-only bind of a host entry
that the host has not got (`/srv/testbed`): that entry is now an overlay of its own
(`layout.mount_entries`); and a new mount point inside a `path=` project: made on the
host as the project's owner, not through the project's id map (where the keeper's root
is no id).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from bashfleet.client import BashfleetError, Fleet
from bashfleet.client.redis_server import RedisServer

from .conftest import WorkerFactory, WorkerProcess


@pytest.fixture(name="host", scope="module")
def _host_fixture(session_workers: WorkerFactory) -> Iterator[WorkerProcess]:
    yield from session_workers.module_host("mnt")


def _fleet(redis_server: RedisServer) -> Fleet:
    return Fleet(redis_server.url, owner=f"tenant-{uuid.uuid4().hex[:8]}")


def _shows(fleet: Fleet, view_path: str, **spec: object) -> None:
    """A workspace with `view_path` mounted shows it writable, backed by its own `sub`."""
    with fleet.workspace(host="mnt", mounts={view_path: "sub"}, **spec) as ws:  # type: ignore[arg-type]
        result = ws.run(f"echo hi > {view_path}/f && cat {ws.path}/sub/f")
        assert (result.exit_code, result.stdout, result.stderr) == (0, "hi\n", "")


def test_a_mount_at_a_new_top_level_path(host: WorkerProcess, redis_server: RedisServer) -> None:
    with _fleet(redis_server) as fleet:
        _shows(fleet, "/logs")


def test_a_mount_whose_point_exists_on_the_host(host: WorkerProcess,
                                                redis_server: RedisServer) -> None:
    with _fleet(redis_server) as fleet:
        _shows(fleet, "/usr/share")  # an overlaid entry's existing directory


def test_a_mount_under_a_read_only_host_entry(host: WorkerProcess,
                                              redis_server: RedisServer) -> None:
    with _fleet(redis_server) as fleet:
        _shows(fleet, "/srv/testbed")


def test_a_new_mount_point_inside_a_project(host: WorkerProcess,
                                            redis_server: RedisServer) -> None:
    project = host.projects / f"p{uuid.uuid4().hex[:8]}"
    project.mkdir(parents=True)
    with _fleet(redis_server) as fleet:
        _shows(fleet, f"{project}/testbed", path=str(project))


def test_a_mount_that_cannot_be_made_names_its_view_path(host: WorkerProcess,
                                                         redis_server: RedisServer) -> None:
    """Made or refused: a refusal names the mount's view path, not the host's paths."""
    with _fleet(redis_server) as fleet:
        try:
            _shows(fleet, "/srv/testbed")
        except BashfleetError as exc:
            assert "/srv/testbed" in str(exc)
            assert str(host.state_dir) not in str(exc)
            assert str(host.workspace_root) not in str(exc)
