"""Configuration: `BASHFLEET_*` environment variables, read once per process."""

from __future__ import annotations

import json
import os
import pwd
import re
import socket
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from bashfleet.worker.engine.environment import DEFAULT_ALLOW, DEFAULT_DENY
from bashfleet.worker.state_dir import default_state_dir
from bashfleet.worker.wire.owner_keys import OwnerKey, SealingKeys, is_owner_key, owner_space


def _split(value: object) -> object:
    # Lists come from the environment as comma-separated text.
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


CsvTuple = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_split)]



class Settings(BaseSettings):
    """Every knob of bashfleet. Set them as `BASHFLEET_<NAME>` variables."""

    model_config = SettingsConfigDict(env_prefix="BASHFLEET_", extra="ignore", frozen=True)

    redis_url: SecretStr | None = None
    """Redis URL: `redis://`, `rediss://` (TLS), or `sentinel://` (sentinels and the
    name of the primary they watch, `?master=NAME`); None: the local fleet started by
    `up`."""
    host: str = Field(default_factory=socket.gethostname)
    """This worker's host id."""
    state_dir: Path = Field(default_factory=default_state_dir)
    """Where spill files, job files and the local fleet's state live."""
    concurrency: int = Field(4, ge=1, le=256)
    """Command slots of a worker."""
    labels: CsvTuple = ()
    """Pool labels of a worker: it also serves `bashfleet.pool.<label>.exec`."""
    secret_deny: CsvTuple = DEFAULT_DENY
    """Variable name patterns scrubbed from the child environment, besides the default
    ones (`*KEY*`, `*SECRET*`, `*TOKEN*`...: an operator's patterns add to them; keep a
    variable they would scrub with `secret_allow`)."""
    secret_allow: CsvTuple = DEFAULT_ALLOW
    """Variable name patterns kept even when a deny pattern matches."""
    secret_files: CsvTuple = ()
    """Files holding secrets (env files, .netrc...): their values are redacted from output."""
    env_pass: CsvTuple = ()
    """Variable name patterns (`LC_*`, `HTTPS_PROXY`) a call takes from the worker's own
    environment, which it otherwise does not (only `PATH` and `LANG` on the host's root);
    `secret_deny` still scrubs them unless `secret_allow` keeps them."""
    spill_min_free_bytes: int = Field(64 * 1024 * 1024, ge=0)
    """Below this much free space in the spill directory, output is captured in memory only."""
    sweep_rounds: int = Field(5, ge=1, le=50)
    """How many times a kill re-scans for processes that carry the call's marker."""
    retention_max_age_s: float = Field(7 * 24 * 3600.0, ge=0)
    """`bashfleet gc` removes spill and ended-job files not modified for this long."""
    retention_max_bytes: int = Field(10 * 1024**3, ge=0)
    """`bashfleet gc` then removes the oldest of them until they take less than this."""
    retention_min_age_s: float = Field(3600.0, ge=0)
    """`bashfleet gc` never removes a file modified more recently than this."""
    signing_key: SecretStr | None = None
    """The fleet's key: workers require it and derive owners' keys from it; an operator's
    client signs with it, as any owner (an owner's client holds an owner key instead:
    `owner_key`). None: unsigned (a worker then refuses to start unless told
    `--insecure-unsigned`)."""
    signing_keys_accepted: SecretStr | None = None
    """Older keys a worker still accepts (comma-separated), while clients roll to a new one."""
    command_deny: tuple[str, ...] = ()
    """Regular expressions (a JSON list): a command matching any is refused on this host."""
    command_allow: tuple[str, ...] = ()
    """Regular expressions (a JSON list): when set, only matching commands run here."""
    limit_memory_mb: int | None = Field(None, ge=1)
    """Per-call memory limit, in MiB: the call's cgroup (resident memory, the OOM killer
    past it) where the host lets the worker make one, else ulimit -v (virtual memory)."""
    limit_cpu_s: int | None = Field(None, ge=1)
    """Per-call CPU time limit (ulimit -t), in seconds: SIGXCPU, then SIGKILL."""
    limit_file_mb: int | None = Field(4096, ge=1)
    """Largest file a call may write (ulimit -f), in MiB: SIGXFSZ past it. Default 4 GiB: a
    runaway `yes > file` stops there instead of filling the disk."""
    limit_procs: int | None = Field(4096, ge=1)
    """Processes a call may run at once: the call's cgroup (pids.max) where the host lets
    the worker make one, else ulimit -u (which counts all of the user's processes and is
    not enforced for root). Default 4096: a fork bomb stops there."""
    log_format: Literal["text", "json"] = "text"
    """Worker log lines: `text`, or `json` (one object per line, for log shippers)."""
    signing_key_file: Path | None = None
    """File holding the signing key (instead of BASHFLEET_SIGNING_KEY): a Kubernetes
    Secret or a systemd credential mounted as a file keeps it out of every environment."""
    redis_url_file: Path | None = None
    """File holding the Redis URL (instead of BASHFLEET_REDIS_URL), for the same reason."""
    admin_key: SecretStr | None = None
    """Key of an administrator's client: its calls may check, read and kill any owner's
    jobs and list them all (a worker verifies it as it verifies the signing key)."""
    admin_key_file: Path | None = None
    """File holding the admin key (instead of BASHFLEET_ADMIN_KEY)."""
    owner_key: SecretStr | None = None
    """A client's owner key (`bashfleet owner add NAME` prints it): its calls act as that
    owner only, and it reads that owner's records only. An owner key given as
    BASHFLEET_SIGNING_KEY counts as one too; a fleet key there keeps acting as any owner
    (an operator's, a worker's)."""
    owner_key_file: Path | None = None
    """File holding the owner key (instead of BASHFLEET_OWNER_KEY)."""
    insecure_unsigned: bool = False
    """A worker without a signing key refuses to start unless this is set: then anyone
    who can write to its Redis runs commands on its machine."""
    owner: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:@-]{1,64}$")
    """Who a client's calls and jobs belong to when no session names them (a tenant);
    None: `user:<login name>`. Another owner's jobs cannot be checked, read or killed."""
    isolation: Literal["auto", "none", "process", "strict"] = "auto"
    """How calls are sandboxed by default (a workspace may ask for stronger, never
    weaker): `process`: each workspace its own PID namespace and mount view, the host
    read-only around its directory, a private /tmp and HOME, every bashfleet state
    directory and secret file hidden, calls as the run user with no capability;
    `strict`: also its own network namespace (no network unless `sandbox_network`) and
    /home and /root hidden; `none`: plain `bash -c` (only when asked for); `auto`:
    `process`, and `bashfleet worker` refuses to start where it cannot work (only the
    local `bashfleet up` falls back to `none`, saying so)."""
    seccomp: Literal["default", "unconfined"] = "default"
    """The system call filter of sandboxed calls (`bashfleet.worker.engine.isolate.syscall_filter`):
    `default`: containers-common's default profile (podman's), keyctl also refused, EPERM
    for what it refuses; `unconfined`: none. `bashfleet hosts` shows it."""
    bwrap: str = "bwrap"
    """The bubblewrap executable (a name looked up on PATH, or a path)."""
    sandbox_writable: CsvTuple = ()
    """Host paths every workspace's calls may write, besides their own directory, /tmp
    and HOME (a shared cache: `/var/cache/ccache`). Empty: none."""
    sandbox_hidden: CsvTuple = ()
    """More paths hidden from sandboxed calls (an empty directory or file in their place),
    besides the state directory, the default state directory and `secret_files`."""
    sandbox_network: bool = False
    """`strict` workspaces may reach the network. Any workspace may cut it
    (`network=False`: its own network namespace, loopback only)."""
    network_default: Literal["none", "egress", "host"] = "egress"
    """The policy of a workspace that asks for none (`bashfleet.worker.wire.network`): `egress`
    (the internet, not the fleet, the host, link-local or private ranges), `none`
    (loopback only) or `host` (needs `network_host_ok`)."""
    network_allow_private: CsvTuple = ()
    """Private or link-local ranges `egress` workspaces may reach all the same
    (`10.1.2.0/24` for an internal package mirror); never the fleet's Redis."""
    network_deny: CsvTuple = ()
    """More addresses no workspace reaches, whatever its policy (the fleet's Flower or a
    registry on a public address); the fleet's Redis is always among them."""
    network_host_ok: bool = False
    """Workspaces may ask for the `host` policy (the host's own network namespace)."""
    network_pool: str = "10.250.0.0/16"
    """Addresses of the links between workspaces and the host (a /30 each): pick a range
    the host's networks do not use."""
    network_max_connections: int = Field(512, ge=1)
    """Connections a workspace may have open at once beyond its loopback (past it new
    ones are refused)."""
    network_resolvers: CsvTuple = ()
    """DNS servers of workspaces (reached through the host); empty: the host's
    /etc/resolv.conf."""
    pasta: str = "pasta"
    """pasta (Debian's `passt`), which links workspaces to the network where the worker
    is not root (a name looked up on PATH, or a path)."""
    cgroups: Literal["auto", "off"] = "auto"
    """`auto`: each call runs in a cgroup of its own (memory, processes, CPU) where the
    host lets the worker make one (cgroup v2 delegated to it, or v1 as root); `off`: the
    ulimit line only."""
    limit_cpus: float | None = Field(None, gt=0)
    """CPU bandwidth of a call, in CPUs (1.5: one and a half cores), in its cgroup."""
    limit_output_mb: int | None = Field(1024, ge=1)
    """Output (stdout + stderr) one call or background job may write, in MiB: past it the
    call is stopped like a timeout, with a notice. Default 1 GiB."""
    run_as: str | None = None
    """User name calls run as when the worker is root (never root; its groups and ids).
    None: `bashfleet-run` when that account exists, else `nobody`. A worker that is not
    root runs calls as itself, in a user namespace, with no capability."""
    id_range: str | None = Field(None, pattern=r"^[0-9]+:[0-9]+$")
    """`start:count`: the host ids (uids and gids alike) this worker gives its workspaces,
    inside the run user's subordinate ids; give each worker of a machine that cannot share
    `id_lock_dir` (a container beside a native worker) a range of its own. None: all of
    the run user's subordinate ids."""
    id_lock_dir: Path = Path("/run/bashfleet/ids")
    """Where workspaces' host ids are claimed (a lock per range): every worker of a
    machine must see the same directory (a container binds it from the host), or have an
    `id_range` of its own."""
    workspace_root: Path | None = None
    """Where fresh workspaces are made. None: /var/lib/bashfleet/workspaces for a root
    worker, else `$XDG_DATA_HOME/bashfleet/workspaces` (~/.local/share/...)."""
    layer_image_gb: int | None = Field(None, ge=1, le=65536)
    """Keep workspaces' layers, their directories and snapshots on an XFS file system
    with reflink of this many GiB (a sparse image, `layers.xfs` in `state_dir`, made and
    loop-mounted on `state_dir/layers` by a root worker at start and kept mounted for the
    next; fresh workspaces are then made there, not in `workspace_root`), so that a
    snapshot shares its files' extents instead of copying their bytes. None: the plain
    directories (where their own file system clones, XFS or btrfs, a snapshot clones
    anyway)."""
    workspace_allow: CsvTuple = ()
    """Roots under which an existing host directory may be a workspace (`path=`, a call's
    `--cwd`): writable by its calls, every other directory under these roots hidden."""
    workspace_ttl_s: float = Field(3600.0, gt=0)
    """Seconds a workspace lives unused before this host reaps it, unless its maker gave
    a TTL (a session's lives as long as the session: 24 h)."""
    keeper_idle_s: float = Field(1.0, ge=0)
    """Seconds a workspace's Python keeper waits with nothing to do (no call or job
    running in it, no message from a worker) before it exits, leaving the workspace's
    namespaces and processes to its holder (a small static program, pid 1, ~0.05-0.1 MiB
    instead of 2-3); the next call wakes a keeper again (a fork of the worker's zygote
    set into the workspace: ~25 ms, most of it the cgroup v1 join's RCU grace period).
    0: keepers never sleep (and workspaces get no holder)."""
    holder: Path | None = None
    """A prebuilt holder binary (`cc -static -O2 isolate/holder.c`); None: the worker
    builds one into `state_dir` when a C compiler and a static libc are there, else its
    workspaces keep their Python keepers awake."""
    spawner: Path | None = None
    """A prebuilt spawner binary, a call's first process where workspaces have ids of
    their own (`cc -static -nostdlib -ffreestanding -fno-builtin -fno-stack-protector
    -fno-tree-loop-distribute-patterns -O2 isolate/spawn.c`: `holder.spawn_build_argv`);
    None: the worker builds one into `state_dir` when a C compiler is there, else keepers
    fork their calls."""
    workspace_pool: int = Field(2, ge=0, le=64)
    """Throwaway workspaces (for calls without a session) each command consumer keeps
    ready, so that such a call does not wait for one to be made."""
    limit_workspaces: int = Field(256, ge=1, le=100_000)
    """Most live workspaces one owner may have, counted across the fleet."""
    limit_snapshots: int = Field(64, ge=1, le=100_000)
    """Most snapshots one owner may keep, counted across the fleet (those `fork` makes
    for its forks included)."""
    limit_snapshot_mb: int | None = Field(None, ge=1)
    """Bytes one owner's snapshots may hold together, across the fleet, in MiB. None:
    no cap."""
    snapshot_ttl_s: float = Field(24 * 3600.0, gt=0, le=30 * 24 * 3600.0)
    """Seconds a snapshot lives unless its maker says (workspaces standing on it keep
    its layer past that)."""
    limit_workspace_mb: int | None = Field(None, ge=1)
    """Bytes one workspace may hold on disk (its directory, /tmp, HOME, kept output), in
    MiB. None: no cap."""
    interactive_idle_s: float | None = Field(3600.0, gt=0)
    """An interactive session (stdin `pipe`, `pty` or `closed`) that nobody wrote to or
    read from, and that printed nothing, for this many seconds is ended. None: never."""
    interactive_max_per_owner: int = Field(64, ge=1, le=10_000)
    """Most interactive sessions one owner may have running on this host at once; a new
    one past it is refused (`invalid`), saying which are running."""
    limit_jobs: int = Field(64, ge=1, le=100_000)
    """Most background jobs one owner may have running at once, fleet-wide (counted in
    Redis, atomically: many clients sharing an owner cannot pass it). A background start
    past it is refused (`limit`), saying how many run and when to retry. A foreground
    call that goes to the background (a timeout, a detach) is counted, never refused."""
    limit_open_files: int | None = Field(4096, ge=16, le=1 << 20)
    """Files (and sockets) each process of a workspace may hold open at once:
    RLIMIT_NOFILE, soft and hard, set for every call, job and tool (a workspace's
    `limits.open_files` may lower it). Per process: with `limit_procs` it bounds what one
    workspace holds. None: the worker's own limit, inherited."""
    lane_threads_per_owner: int = Field(4, ge=1, le=256)
    """Control requests that take time (file reads and writes, transfers' starts,
    workspaces, snapshots, images) run on threads of their owner's lane, never on the
    control consumer's: at most this many at once per owner on a host, the rest waiting
    their turn (`bashfleet.worker.fleet.lanes`). `check`, `kill`, `cancel` never wait for them."""
    lane_threads: int = Field(32, ge=1, le=4096)
    """Threads of every owner's lanes together on a host (owners take turns past it)."""
    file_op_timeout_s: float = Field(20.0, gt=0, le=3600)
    """Seconds a workspace's file read or write, or a transfer's start, may take (its
    tool in the workspace is killed past it, and the caller told): below a client's
    30 s wait for a control answer."""
    transfer_timeout_s: float = Field(3600.0, gt=0)
    """Seconds a transfer may move data (either side idle for 30 s ends it sooner)."""
    registry_auth_file: Path | None = None
    """Credentials this host pulls images with: a Docker `config.json` (`auths`), passed
    to skopeo and buildah as `--authfile`. Hidden from every call, never printed."""
    registry_certs_dir: Path | None = None
    """A directory of CA certificates (`*.crt`) and client keys (`*.cert`, `*.key`) for
    registries, beside /etc/containers/certs.d (skopeo's `--cert-dir`). Hidden from calls."""
    registry_insecure: CsvTuple = ()
    """Registry hosts (`host` or `host:port`) reached without TLS verification (a lab
    registry with a self-signed certificate): never for a registry on a shared network."""
    snapshot_registry: str | None = None
    """Where snapshot layers travel between hosts: a repository of the registry the
    images come from (`127.0.0.1:5000/bashfleet/snapshots`, no tag), reached with the
    credentials and certificates above; snapshot `S` is pushed once to `<it>:S` and
    pulled once by each host that forks it. None: snapshots stay on their host."""
    images_max_age_s: float = Field(30 * 24 * 3600.0, ge=0)
    """`bashfleet gc` removes an image no workspace uses and none has used for this long."""
    images_max_bytes: int = Field(50 * 1024**3, ge=0)
    """`bashfleet gc` then removes the least recently used unused images until the
    host's images take less than this."""
    build_ids: tuple[int, int] = (4_200_000_000, 65536)
    """Host ids a Dockerfile's RUN steps run as (a JSON list: `[first, count]`): root in
    the build is the first id on the host, never the worker's root, so a Dockerfile need
    not be trusted. Keep the range apart from the workspaces' ids and /etc/subuid."""
    build_as_root: bool = False
    """Run a Dockerfile's RUN steps as the host's root, in a chroot (faster: buildah's
    overlay driver instead of vfs): for trusted Dockerfiles only."""

    @model_validator(mode="before")
    @classmethod
    def _secrets_from_files_and_parent(cls, data: Any) -> Any:
        """Fill the secret fields from their files, then from what the parent process
        handed over (`inherit_secrets`); a value given directly wins."""
        if not isinstance(data, dict):
            return data
        for name in SECRET_FIELDS:
            if data.get(name) is None and data.get(f"{name}_file"):
                data[name] = _read_secret_file(Path(data[f"{name}_file"]), name)
        for name, value in _inherited().items():
            if data.get(name) is None:
                data[name] = value
        return data

    @model_validator(mode="after")
    def _workspace_root_apart(self) -> Settings:
        """A workspace root inside the workspaces' state would mix a workspace's
        directory with its keeper's private files."""
        root, state = self.workspace_root_dir().resolve(), self.workspaces_dir.resolve()
        if root.is_relative_to(state):
            raise ValueError(f"workspace_root ({root}) must lie apart from {state}, where "
                             "this host keeps its workspaces' private files")
        return self

    @field_validator("secret_deny")
    @classmethod
    def _deny_adds_to_defaults(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*DEFAULT_DENY, *patterns)))

    @field_validator("command_deny", "command_allow")
    @classmethod
    def _rules_compile(cls, rules: tuple[str, ...]) -> tuple[str, ...]:
        for rule in rules:
            try:
                re.compile(rule)
            except re.error as exc:
                raise ValueError(f"invalid command rule {rule!r}: {exc}") from None
        return rules

    @field_validator("build_ids")
    @classmethod
    def _ids_fit(cls, ids: tuple[int, int]) -> tuple[int, int]:
        if not (ids[0] >= 1 and ids[1] >= 1 and sum(ids) <= 2**32 - 1):
            raise ValueError(f"build_ids {ids}: a first host id of at least 1 and a count "
                             "of at least 1, within the 32-bit ids")
        return ids

    @field_validator("snapshot_registry")
    @classmethod
    def _a_repository(cls, prefix: str | None) -> str | None:
        # Only the shape here (a tag or digest would make `<prefix>:S` no reference);
        # `snapshot_registry.snapshot_ref` checks the whole reference.
        if prefix is not None and ("@" in prefix or ":" in prefix.rsplit("/", 1)[-1]
                                   or not prefix.strip() or prefix != prefix.strip()):
            raise ValueError(f"snapshot_registry {prefix!r}: a repository such as "
                             "registry:5000/bashfleet/snapshots, without tag or digest")
        return prefix

    @field_validator("run_as")
    @classmethod
    def _user_exists(cls, user: str | None) -> str | None:
        if user is None:
            return None
        try:
            pwd.getpwnam(user)
        except KeyError:
            raise ValueError(f"run_as: no such user {user!r} on this machine") from None
        return user

    @property
    def spill_dir(self) -> Path:
        """Spill files of foreground calls."""
        return self.state_dir / "spill"

    @property
    def workspaces_dir(self) -> Path:
        """Records, keeper sockets and the private /tmp and HOME of this host's workspaces
        (not `workspaces`: the default workspace root of a root worker is
        /var/lib/bashfleet/workspaces, and /var/lib/bashfleet its usual state directory)."""
        return self.state_dir / "workspace-state"

    @property
    def layer_mount(self) -> Path:
        """Where the layer image (`layer_image_gb`) is mounted."""
        return self.state_dir / "layers"

    def workspace_root_dir(self) -> Path:
        """Where fresh workspaces are made (`workspace_root`, else the run mode's default;
        with the layer image in place, its own: a workspace's directory on it, no link on
        the way, is bound at the same path in its view)."""
        if self.layer_image_gb is not None and (self.layer_mount / "workspaces").is_dir():
            return self.layer_mount / "workspaces"
        if self.workspace_root is not None:
            return self.workspace_root
        if os.geteuid() == 0:
            return Path("/var/lib/bashfleet/workspaces")
        data = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
        return Path(data) / "bashfleet" / "workspaces"

    @property
    def jobs_dir(self) -> Path:
        """Output, status and record files of background jobs."""
        return self.state_dir / "jobs"

    def accepted_keys(self) -> tuple[str, ...]:
        """Every key a worker accepts: the current one first, then the older ones."""
        keys = [self.signing_key.get_secret_value()] if self.signing_key else []
        if self.signing_keys_accepted:
            keys += [k.strip() for k in self.signing_keys_accepted.get_secret_value().split(",")]
        return tuple(k for k in keys if k)

    def sealing_keys(self) -> SealingKeys:
        """The keys a worker seals what it publishes with (job records and events, its
        host record): every signing key it accepts and the admin key, so that a client
        holding any one of them verifies; an owner's records also with that owner's key
        (`SealingKeys.for_owner`), records for everyone with the reader key."""
        admin = (self.admin_key.get_secret_value(),) if self.admin_key else ()
        fleet = self.fleet_keys()
        return SealingKeys(dict.fromkeys((*fleet, *admin)), fleet)

    def fleet_keys(self) -> tuple[str, ...]:
        """The fleet keys among the accepted keys (an owner key is none: a client
        configured with one as its signing key holds no fleet key)."""
        return tuple(key for key in self.accepted_keys() if not is_owner_key(key))

    def client_owner_key(self) -> OwnerKey | None:
        """The owner key a client is configured with: BASHFLEET_OWNER_KEY, else an owner
        key given as BASHFLEET_SIGNING_KEY; None for a fleet key (or none). ValueError
        for a malformed one."""
        for value in (self.owner_key, self.signing_key):
            text = value.get_secret_value() if value is not None else ""
            if (value is self.owner_key and text) or is_owner_key(text):
                return OwnerKey.parse(text)
        return None

    def owner_space(self, owner: str) -> str:
        """The name of `owner`'s quotas and job index in Redis (`owner_keys.space_of`):
        not computable from the owner's name alone."""
        fleet = self.fleet_keys()
        return owner_space(fleet[0] if fleet else None, owner)

    def redis_url_value(self) -> str | None:
        """The Redis URL in clear, for connecting only: never print it."""
        return self.redis_url.get_secret_value() if self.redis_url else None

    def secrets(self) -> dict[str, str]:
        """The secret settings in clear, by field name (to hand to a child process)."""
        values = {name: getattr(self, name) for name in SECRET_FIELDS}
        return {name: value.get_secret_value() for name, value in values.items() if value}

    def owner_name(self) -> str:
        """Who this client's calls belong to without a session: `owner`, else the owner
        its owner key names, else the user."""
        if self.owner:
            return self.owner
        try:
            key = self.client_owner_key()
        except ValueError:
            key = None
        return key.owner if key is not None else f"user:{_login_name()}"


#: Settings that are secrets: never in an environment a call could read, never printed.
SECRET_FIELDS = ("redis_url", "signing_key", "signing_keys_accepted", "admin_key", "owner_key")
#: Variables that hold one of the worker's own secrets, by name: the secret settings,
#: and the password an operator passes through to build the Redis URL (Kubernetes'
#: `$(BASHFLEET_REDIS_PASSWORD)`). Never a pattern: `*SECRET*` would also take
#: BASHFLEET_SECRET_FILES, _DENY and _ALLOW, which are settings, not secrets.
SECRET_VARIABLES = (
    *(f"BASHFLEET_{name.upper()}" for name in SECRET_FIELDS), "BASHFLEET_REDIS_PASSWORD",
)


def secret_paths(settings: Settings) -> list[Path]:
    """Every file a setting names as secret: `BASHFLEET_SECRET_FILES` and every `*_FILE`
    setting (the signing key's, the admin key's, the Redis URL's...). A sandbox hides
    them all from calls; the worker reads them before any call runs."""
    named = [Path(path) for path in settings.secret_files]
    if settings.registry_certs_dir is not None:
        named.append(settings.registry_certs_dir)  # may hold a client key (mutual TLS)
    for name in Settings.model_fields:
        value = getattr(settings, name)
        if name.endswith("_file") and value is not None:
            named.append(Path(value))
    return list(dict.fromkeys(named))
#: The variable naming the descriptor a parent handed the secrets over on.
SECRETS_FD_VAR = "BASHFLEET_SECRETS_FD"


def _read_secret_file(path: Path, name: str) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(f"cannot read {name} from {path}: {exc.strerror}") from None


def _login_name() -> str:
    import pwd  # noqa: PLC0415 - POSIX only, and only for the default owner

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


_inherited_secrets: dict[str, str] | None = None


def _inherited() -> dict[str, str]:
    """The secrets a parent handed over on the descriptor named by BASHFLEET_SECRETS_FD
    (read once, then the descriptor is closed and the variable dropped)."""
    global _inherited_secrets  # noqa: PLW0603 - read once per process, by design
    if _inherited_secrets is None:
        _inherited_secrets = {}
        fd = os.environ.pop(SECRETS_FD_VAR, None)
        if fd is not None and fd.isdigit():
            with os.fdopen(int(fd), "rb") as handle:
                loaded = json.loads(handle.read() or b"{}")
            _inherited_secrets = {
                k: str(v) for k, v in loaded.items() if k in SECRET_FIELDS and v
            }
    return _inherited_secrets


def secrets_pipe(values: dict[str, str]) -> int:
    """A pipe holding `values` for a child: returns the read end, to pass with
    `pass_fds` and name in BASHFLEET_SECRETS_FD (the child's settings read it).

    Secrets travel this way, not in an environment: /proc/<pid>/environ keeps a
    process's initial environment for its whole life, readable by its user.
    """
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "wb") as handle:
        handle.write(json.dumps(values).encode())  # small: far below the pipe's buffer
    return read_end


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read from the environment once."""
    return Settings()
