"""bashfleet as an inspect-ai sandbox: `Task(..., sandbox="bashfleet")`.

    pip install 'bashfleet[inspect]'
    Task(dataset=..., solver=..., sandbox="bashfleet")            # or ("bashfleet", "bf.yaml")

The `inspect_ai` entry point of the package registers the type `bashfleet` (this module,
imported by inspect when a task names it). Each sample gets a workspace of its own, made
in `sample_init` and deleted in `sample_cleanup`; its lease is renewed while the sample
lives. The fleet is the usual BASHFLEET_* settings' (BASHFLEET_REDIS_URL, BASHFLEET_OWNER);
the task's sandbox config says where and how: `BashfleetSandboxConfig` (or a YAML/JSON file
of its fields: host or label, image or build, user, isolation, network, ttl, limits,
mounts), or what docker's sandbox takes: a Dockerfile (built on the host) or a compose
file of ONE service (its `image:` or `build:`, `user:`, `network_mode: none`). A compose
file of several services is refused: a sample's workspace is one container.

How inspect's `SandboxEnvironment` maps onto `AsyncWorkspace`:

- `exec(cmd, input, cwd, env, user, timeout)`: one `run` in the workspace (the argv
  quoted into one command line; a relative cwd is the workspace's subdirectory); `input`
  reaches the command's stdin through a file of the workspace's /tmp, and a command line
  past a call's 1 MiB cap is sourced from one. A timeout kills the command's process
  group and raises TimeoutError; status 126 with "Permission denied" raises
  PermissionError; past INSPECT_SANDBOX_MAX_EXEC_OUTPUT_SIZE on a stream,
  OutputLimitExceededError. Output is the command's own bytes, decoded (`ExactOutput`:
  never the fleet's sanitized, redacted text).
- `user=`: an image's workspace is made root (`made_root`) and a call that names no user
  runs as the image's USER, as docker's does; `user="root"` or any user of the image runs
  as that user (`runuser`/`su`/`setpriv`). With the config's `user`, the workspace is that
  user's alone: another raises SandboxUserUnsupportedError.
- `read_file` / `write_file`: `AsyncWorkspace.read_file` / `write_file` (in the calls'
  view: a relative path is in the workspace, `/tmp/...` its own /tmp), with
  FileNotFoundError, PermissionError, IsADirectoryError as inspect expects and
  INSPECT_SANDBOX_MAX_READ_FILE_SIZE enforced; where calls run as an image's USER by
  default, a file is written by a command of that user (its file, as docker's writes).

Snapshots: inspect's `SandboxEnvironment` has no snapshot methods for a provider to
implement (its checkpointing captures files with restic or tar through `exec`, strategies
it does not let a provider add), so they are this environment's own, reached from a
solver as inspect reaches any provider's: `sandbox().as_type(BashfleetSandboxEnvironment)`.
`snapshot()` freezes the workspace's files (the fleet's native snapshot: its upper layer,
no copy, no process state), `restore(snapshot)` puts them back (ending its processes),
and `fork(n)` gives n environments on new workspaces that start as its files are now,
deleted with the sample.
"""

from __future__ import annotations

import errno
import posixpath
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

try:
    from inspect_ai.util import (
        ComposeBuild,
        ComposeConfig,
        ExecResult,
        OutputLimitExceededError,
        SandboxConnection,
        SandboxEnvironment,
        SandboxEnvironmentConfigType,
        SandboxEnvironmentLimits,
        SandboxUnavailableError,
        SandboxUserUnsupportedError,
        is_compose_yaml,
        is_dockerfile,
        parse_compose_yaml,
        sandboxenv,
    )
except ModuleNotFoundError as exc:  # the extra is not installed: say which
    from bashfleet.client.integrations import missing_extra

    raise missing_extra(__name__, "inspect-ai", "inspect", exc) from exc
from pydantic import BaseModel

from bashfleet.client._async.workspace import AsyncWorkspace
from bashfleet.client.errors import BashfleetError, CallRejected
from bashfleet.client.integrations._backend import (
    Exact,
    ExactOutput,
    FleetPool,
    InsideUser,
    Renewer,
    UserUnavailableError,
    WorkspaceOptions,
    exit_status,
    file_error,
    made_root,
    os_error_in,
    shell_line,
    stage,
)
from bashfleet.worker.wire.models import MAX_TIMEOUT_S, Policy

if TYPE_CHECKING:
    from bashfleet.worker.wire.models import Snapshot

#: The policy of inspect's calls: separate streams, the whole output read back (up to
#: inspect's limit), a timeout kills (inspect raises TimeoutError), none by default.
EXEC_POLICY = Policy(name="inspect", on_timeout="kill", default_timeout_s=MAX_TIMEOUT_S,
                     kill_grace_s=1.0)

#: A system error of a call -> the exception inspect's callers expect for it.
_NOT_RUN: dict[str, type[Exception]] = {
    "bad_cwd": FileNotFoundError,
    "blocked": PermissionError,
    "unauthorized": PermissionError,
    "worker_lost": SandboxUnavailableError,
    "unavailable": SandboxUnavailableError,
    "not_found": SandboxUnavailableError,
}

#: The names of a build context's Dockerfile (`Fleet.workspace(build=)`'s).
DOCKERFILES = ("Dockerfile", "Containerfile")
#: The files inspect finds beside a task and hands a docker-compatible sandbox.
CONFIG_FILES = ("compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml",
                "Dockerfile")

#: The fleet client of every environment of this process (one per event loop and owner).
POOL = FleetPool()


class BashfleetSandboxConfig(WorkspaceOptions):
    """The `bashfleet` sandbox's config: where each sample's workspace is made and how
    (`Task(sandbox=SandboxEnvironmentSpec("bashfleet", BashfleetSandboxConfig(...)))`, or
    a YAML/JSON file of these fields; a Dockerfile or a compose file of one service are
    read as docker's sandbox reads them, `compose_config`)."""


def config_of(config: SandboxEnvironmentConfigType | None) -> BashfleetSandboxConfig:
    """A task's sandbox config as ours: None (the defaults), the model, a compose model,
    another model of our fields, or the path of a Dockerfile, a compose file or a
    YAML/JSON file of our fields."""
    if config is None:
        return BashfleetSandboxConfig()
    if isinstance(config, BashfleetSandboxConfig):
        return config
    if isinstance(config, ComposeConfig):
        return compose_config(config, Path.cwd())
    if isinstance(config, str):
        return file_config(Path(config))
    if isinstance(config, BaseModel):
        return BashfleetSandboxConfig.model_validate(config.model_dump())
    raise TypeError(f"bashfleet sandbox config: a BashfleetSandboxConfig or a file name, "
                    f"not {type(config).__name__}")


def file_config(path: Path) -> BashfleetSandboxConfig:
    """A config file's: a Dockerfile (its directory is the build's context), a compose
    file, or a YAML/JSON file of our fields."""
    if is_dockerfile(str(path)):
        if path.name not in DOCKERFILES:
            raise ValueError(f"bashfleet sandbox: {path} must be named Dockerfile (or "
                             "Containerfile): the host builds the Dockerfile of a directory")
        return BashfleetSandboxConfig(build=str(path.resolve().parent))
    if is_compose_yaml(str(path)):
        try:
            compose = parse_compose_yaml(str(path), multiple_services=False)
        except ValueError as exc:
            raise ValueError(f"bashfleet sandbox: {exc}: a sample's workspace is one "
                             "container (give a compose file of one service)") from None
        return compose_config(compose, path.resolve().parent)
    import yaml  # noqa: PLC0415 - inspect-ai depends on PyYAML; only file configs need it

    loaded = yaml.safe_load(path.read_text()) or {}
    return BashfleetSandboxConfig.model_validate(loaded)


def compose_config(compose: ComposeConfig, base: Path) -> BashfleetSandboxConfig:
    """A compose file's one service as a workspace: its `image`, or its `build` (a
    directory relative to the compose file's, with a Dockerfile), its `user`, and no
    network when its `network_mode` is `none`. More than one service is refused: a
    sample's workspace is one container, never a host run in place of the others."""
    if len(compose.services) != 1:
        raise ValueError(f"bashfleet sandbox: the compose file has {len(compose.services)} "
                         f"services ({', '.join(compose.services)}); a sample's workspace "
                         "is one container: give a compose file of one service")
    (service,) = compose.services.values()
    build = compose_build(service.build, base)
    if build is None and service.image is None:
        raise ValueError("bashfleet sandbox: the compose service has neither an image nor "
                         "a build")
    return BashfleetSandboxConfig(
        image=None if build is not None else service.image, build=build, user=service.user,
        network=False if service.network_mode == "none" else None)


def compose_build(build: ComposeBuild | str | None, base: Path) -> str | None:
    """A compose service's build context as a directory with a Dockerfile, or None."""
    if build is None:
        return None
    context = build if isinstance(build, str) else build.context or "."
    dockerfile = None if isinstance(build, str) else build.dockerfile
    if dockerfile not in (None, *DOCKERFILES):
        raise ValueError(f"bashfleet sandbox: build.dockerfile {dockerfile!r}: the host "
                         "builds the context's own Dockerfile (or Containerfile)")
    return str((base / context).resolve())


def call_cwd(workspace_path: str, cwd: str | None) -> str | None:
    """Where a call runs: `cwd` as given when absolute, else under the workspace."""
    if cwd is None or posixpath.isabs(cwd):
        return cwd
    return posixpath.normpath(posixpath.join(workspace_path, cwd))


def exec_result(exact: Exact, output_limit: int, limit_text: str) -> ExecResult[str]:
    """inspect's view of a call that ran (or the exception it stands for)."""
    result = exact.result
    stdout = exact.stdout.decode(errors="replace")
    stderr = exact.stderr.decode(errors="replace")
    if result.error is not None:
        raise _NOT_RUN.get(result.error.kind, RuntimeError)(result.error.message)
    if result.timed_out:
        raise TimeoutError(f"the command timed out (killed): {stdout[-2000:]}")
    for data, text in ((exact.stdout, stdout), (exact.stderr, stderr)):
        if len(data) > output_limit:
            raise OutputLimitExceededError(limit_text, text)
    status = exit_status(result.exit_code, result.signal)
    if status == 126 and "permission denied" in stderr.casefold():
        raise PermissionError(errno.EACCES, stderr.strip())
    return ExecResult(success=status == 0, returncode=status, stdout=stdout, stderr=stderr)


@sandboxenv(name="bashfleet")
class BashfleetSandboxEnvironment(SandboxEnvironment):  # type: ignore[misc]
    """One sample's workspace on the fleet (see the module's docstring)."""

    def __init__(self, workspace: AsyncWorkspace, config: BashfleetSandboxConfig,
                 default_user: str | None = None) -> None:
        super().__init__()
        self.workspace = workspace
        """The sample's workspace."""
        self._config = config
        self._renewer = Renewer(workspace)
        self._user = InsideUser(workspace, default_user)
        self._output = ExactOutput(workspace)
        self._forks: list[BashfleetSandboxEnvironment] = []
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    async def task_init(cls, task_name: str,
                        config: SandboxEnvironmentConfigType | None) -> None:
        """Hold the fleet client for the task's samples (they share it)."""
        POOL.acquire(config_of(config).owner)

    @classmethod
    async def task_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                           cleanup: bool) -> None:
        """Let the fleet client go (the last holder closes it)."""
        await POOL.release(config_of(config).owner)

    @classmethod
    async def sample_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                          metadata: dict[str, str]) -> dict[str, SandboxEnvironment]:
        """Make the sample's workspace."""
        options = config_of(config)
        fleet = POOL.acquire(options.owner)
        try:
            workspace, default_user = await made_root(fleet, options.create_kwargs(
                tags={"framework": "inspect-ai", "task": task_name[:256]}))
        except BaseException:
            await POOL.release(options.owner)
            raise
        return {"default": cls(workspace, options, default_user)}

    @classmethod
    async def sample_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                             environments: dict[str, SandboxEnvironment],
                             interrupted: bool) -> None:
        """Delete the sample's workspace (every process in it ends)."""
        for environment in environments.values():
            if isinstance(environment, BashfleetSandboxEnvironment):
                await environment.close()

    async def close(self) -> None:
        """Stop renewing, delete the workspace (and its forks'), let the fleet client go
        (once: a fork closed by its solver is closed again by the sample's cleanup)."""
        if self._closed:
            return
        self._closed = True
        forks, self._forks = self._forks, []
        for fork in forks:
            await fork.close()
        await self._renewer.stop()
        try:
            await self.workspace.delete()
        except BashfleetError:
            pass  # unreachable now: its lease ends it
        finally:
            await POOL.release(self._config.owner)

    @classmethod
    def config_files(cls) -> list[str]:
        """The files inspect finds beside a task for this sandbox: a compose file or a
        Dockerfile, as docker's."""
        return list(CONFIG_FILES)

    @classmethod
    def is_docker_compatible(cls) -> bool:
        """A Dockerfile or a compose file of one service is a config of ours."""
        return True

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        """The config of a task read back from a log."""
        return BashfleetSandboxConfig.model_validate(config)

    def default_polling_interval(self) -> float:
        """exec_remote's polling: the fleet answers in milliseconds."""
        return 0.5

    # ------------------------------------------------------------------ snapshots

    async def snapshot(self, *, ttl_s: float | None = None,
                       tags: Mapping[str, str] | None = None) -> Snapshot:
        """The workspace's files as they are now, frozen: a native snapshot (its upper
        layer, no copy; its processes keep running, and are not part of it). It lives
        `ttl_s` (None: the fleet's default) unless deleted (`delete_snapshot`)."""
        return await self.workspace.snapshot(ttl_s=ttl_s, tags=tags)

    async def restore(self, snapshot: Snapshot | str) -> int:
        """Put the workspace's files back as `snapshot` (one of its own) holds them.
        Every process of the workspace ends first: how many did."""
        return (await self.workspace.restore(snapshot)).ended

    async def fork(self, n: int = 1, *, ttl_s: float | None = None
                   ) -> list[BashfleetSandboxEnvironment]:
        """n environments on new workspaces whose files are this one's now (no process
        running in them; the same paths, user and limits), each deleted when this one is
        (the sample's cleanup) unless closed before."""
        forked = await self.workspace.fork(
            n, ttl_s=ttl_s if ttl_s is not None else self._config.ttl_s,
            tags={"forked_from": self.workspace.id})
        made = []
        for workspace in forked:
            POOL.acquire(self._config.owner)  # each fork's close lets it go
            made.append(BashfleetSandboxEnvironment(workspace, self._config,
                                                    self._user.default))
        self._forks.extend(made)
        return made

    async def delete_snapshot(self, snapshot: Snapshot | str) -> bool:
        """Delete a snapshot (forks made from it keep their files); False: none by that id."""
        fleet = POOL.acquire(self._config.owner)
        try:
            return await fleet.delete_snapshot(snapshot)
        finally:
            await POOL.release(self._config.owner)

    # ----------------------------------------------------------------------- exec

    async def exec(  # noqa: PLR0917 - inspect's signature, called positionally
            self, cmd: list[str], input: str | bytes | None = None,
            cwd: str | None = None, env: dict[str, str] | None = None,
            user: str | None = None, timeout: int | None = None,
            timeout_retry: bool = True, concurrency: bool = True) -> ExecResult[str]:
        """Run `cmd` in the workspace (see the module's docstring). A timed-out command is
        not run again whatever `timeout_retry` says: it may have done half its work."""
        stdin = input.encode() if isinstance(input, str) else input
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        limit_text = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR
        try:
            command = await self._user.command_as(shell_line(cmd), user)
            exact = await self._output.run(
                stage(command, stdin), limit, cwd=call_cwd(self.workspace.path, cwd),
                env=dict(env or {}), timeout=timeout, policy=EXEC_POLICY, check=False)
        except UserUnavailableError as exc:
            raise SandboxUserUnsupportedError(str(exc)) from None
        except CallRejected as exc:
            raise ValueError(exc.message) from None
        except BashfleetError as exc:
            raise SandboxUnavailableError(f"bashfleet: {exc.message}") from exc
        return exec_result(exact, limit, limit_text)

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """How a person attaches a terminal to this sample's workspace: `bashfleet run
        --workspace W --tty bash`, as the workspace's owner (its calls are that owner's
        alone), with the same fleet settings as this process (BASHFLEET_REDIS_URL...)."""
        try:
            shell = await self._user.command_as("bash", user)
        except UserUnavailableError as exc:
            raise SandboxUserUnsupportedError(str(exc)) from None
        owner = shlex.quote(self.workspace.view.owner)
        command = (f"BASHFLEET_OWNER={owner} bashfleet run --workspace {self.workspace.id} "
                   f"--tty {shell if shell == 'bash' else shlex.quote(shell)}")
        return SandboxConnection(type="bashfleet", command=command)

    # ---------------------------------------------------------------------- files

    async def write_file(self, file: str, contents: str | bytes) -> None:
        """Write a file (its parents made) as the workspace's user, or as the image's
        USER when calls run as it by default (as docker's sandbox writes: theirs, the
        agent's, to change later)."""
        if self._user.default is not None:
            await self._write_as_default(file, contents)
            return
        try:
            await self.workspace.write_file(file, contents)
        except BashfleetError as exc:
            raise self._os_error(exc, file) from None

    async def _write_as_default(self, file: str, contents: str | bytes) -> None:
        """`write_file` by a command of the default user (a relative path under the
        workspace's directory, as `read_file` reads it)."""
        done = await self.exec(
            ["sh", "-c", 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', "sh", file],
            input=contents.encode() if isinstance(contents, str) else contents,
            cwd=self.workspace.path)
        if not done.success:
            raise os_error_in(done.stderr, file) or RuntimeError(
                f"could not write {file}: {done.stderr.strip()}")

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        """A file's text (UTF-8, newlines as they are) or bytes."""
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        try:
            data = await self.workspace.read_file(file, max_bytes=limit + 1)
        except BashfleetError as exc:
            raise self._os_error(exc, file) from None
        if len(data) > limit:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None)
        return data.decode("utf-8") if text else data

    @staticmethod
    def _os_error(exc: BashfleetError, file: str) -> Exception:
        """The OSError a file operation's failure stands for, else the sandbox is gone."""
        found = file_error(exc, file)
        if found is not None:
            return found
        unavailable: Exception = SandboxUnavailableError(f"bashfleet: {exc.message}")
        return unavailable
