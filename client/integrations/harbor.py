"""bashfleet as a Harbor environment (`pip install 'bashfleet[harbor]'`, Python >= 3.12).

    harbor run -p ./my-task -a oracle --env client.integrations.harbor:BashfleetEnvironment \\
        --ek label=linux

A trial's environment is one workspace on a build host, made by `start`, renewed while
the trial runs, deleted by `stop(delete=True)`. The task runs on the host as it is: a task
whose environment names a Docker image or has a Dockerfile (or a compose file) is refused
at `start` (`ImageRefusedError`: the host is not that image) unless the environment is told
`--ek ignore_image=true`. Harbor's absolute paths are directories of the workspace shown
at those paths in its calls' view: `/logs` (agent, verifier, artifacts), `/tests`,
`/solution`, and the task's `workdir` when it declares one (a call without a cwd starts
there, else in the workspace's directory).

`exec` runs the command as a call in the workspace with the environment and timeout
Harbor passes (past the timeout the call is killed and `exec` raises, as Docker's does),
stdout and stderr apart and whole. Calls never run as root: Harbor's `root` (its own
housekeeping: making and emptying /logs directories, packing transfers) and the run user
both run as the workspace's run user; any other user (a task's `[agent] user` or
`[verifier] user`) is refused with a message that says so. Files go both ways through
the workspace (`upload_file/dir`, `download_file/dir`). The task's `no-network` policy is
the workspace's own network namespace; its cpus, memory_mb and storage_mb are the
workspace's limits.

Options (`--ek key=value`, or `environment.kwargs`): `WorkspaceOptions`' (redis_url, owner,
host, label, path, ttl_s, isolation, network, limits) and `ignore_image`; the fleet and
the owner otherwise come from the BASHFLEET_* settings.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

try:
    from harbor.environments.base import BaseEnvironment, ExecResult, SandboxBuildFailedError
    from harbor.environments.capabilities import EnvironmentCapabilities
    from harbor.environments.definition import COMPOSE_FILE_NAME, DOCKERFILE_NAME
    from harbor.environments.options import EnvironmentOptions
    from harbor.models.trial.paths import EnvironmentPaths
except ModuleNotFoundError as exc:  # the extra is not installed: say which
    from client.integrations import missing_extra

    raise missing_extra(__name__, "Harbor (Python 3.12+)", "harbor", exc) from exc

from client.aio import AsyncFleet, AsyncWorkspace
from client.errors import BashfleetError
from client.integrations._backend import Renewer, WorkspaceOptions, file_error
from worker.wire.models import MAX_TIMEOUT_S, Policy, WorkspaceLimits

#: Harbor's absolute paths (harbor.models.trial.paths.EnvironmentPaths), as directories
#: of the workspace shown at those paths in its calls' view.
HARBOR_MOUNTS = {"/logs": "logs", "/tests": "tests", "/solution": "solution"}
#: The workspace directory shown at a task's declared `workdir`.
WORKDIR_DIRECTORY = "workdir"
#: Users Harbor may name that run as the run user: its own housekeeping asks for root.
ROOT_NAMES = ("root", 0, "0")


class BashfleetEnvironmentOptions(EnvironmentOptions, WorkspaceOptions):  # type: ignore[misc]
    """Harbor's environment options plus where and how the workspace is made."""

    ignore_image: bool = False
    """Run a task whose environment names an image or a Dockerfile on the build host as
    it is, rather than refuse it."""


class ImageRefusedError(SandboxBuildFailedError):  # type: ignore[misc]  # Harbor: an extra
    """The task's environment is an image the build host is not (not retried)."""


def image_refusal(environment_dir: Path, docker_image: str | None) -> str | None:
    """Why a task cannot run on a build host as it is, or None when it can."""
    found = [name for name in (DOCKERFILE_NAME, COMPOSE_FILE_NAME)
             if (environment_dir / name).exists()]
    if docker_image:
        found.insert(0, f"docker_image = {docker_image!r}")
    if not found:
        return None
    return (f"the task's environment is a container image ({', '.join(found)}), and the "
            "bashfleet environment runs a task on a build host as it is, without building "
            "or pulling images; give --ek ignore_image=true to run it on the host anyway, "
            "or pick a container environment for it")


def user_refusal(user: str | int | None, run_as: str | None) -> str | None:
    """Why a command cannot run as `user`, or None when it runs as the run user."""
    if user is None or user in ROOT_NAMES or (run_as is not None and str(user) == run_as):
        return None
    who = run_as or "the worker's own user"
    return (f"the bashfleet environment runs every command as its run user ({who}), never "
            f"as another: user {user!r} is refused (leave the task's [agent] user and "
            "[verifier] user unset)")


def exec_policy() -> Policy:
    """An exec: no timeout unless Harbor gives one, killed past it, streams apart."""
    return Policy(name="harbor", on_timeout="kill", default_timeout_s=MAX_TIMEOUT_S)


class BashfleetEnvironment(BaseEnvironment):  # type: ignore[misc]  # Harbor: an extra
    """A Harbor environment whose commands run in a bashfleet workspace."""

    options_model = BashfleetEnvironmentOptions
    options: BashfleetEnvironmentOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._fleet: AsyncFleet | None = None
        self._workspace: AsyncWorkspace | None = None
        self._lease: Renewer | None = None
        super().__init__(*args, **kwargs)

    @staticmethod
    def type() -> str:
        return "bashfleet"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        """A workspace can be cut off the network (its own namespace)."""
        return EnvironmentCapabilities(disable_internet=True)

    def _validate_definition(self) -> None:
        """Nothing to build: a task with an image is refused at `start`, as said there."""

    @property
    def workspace(self) -> AsyncWorkspace:
        if self._workspace is None:
            raise RuntimeError("the bashfleet environment is not started")
        return self._workspace

    # ------------------------------------------------------------------ lifetime

    async def start(self, force_build: bool) -> None:
        refusal = image_refusal(self.environment_dir, self.task_env_config.docker_image)
        if refusal is not None and not self.options.ignore_image:
            raise ImageRefusedError(refusal)
        self._fleet = AsyncFleet(**self.options.fleet_kwargs())
        try:
            self._workspace = await self._fleet.workspace(**self._workspace_kwargs())
        except BaseException:
            await self._fleet.close()
            self._fleet = None
            raise
        self._lease = Renewer(self.workspace)
        # The directories a container image would have: the agent's and verifier's logs.
        paths = EnvironmentPaths.for_os(self.os)
        dirs = (paths.agent_dir, paths.verifier_dir, paths.artifacts_dir)
        await self.workspace.run("mkdir -p " + " ".join(shlex.quote(str(d)) for d in dirs))
        self.logger.debug(f"bashfleet workspace {self.workspace.id} on "
                          f"{self.workspace.host} at {self.workspace.path}")

    def _workspace_kwargs(self) -> dict[str, Any]:
        mounts = {**self.options.mounts, **HARBOR_MOUNTS}
        if self.task_env_config.workdir:
            mounts[self.task_env_config.workdir] = WORKDIR_DIRECTORY
        network = self.options.network
        if self._network_disabled:
            network = False
        return self.options.create_kwargs(
            mounts=mounts, network=network, limits=self._limits(),
            tags={"harbor": self.session_id[:64]})

    def _limits(self) -> WorkspaceLimits | None:
        if self.options.limits is not None:
            return self.options.limits
        config = self.task_env_config
        if config.memory_mb is None and config.cpus is None and config.storage_mb is None:
            return None
        return WorkspaceLimits(memory_mb=config.memory_mb, cpus=config.cpus,
                               disk_mb=config.storage_mb)

    async def stop(self, delete: bool) -> None:
        """End the lease; with `delete`, the workspace too (else its TTL reaps it)."""
        if self._lease is not None:
            await self._lease.stop()
        self._lease = None
        workspace, self._workspace = self._workspace, None
        fleet, self._fleet = self._fleet, None
        try:
            if delete and workspace is not None:
                await workspace.delete()
        finally:
            if fleet is not None:
                await fleet.close()

    # ---------------------------------------------------------------------- exec

    async def exec(self, command: str, cwd: str | None = None,
                   env: dict[str, str] | None = None, timeout_sec: int | None = None,
                   user: str | int | None = None) -> ExecResult:
        refusal = user_refusal(self._resolve_user(user), self.workspace.view.run_as)
        if refusal is not None:
            raise PermissionError(refusal)
        result = await self.workspace.run(
            command, cwd=cwd or self.task_env_config.workdir or None,
            env=self._merge_env(env) or {}, timeout=timeout_sec, policy=exec_policy(),
            output="full", check=False)
        if result.timed_out:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        if result.error is not None and result.exit_code is None:
            return ExecResult(stdout=result.stdout, stderr=result.error.message,
                              return_code=126 if result.error.kind != "bad_cwd" else 1)
        code = result.exit_code if result.exit_code is not None else 128 + (result.signal or 0)
        return ExecResult(stdout=result.stdout, stderr=result.stderr, return_code=code)

    # --------------------------------------------------------------------- files

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self.workspace.write_file(target_path, Path(source_path).read_bytes())

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self.workspace.upload(source_dir, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        try:
            data = await self.workspace.read_file(source_path)
        except BashfleetError as exc:
            raise file_error(exc, source_path) or exc from None
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        try:
            await self.workspace.download(source_dir, target_dir)
        except BashfleetError as exc:
            raise file_error(exc, source_dir) or exc from None
