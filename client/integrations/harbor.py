"""bashfleet as a Harbor environment (`pip install 'bashfleet[harbor]'`, Python >= 3.12).

    harbor run -p ./my-task -a oracle --env
    bashfleet.client.integrations.harbor:BashfleetEnvironment \\
        --ek label=linux

A trial's environment is one workspace on a build host, made by `start`, renewed while
the trial runs, deleted by `stop(delete=True)`. Its `/` is the task's image, picked as
Harbor's docker environment picks it: the `main` service of the task's
`docker-compose.yaml` (its `image:` or `build:`), else `docker_image` (unless
`force_build` with a Dockerfile), else `environment/Dockerfile`, built on the host by
buildah (the local directory copied there). A compose file with other services is
refused at `start` (`ComposeRefusedError`): the workspace is one container. A task with
none of these, or the option `ignore_image=true`, runs on the build host's own root; there
Harbor's absolute paths are directories of the workspace shown at those paths in its
calls' view: `/logs` (agent, verifier, artifacts), `/tests`, `/solution`, and the task's
`workdir` when it declares one. In an image they are the image's own paths.

`exec` runs the command as a call in the workspace with the environment, cwd and timeout
Harbor passes (past the timeout the call is killed and `exec` raises, as Docker's does),
stdout and stderr apart, whole and as the command wrote them (`ExactOutput`). `user`
(or the environment's default user: the task's `[agent] user`, `[verifier] user`; else
the image's USER) runs it: an image's workspace is made root (`made_root`, unless the
option `user` names another) and a call runs as another user of its image through
`runuser`/`su`/`setpriv`, as `docker exec -u` would; a workspace of a user other than
root refuses another user (PermissionError). Files go both ways through the workspace
(`upload_file/dir`, `download_file/dir`). The task's `no-network` policy is the
workspace's own network namespace; its cpus, memory_mb and storage_mb are the workspace's
limits.

Options (`--ek key=value`, or `environment.kwargs`): `WorkspaceOptions`' (redis_url, owner,
host, label, path, ttl_s, isolation, network, limits, user; image or build when the task
names none) and `ignore_image`; the fleet and the owner otherwise come from the
BASHFLEET_* settings. The worker pulls and builds with its own registry settings
(BASHFLEET_REGISTRY_AUTH_FILE, BASHFLEET_REGISTRY_CERTS_DIR, BASHFLEET_REGISTRY_INSECURE).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    from harbor.environments.base import BaseEnvironment, ExecResult, SandboxBuildFailedError
    from harbor.environments.capabilities import EnvironmentCapabilities
    from harbor.environments.definition import (
        COMPOSE_FILE_NAME,
        DOCKERFILE_NAME,
        should_use_prebuilt_docker_image,
    )
    from harbor.environments.options import EnvironmentOptions
    from harbor.models.trial.paths import EnvironmentPaths
except ModuleNotFoundError as exc:  # the extra is not installed: say which
    from bashfleet.client.integrations import missing_extra

    raise missing_extra(__name__, "Harbor (Python 3.12+)", "harbor", exc) from exc

from bashfleet.client.aio import AsyncFleet, AsyncWorkspace
from bashfleet.client.errors import BashfleetError
from bashfleet.client.integrations._backend import (
    ExactOutput,
    InsideUser,
    Renewer,
    Staged,
    UserUnavailableError,
    WorkspaceOptions,
    file_error,
    made_root,
)
from bashfleet.worker.wire.models import MAX_TIMEOUT_S, Policy, WorkspaceLimits

#: Harbor's absolute paths (harbor.models.trial.paths.EnvironmentPaths), as directories
#: of the workspace shown at those paths in its calls' view.
HARBOR_MOUNTS = {"/logs": "logs", "/tests": "tests", "/solution": "solution"}
#: The workspace directory shown at a task's declared `workdir`.
WORKDIR_DIRECTORY = "workdir"
#: Harbor's service of a task's compose file whose container the trial runs in.
MAIN_SERVICE = "main"
#: The most output an exec reads back (each stream): Harbor gives no limit.
MAX_EXEC_OUTPUT_BYTES = 64 * 1024 * 1024


class BashfleetEnvironmentOptions(EnvironmentOptions, WorkspaceOptions):  # type: ignore[misc]
    """Harbor's environment options plus where and how the workspace is made."""

    ignore_image: bool = False
    """Run the task on the build host's own root, not in its environment's image (its
    `docker_image`, Dockerfile or compose service)."""


class ComposeRefusedError(SandboxBuildFailedError):  # type: ignore[misc]  # Harbor: an extra
    """The task's compose file has services besides `main` (not retried)."""


@dataclass(frozen=True)
class TaskImage:
    """What a task's environment is made of: an image reference, or a directory with a
    Dockerfile built on the host."""

    image: str | None = None
    build: str | None = None


def task_image(environment_dir: Path, docker_image: str | None, force_build: bool
               ) -> TaskImage | None:
    """The image of a task's environment as Harbor's docker environment picks it: the
    compose file's `main` service's image or build, else the prebuilt `docker_image`
    (unless `force_build` with a Dockerfile), else the Dockerfile; None: none at all."""
    compose = environment_dir / COMPOSE_FILE_NAME
    if compose.exists():
        found = compose_image(compose)
        if found is not None:
            return found
    if should_use_prebuilt_docker_image(environment_dir, docker_image=docker_image,
                                        force_build=force_build):
        return TaskImage(image=docker_image)
    if (environment_dir / DOCKERFILE_NAME).exists():
        return TaskImage(build=str(environment_dir.resolve()))
    return None


def compose_image(compose: Path) -> TaskImage | None:
    """The `main` service's image or build of a task's compose file (None: it names
    neither: the Dockerfile or `docker_image` then). ComposeRefusedError when it has
    other services: a trial's workspace is one container, never a host run in place of
    the others."""
    import yaml  # noqa: PLC0415 - Harbor depends on PyYAML; only compose tasks need it

    services = (yaml.safe_load(compose.read_text()) or {}).get("services") or {}
    others = sorted(set(services) - {MAIN_SERVICE})
    if others:
        raise ComposeRefusedError(
            f"the task's {COMPOSE_FILE_NAME} has services besides {MAIN_SERVICE!r} "
            f"({', '.join(others)}): a bashfleet environment is one container; give "
            "--ek ignore_image=true to run the task on the build host's own root instead, "
            "or pick a compose environment for it")
    main = services.get(MAIN_SERVICE) or {}
    build = main.get("build")
    if build is not None:
        context = build if isinstance(build, str) else build.get("context", ".")
        return TaskImage(build=str((compose.parent / context).resolve()))
    return TaskImage(image=main["image"]) if main.get("image") else None


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
        self._image: TaskImage | None = None
        self._user: InsideUser | None = None
        self._output: ExactOutput | None = None
        #: Why `start` failed (None: it has not, or has not run).
        self._start_error: BaseException | None = None
        super().__init__(*args, **kwargs)

    @staticmethod
    def type() -> str:
        return "bashfleet"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        """A workspace can be cut off the network (its own namespace)."""
        return EnvironmentCapabilities(disable_internet=True)

    def _validate_definition(self) -> None:
        """Nothing to check before `start`: the image is pulled or built there."""

    @property
    def workspace(self) -> AsyncWorkspace:
        if self._workspace is None:
            raise self._not_running()
        return self._workspace

    def _not_running(self) -> RuntimeError:
        """The error of a call that needs the workspace when there is none: after a
        failed start it names that start's own error."""
        if self._start_error is not None:
            cause = str(self._start_error) or type(self._start_error).__name__
            return RuntimeError(f"the bashfleet environment did not start: {cause}")
        return RuntimeError("the bashfleet environment is not started")

    def _start_failed(self, what: str) -> bool:
        """True when `start` failed and no workspace exists: what Harbor does after
        such a start (it downloads the agent's logs and the artifacts, then stops the
        environment) has nothing to act on, and is a quiet no-op, so the trial's log
        holds one error, the start's own, not a traceback of each of these."""
        if self._workspace is not None or self._start_error is None:
            return False
        self.logger.debug(f"bashfleet: no workspace to {what} (the environment did not "
                          "start)")
        return True

    # ------------------------------------------------------------------ lifetime

    async def start(self, force_build: bool) -> None:
        self._start_error = None
        try:
            self._image = None if self.options.ignore_image else task_image(
                self.environment_dir, self.task_env_config.docker_image, force_build)
            self._fleet = AsyncFleet(**self.options.fleet_kwargs())
            try:
                self._workspace, default_user = await made_root(self._fleet,
                                                                self._workspace_kwargs())
            except BaseException:
                await self._fleet.close()
                self._fleet = None
                raise
        except BaseException as exc:
            self._start_error = exc
            raise
        self._lease = Renewer(self.workspace)
        self._user = InsideUser(self.workspace, default_user)
        self._output = ExactOutput(self.workspace)
        # The directories a container image would have: the agent's and verifier's logs.
        paths = EnvironmentPaths.for_os(self.os)
        dirs = (paths.agent_dir, paths.verifier_dir, paths.artifacts_dir)
        await self.workspace.run("mkdir -p " + " ".join(shlex.quote(str(d)) for d in dirs))
        self.logger.debug(f"bashfleet workspace {self.workspace.id} on "
                          f"{self.workspace.host} at {self.workspace.path}")

    def _workspace_kwargs(self) -> dict[str, Any]:
        """An image's workspace has Harbor's paths in its own root (the image's /app
        stays as its Dockerfile made it); the host's root gets them as directories of
        the workspace shown there."""
        image = self._image or TaskImage()
        mounts = dict(self.options.mounts)
        if self._image is None:
            mounts.update(HARBOR_MOUNTS)
            if self.task_env_config.workdir:
                mounts[self.task_env_config.workdir] = WORKDIR_DIRECTORY
        network = self.options.network
        if self._network_disabled:
            network = False
        return self.options.create_kwargs(
            mounts=mounts, network=network, limits=self._limits(),
            tags={"harbor": self.session_id[:64]},
            image=image.image or self.options.image, build=image.build or self.options.build)

    def _limits(self) -> WorkspaceLimits | None:
        if self.options.limits is not None:
            return self.options.limits
        config = self.task_env_config
        if config.memory_mb is None and config.cpus is None and config.storage_mb is None:
            return None
        return WorkspaceLimits(memory_mb=config.memory_mb, cpus=config.cpus,
                               disk_mb=config.storage_mb)

    async def stop(self, delete: bool) -> None:
        """End the lease; with `delete`, the workspace too (else its TTL reaps it).
        Nothing to do when there is none (a start that failed made none)."""
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
        if self._user is None or self._output is None:
            raise self._not_running()
        who = self._resolve_user(user)
        try:
            line = await self._user.command_as(command, None if who is None else str(who))
        except UserUnavailableError as exc:
            raise PermissionError(str(exc)) from None
        exact = await self._output.run(
            Staged(line), MAX_EXEC_OUTPUT_BYTES, cwd=cwd or self.task_env_config.workdir or None,
            env=self._merge_env(env) or {}, timeout=timeout_sec, policy=exec_policy(),
            check=False)
        result = exact.result
        if result.timed_out:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        if result.error is not None and result.exit_code is None:
            return ExecResult(stdout="", stderr=result.error.message,
                              return_code=126 if result.error.kind != "bad_cwd" else 1)
        code = result.exit_code if result.exit_code is not None else 128 + (result.signal or 0)
        return ExecResult(stdout=exact.stdout.decode(errors="replace"),
                          stderr=exact.stderr.decode(errors="replace"), return_code=code)

    # --------------------------------------------------------------------- files

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self.workspace.write_file(target_path, Path(source_path).read_bytes())

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self.workspace.upload(source_dir, target_dir)

    # After a failed start there is nothing to download: Harbor still asks for the agent's
    # logs and the artifacts, and each download is a no-op (see `_start_failed`).

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        if self._start_failed(f"download {source_path} from"):
            return
        try:
            data = await self.workspace.read_file(source_path)
        except BashfleetError as exc:
            raise file_error(exc, source_path) or exc from None
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        if self._start_failed(f"download {source_dir} from"):
            return
        try:
            await self.workspace.download(source_dir, target_dir)
        except BashfleetError as exc:
            raise file_error(exc, source_dir) or exc from None

    async def download_dir_filtered(self, *, source_dir: str, target_dir: Path | str,
                                    include: Sequence[str] | None = None,
                                    exclude: Sequence[str] | None = None,
                                    protect: Sequence[str] | None = None) -> None:
        if self._start_failed(f"download {source_dir} from"):
            return
        await super().download_dir_filtered(source_dir=source_dir, target_dir=target_dir,
                                            include=include, exclude=exclude,
                                            protect=protect)

    async def download_dir_with_exclusions(self, *, source_dir: str, target_dir: Path | str,
                                           exclude: list[str]) -> None:
        if self._start_failed(f"download {source_dir} from"):
            return
        await super().download_dir_with_exclusions(source_dir=source_dir,
                                                   target_dir=target_dir, exclude=exclude)
