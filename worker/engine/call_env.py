"""A call's (or background job's) environment where it runs: who it is in its workspace
(`HOME`, `USER`, `LOGNAME`, `SHELL`), its image's `ENV`, and what it takes of the
worker's own environment, put together by `environment.build_env`'s rules.

A call on the host's root takes `PATH` and `LANG` of the worker's environment; one on an
image takes none of it (the image's `ENV` as `docker exec` gives it, its `PATH` else the
usual one); either takes what the operator names (`BASHFLEET_ENV_PASS`). Nothing else of
whoever started the worker (`SSH_AUTH_SOCK`, `VIRTUAL_ENV`, `PYTHONPATH`, an exported
password) reaches a command.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from functools import lru_cache

from bashfleet.worker.engine import sandbox
from bashfleet.worker.engine.environment import (
    DEFAULT_PATH,
    HOST_INHERITED,
    ChildEnv,
    build_env,
    process_environ,
)
from bashfleet.worker.engine.workspaces import visibility
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import Call, WorkspaceRecord


@lru_cache(maxsize=32)
def _account(uid: int) -> tuple[str, str, str] | None:
    """(name, home, login shell) of a host account, None when it has no entry (a worker
    in a container may run as an id its /etc/passwd does not list). Cached: one lookup a
    call cost tens of microseconds, and accounts do not change under a running worker."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return None
    return entry.pw_name, entry.pw_dir, entry.pw_shell


def identity(user: sandbox.User | None, workspace: WorkspaceRecord | None,
             worker_env: Mapping[str, str]) -> dict[str, str]:
    """What a call's environment says of who it is: `HOME`, and `USER`, `LOGNAME` and
    `SHELL` where its account is known; with ids of its own, its image's `ENV` too
    (`workspaces.workspace_env`). `user` is the host's run user (None: the worker's own).
    """
    sandboxed = workspace is not None and workspace.keeper_pid is not None
    if workspace is not None and sandboxed and workspace.ids is not None:
        env = {"HOME": visibility.home_of(user, workspace), **visibility.workspace_env(workspace)}
        root = _account(0)
        # Root inside a workspace on the host's root is the host's root account's shape.
        if workspace.image is None and env.get("USER") == "root" and root and root[2]:
            env["SHELL"] = root[2]
        return env
    account = _account(user.uid if user is not None else os.geteuid())
    env = {}
    if user is not None:
        env["HOME"] = visibility.home_of(user, workspace) if sandboxed else user.home
    elif sandboxed:
        env["HOME"] = visibility.home_of(None, workspace)
    elif home := worker_env.get("HOME") or (account[1] if account else ""):
        env["HOME"] = home  # the worker's own user, unsandboxed: its own home
    if account is not None:
        env.update(USER=account[0], LOGNAME=account[0])
        if account[2]:
            env["SHELL"] = account[2]
    return env


def child_env(call: Call, settings: Settings, workspace: WorkspaceRecord | None,
              user: sandbox.User | None, *, marker: str,
              worker_env: Mapping[str, str] | None = None) -> ChildEnv:
    """The environment `call` runs with in `workspace` as `user`, marked `marker`
    (`worker_env`: the worker's own environment, read from this process when None)."""
    base = process_environ() if worker_env is None else worker_env
    own = identity(user, workspace, base)
    on_image = workspace is not None and workspace.image is not None
    if on_image:
        own.setdefault("PATH", DEFAULT_PATH)
    return build_env(
        base, marker=marker, inherit=() if on_image else HOST_INHERITED,
        passed=settings.env_pass, own=own, extra=call.env, unset=call.unset_env,
        deny=settings.secret_deny, allow=settings.secret_allow,
    )
