"""The fleet's workspaces: `Workspaces`, the part of `AsyncFleet` that makes a
workspace (placed on a host, from an image, a build or a snapshot, for a session),
opens one made before and lists this owner's (and its MCP servers'). What a workspace
does once made is `AsyncWorkspace`'s (`client/_async/workspace.py`).

Written for asyncio; `client/_sync/workspaces.py` is generated from it by
`scripts/unasync.py`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from bashfleet.client import shells
from bashfleet.client._async import records
from bashfleet.client._async.images import Images
from bashfleet.client._async.snapshots import Snapshots
from bashfleet.client._async.workspace import AsyncWorkspace
from bashfleet.client._core.constants import BUILD_TIMEOUT_S, CTL_TIMEOUT_S
from bashfleet.client._core.messages import control_request
from bashfleet.client._core.workspaces import choose_host, open_view, owned_by_host, started_by
from bashfleet.client.errors import (
    CallRejected,
    ImageError,
    UnknownWorkspace,
    WorkerError,
    WorkerLost,
)
from bashfleet.worker.wire import names
from bashfleet.worker.wire.control import WorkspaceCreateRequest
from bashfleet.worker.wire.models import HostInfo, Snapshot, WorkspaceLimits, WorkspaceView
from bashfleet.worker.wire.network import NetworkPolicy
from bashfleet.worker.wire.network import parse as parse_network

if TYPE_CHECKING:
    from bashfleet.client._async.fleet import AsyncFleet


class Workspaces(Images, Snapshots):
    """`AsyncFleet`'s workspaces: `workspace`, `open_workspace`, `workspaces`,
    `agent_workspaces`."""

    async def workspace(
        self, *, host: str | None = None, label: str | None = None, path: str | None = None,
        ttl_s: float | None = None, isolation: Literal["none", "process", "strict"] | None = None,
        network: NetworkPolicy | str | bool | None = None,
        limits: WorkspaceLimits | Mapping[str, Any] | None = None,
        mounts: Mapping[str, str] | None = None, tags: Mapping[str, str] | None = None,
        near: str | None = None, session: str | None = None, image: str | None = None,
        build: str | os.PathLike[str] | None = None, user: str | None = None,
        snapshot: Snapshot | str | None = None,
        build_network: NetworkPolicy | str | None = None,
    ) -> AsyncWorkspace:
        """Make a workspace: a directory on one host and the namespaces its calls share
        (`AsyncWorkspace`). `host`, else a live host of `label` (else of the fleet): the one
        with the fewest of this owner's workspaces, then the least loaded, then any
        (`choose_host`: made at once, a client's spread evenly). `path`: an existing
        directory under a root the host allows (else a fresh one, removed with it). `ttl_s`:
        seconds it lives unused (the host's default, 1 h). `isolation` (at least the host's)
        and `network`, its network policy (`bashfleet.worker.wire.network`: `egress`, the host's
        default: the internet, never the fleet, the host, link-local or private ranges;
        `none`; `allow=pypi.org,*.pythonhosted.org,10.1.0.0/16`; `host` where the host
        allows it; a `NetworkPolicy`; False is `none`). `limits`: memory_mb, procs, cpus,
        disk_mb of its processes together, open_files of each, never above the host's.
        `mounts`: absolute paths in its calls' view -> its own subdirectories
        (`{"/logs": "logs"}`). LimitReached past the owner's cap.

        `image`: an OCI image reference (`python:3.12-slim`): its root filesystem is the
        workspace's `/` (pulled onto the host first, unless held there: a host that holds
        it is preferred); `build`: a local directory with a Dockerfile, built on the host
        (cached by its content); its RUN steps run in network and PID namespaces of
        their own, the network `build_network`: `egress` by default (the internet, never
        the fleet, the host's loopback, link-local or private ranges), `none`, or `host`
        where the host allows it. `user`: who its calls run as inside (a name, `uid` or
        `uid:gid`; default the image's USER, else root).

        `snapshot` (one of this owner's, or its id): its files are the snapshot's, in
        the same paths, over the snapshot's image or host root; no process runs in it.
        Made on the snapshot's host unless `host`/`label` say otherwise (another host
        fetches its layers through the fleet's registry first). `image`, `build`, `path`
        and `user` cannot be given with it.

        `session`: the fleet session it is for (an agent session's calls run in it). When
        that session lives in a workspace still there (on `host`, when named), that one
        is returned (renewed), not a new one: an agent whose own state was lost, or
        refused as forged, finds its files again, and its calls are not refused for
        naming another workspace than its session's. Else a new one, laid onto the
        session's shell (replacing one that ended; the first made wins when two callers
        make one at once)."""
        if snapshot is not None and (image or build or path or user):
            raise CallRejected("a workspace made from a snapshot stands on the snapshot's "
                               "image or host root, in its directory, as its user: `image`, "
                               "`build`, `path` and `user` cannot be given with `snapshot`")
        if build_network is not None and build is None:
            raise CallRejected("`build_network` is the network of a build's RUN steps: "
                               "given with `build` only (a workspace's own is `network`)")
        try:  # before its context is copied onto the host
            build_network = parse_network(build_network)
        except ValueError as exc:
            raise CallRejected(f"build_network: {exc}") from None
        if session is None:
            return await self._new_workspace(
                host=host, label=label, path=path, ttl_s=ttl_s, isolation=isolation,
                network=network, limits=limits, mounts=mounts, tags=tags, near=near,
                image=image, build=build, user=user, snapshot=snapshot,
                build_network=build_network)
        if not names.valid_id(session):
            raise CallRejected(f"invalid session id {session!r}")
        shell = await self._call(self._shells.load, session)
        if host is not None and shell.host not in (None, host):
            # Another host than the session's: a workspace of its own there.
            return await self._new_workspace(
                host=host, label=label, path=path, ttl_s=ttl_s, isolation=isolation,
                network=network, limits=limits, mounts=mounts, tags=tags, near=near,
                session=session, image=image, build=build, user=user, snapshot=snapshot,
                build_network=build_network)
        if shell.workspace is not None:
            with contextlib.suppress(UnknownWorkspace):
                kept = await self.open_workspace(shell.workspace)
                await kept.renew()  # its host still has it (its record may outlive it)
                return kept
        made = await self._new_workspace(
            host=host or shell.host, label=label, path=path, ttl_s=ttl_s,
            isolation=isolation, network=network, limits=limits, mounts=mounts, tags=tags,
            near=near, session=session, image=image, build=build, user=user,
            snapshot=snapshot, build_network=build_network)
        stored = await self._call(self._shells.commit, session, shells.ShellChange(
            host=made.host, workspace=made.id, force_workspace=shell.workspace is not None))
        if stored.workspace not in (None, made.id):
            await made.delete()  # another caller's made first: the session's
            return await self.open_workspace(stored.workspace)
        return made

    async def _new_workspace(
        self, *, host: str | None = None, label: str | None = None, path: str | None = None,
        ttl_s: float | None = None, isolation: Literal["none", "process", "strict"] | None = None,
        network: NetworkPolicy | str | bool | None = None,
        limits: WorkspaceLimits | Mapping[str, Any] | None = None,
        mounts: Mapping[str, str] | None = None, tags: Mapping[str, str] | None = None,
        near: str | None = None, session: str | None = None, image: str | None = None,
        build: str | os.PathLike[str] | None = None, user: str | None = None,
        snapshot: Snapshot | str | None = None,
        build_network: NetworkPolicy | str | None = None,
    ) -> AsyncWorkspace:
        """A new workspace as `workspace` describes it (`session`: only its label)."""
        record = await self._snapshot_record(snapshot) if snapshot is not None else None
        if record is not None and host is None:
            holder = [info for info in await self.hosts() if info.host == record.host
                      and (label is None or label in info.labels)]
            host = holder[0].host if holder else None
        where = await self._place_workspace(host, label, image)
        try:
            context: AsyncWorkspace | None = None
            if record is not None:
                if record.host != where:
                    await self._move_snapshot(record, where)
            elif build is not None:
                context = await self._build_context(where, build)
            elif image is not None:
                # Long pulls: not in the create request (the host's control threads).
                await self.pull_image(image, host=where)
            try:
                spec = control_request(
                    WorkspaceCreateRequest,
                    spec={"path": path, "ttl_s": ttl_s, "isolation": isolation,
                          "network": network, "limits": limits or {},
                          "mounts": dict(mounts or {}), "tags": dict(tags or {}),
                          "near": near, "session": session,
                          "image": image if context is None else None, "user": user,
                          "build": f"{context.path}/context" if context is not None else None,
                          "build_network": build_network if context is not None else None,
                          "snapshot": record.id if record is not None else None})
                view = await self._control(where, spec, WorkspaceView,
                                           timeout=BUILD_TIMEOUT_S if context else CTL_TIMEOUT_S)
            finally:
                if context is not None:
                    await context.delete()
        finally:
            self._placing[where] -= 1
        return self._held(view)

    async def _place_workspace(self, host: str | None, label: str | None,
                               image: str | None = None) -> str:
        """The host a new workspace goes to (`choose_host`: the owner's fewest there
        first, this client's being made counted; for an image, among the hosts that hold
        it when any does), counted as being made there until its host answers (then its
        view in Redis counts it)."""
        views = await self.workspaces() if host is None else []
        infos = await self._hosts_for(image, host)
        # From here to the count, nothing waits: another task of this client placing one
        # at once sees this one.
        where = choose_host(infos, host, label, owned=owned_by_host(views, self._placing))
        self._placing[where] += 1
        return where

    async def _hosts_for(self, image: str | None, host: str | None) -> list[HostInfo]:
        """The live hosts a workspace may go to: for an image, those that hold it when any
        does (a pull is the slowest part of making one)."""
        hosts = await self.hosts()
        if image is None or host is not None:
            return hosts
        with contextlib.suppress(ImageError, WorkerError, WorkerLost):
            holding = {info.host for info in await self.images() if image in info.refs
                       or info.digest == image or image.endswith(f"@{info.digest}")}
            preferred = [view for view in hosts if view.host in holding]
            if preferred:
                return preferred
        return hosts

    async def _build_context(self, host: str, build: str | os.PathLike[str]) -> AsyncWorkspace:
        """A local build context copied onto `host` (into a workspace of its own, deleted
        once the build is done): the host builds from its copy."""
        source = Path(build)
        if not source.is_dir() or not any((source / name).is_file()
                                         for name in ("Dockerfile", "Containerfile")):
            raise CallRejected(f"build: {build} is not a directory with a Dockerfile")
        context = await self._new_workspace(host=host, ttl_s=BUILD_TIMEOUT_S)
        try:
            await context.upload(source, "context")
        except BaseException:
            await context.delete()
            raise
        return context

    async def open_workspace(self, workspace_id: str) -> AsyncWorkspace:
        """A workspace made before (by any client of this owner): UnknownWorkspace when
        the fleet knows none by that id."""
        return self._held(await self._workspace_view(workspace_id))

    async def workspaces(self) -> list[WorkspaceView]:
        """This owner's live workspaces across the fleet, oldest first (from what their
        hosts sealed in Redis: a record that does not verify is left out)."""
        ids = await self._on_redis(records.owner_workspaces, self._identity.space)
        views = await self._on_redis(records.workspace_views, ids)
        opened = [open_view(self._record_keys, ws_id, sealed)
                  for ws_id, sealed in zip(ids, views, strict=True)]
        return sorted((view for view in opened if view is not None
                       and view.owner == self.owner), key=lambda view: view.created_at)

    async def agent_workspaces(self) -> list[WorkspaceView]:
        """The live workspaces of the MCP servers (`bashfleet mcp`) this owner started:
        each belongs to its server's session (owner `session:<id>`, which `workspaces`
        leaves out) and is tagged `started_by=<this owner>`; oldest first. Those of a
        named session outlive its server (to be resumed): here to find, and remove
        (`open_workspace` of a client whose owner is the view's)."""
        # An owner key's sessions are its sub-owners, counted in its own space; a fleet
        # key's (`session:<id>`) are found among every workspace.
        ids = await (self._on_redis(records.owner_workspaces, self._identity.space)
                     if self._identity.owner_key else self._on_redis(records.all_workspace_ids))
        views = await self._on_redis(records.workspace_views, ids)
        opened = [open_view(self._record_keys, ws_id, sealed)
                  for ws_id, sealed in zip(ids, views, strict=True)]
        return sorted((view for view in opened if view is not None
                       and started_by(view, self.owner)), key=lambda view: view.created_at)

    def _held(self, view: WorkspaceView) -> AsyncWorkspace:
        """The workspace of `view`, held by this client: its methods are the whole
        client's (`run`, `check`...), and `Workspaces` is a part of `AsyncFleet` only."""
        return AsyncWorkspace(cast("AsyncFleet", self), view)
