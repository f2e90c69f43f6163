"""What sending a call and hearing its answer take, in the standard library alone: a
fresh call id, a call's task message (its arguments signed for the queue it goes on),
the keys and arguments of the scripts that send and withdraw it (`SEND`, `WITHDRAW` of
`bashfleet.worker.wire.lua`), a control request's task message (the request as JSON
data), an answer heard on a reply channel and opened (a control reply read as data),
what a control request not answered yet means, and a workspace's sealed view opened as
data.

Both the fleet client (through `bashfleet.client._core.messages` and `records`, over
the wire's models) and the CLI's plain `run` (`bashfleet.client.cli.plain` and
`plain_image`, over the JSON, with no model built) send through these, so the two cannot
say a call or a control request differently. No pydantic here: loading it costs more
than a plain call takes.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from bashfleet.client.errors import BashfleetError, Unauthorized, WorkerError, WorkerLost
from bashfleet.worker.wire import auth, names
from bashfleet.worker.wire.messages import task_message
from bashfleet.worker.wire.names import CallState, Task

if TYPE_CHECKING:
    from bashfleet.client._core.identity import Identity

#: The purpose a host seals a workspace's view under.
WORKSPACE = "workspace"


def new_call_id() -> str:
    """A fresh call id (24 characters, `c` and 23 random hex digits)."""
    return f"c{os.urandom(12).hex()[:23]}"


def new_task_id() -> str:
    """A fresh control request's task id (32 random hex digits, as `uuid4().hex` reads)."""
    return os.urandom(16).hex()


def argsrepr(call: Mapping[str, Any]) -> str:
    """What Flower shows as a call's arguments when it is sent (`call`: the call as JSON
    data): the command's size, the cwd asked for, the dialect, the session (the worker
    adds the cwd actually used and the job id once the call ends:
    `bashfleet.worker.fleet.flower`).

    Celery would otherwise repr the whole call (its policy, and its `env`, which may
    hold secrets) on every send. The command itself is redacted: it may carry a token
    inline (curl -H ...), and Flower shows these arguments to anyone with its password.
    """
    return repr({"command": f"<redacted: {len(call['command'])} chars>", "cwd": call["cwd"],
                 "background": call["background"], "dialect": call["policy"]["name"],
                 "session": call["session"]})


def call_message(identity: Identity, call: Mapping[str, Any], queue: str, reply_to: str) -> str:
    """The task message of a call (as JSON data: `Call.model_dump(mode="json")`), for its
    queue; answered on `reply_to`."""
    args = identity.signed(Task.EXEC, [dict(call)], queue)
    return task_message(Task.EXEC, args, task_id=call["call_id"], queue=queue,
                        reply_to=reply_to, argsrepr=argsrepr(call))


def control_task_message(
    identity: Identity, task: str, request: Mapping[str, Any], *, task_id: str, host: str,
    reply_to: str, timeout: float,
) -> str:
    """The task message of a control request to `host` (`request`: the request model's
    JSON data, its `owner` this client's); the worker drops it unrun once `timeout`
    passed (nobody waits for its answer then)."""
    queue = names.ctl_queue(host)
    args = identity.signed(task, [dict(request)], queue)
    subject = request.get("id") or request.get("call_id")
    return task_message(task, args, task_id=task_id, queue=queue, reply_to=reply_to,
                        argsrepr=repr(subject), expires_s=timeout)


# ------------------------------------------------------------------------- scripts


def hash_fields(values: Mapping[str, object]) -> list[object]:
    """Hash fields as the flat name, value list a script passes to HSET (None as "")."""
    return [item for key, value in values.items()
            for item in (key, "" if value is None else str(value))]


def send_keys_args(
    call_id: str, queue: str, host: str | None, message: str, *, require_alive: bool,
    owner_tag: str = "", fresh_id: bool = False,
) -> tuple[list[str], list[object]]:
    """The keys and arguments of `bashfleet.worker.wire.lua.SEND` (`owner_tag`: what
    shows the call is its owner's, `Identity.call_tag`; `fresh_id`: the id is
    `new_call_id`'s, never sent before, so SEND does not look it up)."""
    fields = {
        "call_id": call_id, "state": CallState.QUEUED, "queue": queue, "host": host,
        "sent_at": time.time(), "owner_tag": owner_tag,
    }
    keys = [names.call_key(call_id), queue]
    if require_alive:
        if host is None:
            raise ValueError("require_alive needs a host")
        keys.append(names.alive_key(host))
    return keys, [names.CALL_TTL_S, message, "" if fresh_id else "1", *hash_fields(fields)]


def withdraw_keys_args(call_id: str, state: CallState) -> tuple[list[str], list[object]]:
    """The keys and arguments of `bashfleet.worker.wire.lua.WITHDRAW`."""
    return [names.call_key(call_id)], [state, time.time(), names.FINISHED_TTL_S]


class HostsSeenAlive:
    """The hosts whose lock a send found held in the last `window_s` (monotonic
    seconds): the sends that follow do not look it up again (`HOST_SEEN_ALIVE_S` says
    what answers for a host that stopped meanwhile)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._seen: dict[str, float] = {}

    def fresh(self, host: str, now: float) -> bool:
        """True when `host` was seen alive less than `window_s` before `now`."""
        seen = self._seen.get(host)
        return seen is not None and now - seen < self.window_s

    def saw(self, host: str, now: float) -> None:
        """A send that checked `host`'s lock (it began at `now`) found it held."""
        self._seen[host] = now

    def lost(self, host: str) -> None:
        """`host`'s lock was found gone: the next send looks it up."""
        self._seen.pop(host, None)


# ------------------------------------------------------------------------- answers


def reply_of(data: str | bytes) -> tuple[str, str] | None:
    """(task id, answer as sent) of a message heard on a reply channel; None when it is
    not one."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return names.parse_reply_message(text)


def open_reply(keys: Mapping[str, str], task_id: str, sealed: str) -> str:
    """A worker's answer to `task_id`, its seal checked with `keys`; Unauthorized when
    it does not verify (a Redis writer may have published it: a forged "all tests
    passed"; the caller gets an error, never the text)."""
    try:
        return auth.open_answer(keys, auth.REPLY, task_id, sealed)
    except auth.AuthError as exc:
        raise Unauthorized(
            f"the answer to {task_id} could not be verified ({exc.message}); it was not "
            "trusted: a worker with another key, or a forgery in Redis"
        ) from None


def control_reply(keys: Mapping[str, str], task_id: str, host: str, sealed: str
                  ) -> dict[str, Any]:
    """A control request's answer (`ControlReply` as JSON data: `ok` or `error`), its seal
    checked; WorkerError when it is not one."""
    text = open_reply(keys, task_id, sealed)
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not (isinstance(data, dict) and set(data) <= {"ok", "error"}
            and isinstance(data.get("ok") or {}, dict)
            and isinstance(data.get("error") or {}, dict)):
        raise WorkerError(f"the worker on {host} answered {text[:200]!r}")
    return data


def control_verdict(host: str, sent_token: str, token: str | None, *, now: float,
                    deadline: float, timeout: float) -> BashfleetError | None:
    """A control request not answered yet: WorkerLost when its host's instance changed or
    went away since it was sent, WorkerError past its deadline, else None (wait on)."""
    if token != sent_token:
        return WorkerLost(f"the worker on {host} went away before answering", host=host)
    if now > deadline:
        return WorkerError(f"the worker on {host} did not answer within {timeout:.0f}s")
    return None


def opened_view(keys: Mapping[str, str], ws_id: str, sealed: str | None) -> str | None:
    """A workspace's view as its host sealed it in Redis, opened (its JSON text); None
    when there is none or it does not verify (never believed)."""
    if sealed is None:
        return None
    try:
        return auth.unlock(keys, WORKSPACE, ws_id, sealed)
    except (auth.AuthError, ValueError):
        return None


def view_data(keys: Mapping[str, str], ws_id: str, sealed: str | None) -> dict[str, Any] | None:
    """`opened_view` read as JSON data (None as there, or when it is not an object)."""
    text = opened_view(keys, ws_id, sealed)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
