"""`bashfleet run --image REF CMD`'s light case: the workspace made, the call run and the
workspace ended with no model built and neither pydantic nor the fleet client loaded.

    place    `--host H`, else the fleet's one live host (Redis' host list)
    make     WorkspaceCreateRequest as JSON (`create_data`), `pull` off: the host makes
             it from the image it holds, or refuses at once and makes nothing
    call     the plain path (`bashfleet.client.cli.plain`) in that workspace, on the
             same connections and reply channel
    end      WorkspaceDeleteRequest (`delete_data`), put on the host's control queue and
             not waited for; first, when the call went on as a job or was handed over,
             JobsRequest (`jobs_data`): a job that still runs keeps the workspace (its
             TTL, a day, ends it), said on stderr as the fleet client's path says it

Each request is its model's JSON (a unit test holds each builder equal to the model's
dump for a table of arguments), signed and sent through the functions the fleet client
sends with (`bashfleet.client._core.sending`), over the plain path's connection
(`plain.Line.control`); the worker validates it with the models as it does every one.

What this path cannot do goes to the fleet client's path (`run` returns None) before
anything is made: `--build`, `--user`, `--network`, `--build-network`, a call that is not
plain (`--json`, `--follow`, `--session`, a tag, background, a terminal or piped stdin),
a Redis the light client does not speak (TLS, Sentinel), several live hosts and no
`--host` (placement then weighs the images each host holds), a host that is down, and a
create the host refuses (an image it does not hold, a bad reference, a cap reached:
nothing was made, and the fleet client pulls first, or says the error in its words).

Once the workspace is made, it is ended on every way out: the call's result, an error,
a call handed over to the fleet client, Ctrl-C or SIGTERM while it is made (its answer
is still waited for, then the workspace deleted) or while the call runs (the call is
cancelled by the fleet client, as any plain call's).
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from bashfleet.client import exit_status as statuses
from bashfleet.client.cli import plain
from bashfleet.client.errors import HostUnavailable, WorkerError, error_for
from bashfleet.client.foreground import Interrupts, piped_stdin
from bashfleet.worker.fleet.connect import connection_errors, redis_client, use_light_client
from bashfleet.worker.wire import names
from bashfleet.worker.wire.names import Task

#: Longest image reference the wire takes (`WorkspaceSpec.image`: a unit test holds the
#: two equal).
MAX_IMAGE_REF = 1024
#: A workspace's limits as the wire's model dumps them unset (none asked).
NO_LIMITS: dict[str, Any] = {
    "memory_mb": None, "procs": None, "cpus": None, "disk_mb": None, "open_files": None,
}


def is_light(args: argparse.Namespace) -> bool:
    """Whether `run`'s arguments ask for what this path does (the module says what)."""
    if not args.image or args.build or args.user or args.network is not None:
        return False
    if args.build_network is not None or args.workspace or args.session or args.tty:
        return False
    if not args.no_stdin and piped_stdin():
        return False
    as_call = argparse.Namespace(**{**vars(args), "image": None, "workspace": "w"})
    return plain.is_plain(as_call)


def create_data(args: argparse.Namespace, *, owner: str, ttl_s: float) -> dict[str, Any] | None:
    """The WorkspaceCreateRequest `run --image` sends, as JSON data: what
    `WorkspaceCreateRequest(spec=..., pull=False, owner=owner).model_dump(mode="json")`
    gives. None when the arguments ask for what this function does not check."""
    image = args.image
    if not (isinstance(image, str) and image and len(image) <= MAX_IMAGE_REF
            and plain.clean(image) and args.isolation in (None, "none", "process", "strict")
            and re.fullmatch(names.OWNER_PATTERN, owner)):
        return None
    spec = {
        "owner": "", "path": None, "isolation": args.isolation, "network": None,
        "ttl_s": ttl_s, "limits": dict(NO_LIMITS), "mounts": {}, "session": None,
        "tags": {}, "near": None, "image": image, "build": None, "build_network": None,
        "user": None, "snapshot": None,
    }
    return {"owner": owner, "spec": spec, "pull": False}


def delete_data(ws_id: str, *, owner: str) -> dict[str, Any]:
    """`WorkspaceDeleteRequest(id=ws_id, owner=owner).model_dump(mode="json")`."""
    return {"owner": owner, "id": ws_id}


def jobs_data(ws_id: str, *, owner: str) -> dict[str, Any]:
    """`JobsRequest(workspace=ws_id, owner=owner).model_dump(mode="json")`."""
    return {"owner": owner, "all_owners": False, "workspace": ws_id}


def made_id(reply: dict[str, Any], host: str) -> str | None:
    """The id of the workspace a create's reply (as data) says was made; None when it was
    refused (nothing made); WorkerError when it says neither."""
    if reply.get("error") is not None:
        return None
    ws_id = (reply.get("ok") or {}).get("id")
    if not (isinstance(ws_id, str) and re.fullmatch(names.WORKSPACE_ID_PATTERN, ws_id)):
        raise WorkerError(f"the worker on {host} answered {str(reply)[:200]!r}")
    return ws_id


def interrupted_status(interrupts: Interrupts) -> int | None:
    """The exit status Ctrl-C (130) or SIGTERM (143) pressed meanwhile asks for; None."""
    if interrupts.sigterm:
        return statuses.TERMINATED
    return statuses.INTERRUPTED if interrupts.sigint else None


# ------------------------------------------------------------------------------ run


def run(args: argparse.Namespace) -> int | None:
    """Run `run --image`'s call in a workspace made for it: its exit status; None when
    the fleet client's path must do it (nothing was made)."""
    from bashfleet.client.cli.run import RUN_IMAGE_TTL_S  # noqa: PLC0415 - its caller's

    if not is_light(args):
        return None
    url, identity = plain.fleet_of()
    if url is None or identity is None:
        return None
    create = create_data(args, owner=identity.owner, ttl_s=RUN_IMAGE_TTL_S)
    if create is None:
        return None
    use_light_client()
    line = plain.Line(url, identity, redis_client(url))
    try:
        host = _placed(line, args.host)
        return None if host is None else _made_and_run(line, args, host, create)
    finally:
        line.close()


def _placed(line: plain.Line, host: str | None) -> str | None:
    """Where the workspace goes: `host`, else the fleet's one live host; None when the
    fleet client must place it (several live hosts, or none)."""
    if host is not None:
        try:
            return names.validate_host(host)
        except ValueError:
            return None  # the fleet client says why
    try:
        known = line.client.zrange(names.HOSTS_KEY, 0, -1)
        with line.client.pipeline(transaction=False) as pipe:
            for each in known:
                pipe.exists(names.alive_key(each))
            alive = [each for each, up in zip(known, pipe.execute(), strict=True) if up]
    except connection_errors(OSError) as exc:
        raise plain.unreachable(line.url, exc) from None
    return alive[0] if len(alive) == 1 else None


def _made_and_run(line: plain.Line, args: argparse.Namespace, host: str,
                  create: dict[str, Any]) -> int | None:
    """Make the workspace on `host`, run the call in it, end it; None when the host
    refused to make it (nothing made)."""
    from bashfleet.client.cli.run import run_call  # noqa: PLC0415 - its caller's

    interrupts = Interrupts()
    with interrupts.installed():  # a workspace made is always ended: its answer is awaited
        reply = line.control(Task.WORKSPACE_CREATE, create, host)
    ws_id = made_id(reply, host) if reply is not None else None
    stopped = interrupted_status(interrupts)
    if ws_id is None:
        return stopped
    if stopped is not None:
        _end(line, host, ws_id, check_jobs=False)
        return stopped
    args.workspace, args.image = ws_id, None
    try:
        return run_call(args, line, host)
    finally:
        result = line.result
        _end(line, host, ws_id, check_jobs=result is None or result.get("job") is not None)


def _end(line: plain.Line, host: str, ws_id: str, *, check_jobs: bool) -> None:
    """Delete the workspace, unless a job of the call still runs in it (said on stderr);
    Ctrl-C and SIGTERM are held off meanwhile. `check_jobs`: whether a job may run there
    (the call went on as one, or its result was not read here): the workspace is the
    call's alone, made for it, so a call that ended in the foreground left none.

    The deletion is put on the host's control queue and not waited for: what `run`
    prints and exits with is the call's, and the host acts on the request whether or
    not anyone waits (it may, for as long as the workspace would live: a lane busy
    with another request of the owner's delays it, never drops it)."""
    from bashfleet.client.cli.run import RUN_IMAGE_TTL_S, stays_notice  # noqa: PLC0415

    owner = line.identity.owner
    with Interrupts().installed():
        if check_jobs:
            jobs = _answered(line.control(Task.JOBS, jobs_data(ws_id, owner=owner), host), host)
            if any(job.get("running") for job in jobs.get("jobs", ())):
                print(stays_notice(ws_id), file=sys.stderr)
                return
        try:
            sent = line.push_control(Task.WORKSPACE_DELETE, delete_data(ws_id, owner=owner),
                                     host, timeout=RUN_IMAGE_TTL_S)
        except connection_errors(OSError) as exc:
            raise plain.unreachable(line.url, exc) from None
        if sent is None:
            raise HostUnavailable(f"no live worker for host {host!r}: workspace {ws_id} "
                                  "is ended once its host reaps it", host=host)


def _answered(reply: dict[str, Any] | None, host: str) -> dict[str, Any]:
    """A control reply's `ok` data; its error raised as the fleet client raises it."""
    if reply is None:
        raise HostUnavailable(f"no live worker for host {host!r}", host=host)
    error = reply.get("error")
    if error is not None:
        raise error_for(str(error.get("kind")), str(error.get("message")), error.get("file"))
    ok: dict[str, Any] = reply.get("ok") or {}
    return ok
