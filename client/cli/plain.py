"""`bashfleet run`'s plain case: a command for a named workspace or host, its result
printed, with no model built and neither pydantic nor the fleet client loaded.

A plain call is one of `run --workspace W CMD` or `run --host H CMD` (and `run --image`,
which runs the call in a workspace of its own), in the foreground, with none of
`--session`, `--follow`, `--json`, `--tag`, `--network`, `--mode background` (`--tty`
and piped stdin go their own way before this). Its call is the JSON the fleet client
would send (`call_data`; a unit test holds the two equal for a table of arguments),
signed, sent and answered through the same functions (`bashfleet.client._core.sending`,
the SEND script of `bashfleet.worker.wire.lua`, `bashfleet.client.cli.results`): the worker
validates it with the models as it does every call.

What this path cannot do goes to the fleet client's before anything is sent (`run`
returns None): an argument it does not check itself, a workspace it cannot open, a
Redis it does not speak (TLS, Sentinel), a host that is down. A call that is not
answered within HANDOVER_S, or that Ctrl-C or SIGTERM interrupts, is handed over
(`Handover`) to the fleet client, which waits for it as for its own (its watch finds a
lost worker, Ctrl-C cancels or detaches it): nothing is ever sent twice.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import threading
import time
from typing import Any, NamedTuple

from bashfleet.client._core.constants import CTL_TIMEOUT_S, SUBSCRIBE_WAIT_S, WATCH_INTERVAL_S
from bashfleet.client._core.identity import Identity, resolve_identity, resolve_url
from bashfleet.client._core.sending import (
    call_message,
    control_reply,
    control_task_message,
    control_verdict,
    new_call_id,
    new_task_id,
    open_reply,
    reply_of,
    send_keys_args,
    view_data,
)
from bashfleet.client.errors import WorkerError
from bashfleet.client.foreground import Interrupts
from bashfleet.worker.fleet.connect import (
    Script,
    connection_errors,
    redis_client,
    redis_errors,
    safe_url,
    use_light_client,
)
from bashfleet.worker.wire import auth, lua, names

#: How long the plain path waits for its call's answer before the fleet client takes
#: over (the fleet client's first look for a lost call comes as late).
HANDOVER_S = WATCH_INTERVAL_S
#: How often the wait looks at Ctrl-C and SIGTERM.
TICK_S = 0.05

#: The wire's limits a plain call is held to (`bashfleet.worker.wire.models`: a unit
#: test holds these equal to the models'); past one, the fleet client says why.
MAX_COMMAND_BYTES = 1024 * 1024
MAX_PATH_CHARS = 4096
MAX_TIMEOUT_S = 24 * 60 * 60.0
SLOW_TIMEOUT_S = 15 * 60.0

#: The CLI's policy (`Policy(name="cli", on_timeout=...)`) as JSON, but for `on_timeout`.
CLI_POLICY: dict[str, Any] = {
    "name": "cli", "streams": "separate",
    "truncation": {"kind": "tail_lines", "max_lines": 2000, "max_bytes": 50 * 1024},
    "digest_errors": False, "default_timeout_s": 120.0, "max_timeout_s": MAX_TIMEOUT_S,
    "background_timeout_s": None, "on_timeout": "kill", "kill_grace_s": 2.0,
    "spill_min_bytes": 0, "lift_head_tail": False, "intercept": [], "available_tools": [],
    "detect_binary": False, "reveal_invisible": False, "last_frame": False,
    "max_line_chars": None,
}

SEND = Script(lua.SEND)


class Handover(NamedTuple):
    """A call the plain path sent and did not see answered: what the fleet client needs
    to wait for it (`Fleet.wait_sent`), and the Ctrl-Cs and SIGTERM pressed meanwhile."""

    call_id: str
    queue: str
    host: str | None
    interrupts: Interrupts
    channel: str | None = None
    """The reply channel the call names (the fleet client listens on it)."""


def is_plain(args: argparse.Namespace) -> bool:
    """Whether `run`'s arguments ask for a plain call (the module says which)."""
    return bool(
        (args.workspace or args.host) and not args.json and not args.follow
        and args.mode in ("default", "slow") and args.session is None and not args.tag
        and args.network is None and not args.image and not args.build
    )


def clean(text: str | None) -> bool:
    """True for text a call can carry as is: no NUL byte, no lone surrogate."""
    if text is None:
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def call_data(args: argparse.Namespace, *, call_id: str, owner: str) -> dict[str, Any] | None:
    """The call `run`'s arguments send, as JSON data: what `build_call(...).model_dump(
    mode="json")` gives for them. None when the arguments ask for what this function
    does not check (the fleet client then checks it, and says what is wrong)."""
    command = " ".join(args.command)
    timeout = args.timeout
    if args.mode == "slow" and timeout is None:
        timeout = SLOW_TIMEOUT_S
    if not (
        is_plain(args) and clean(command) and command.strip() and clean(args.cwd)
        and len(command.encode()) <= MAX_COMMAND_BYTES
        and (args.cwd is None or len(args.cwd) <= MAX_PATH_CHARS)
        and (timeout is None or 0 < timeout <= MAX_TIMEOUT_S)
        and (args.workspace is None or re.fullmatch(names.WORKSPACE_ID_PATTERN, args.workspace))
        and re.fullmatch(names.OWNER_PATTERN, owner)
        and args.isolation in (None, "none", "process", "strict")
    ):
        return None
    policy = CLI_POLICY | {"on_timeout": "background" if args.background_on_timeout else "kill"}
    return {
        "command": command, "cwd": args.cwd or None, "env": {}, "unset_env": [],
        "capture_state": False, "head": None, "tail": None, "isolation": args.isolation,
        "network": None, "session": None, "tags": {}, "stdin": "null", "term_size": None,
        "shell": None, "login": False, "workspace": args.workspace, "call_id": call_id,
        "timeout_s": timeout, "background": False, "policy": policy, "owner": owner,
        "input_wait_s": 2.0,
    }


def result_data(text: str, call_id: str) -> dict[str, Any]:
    """A call's answer (opened) as JSON data; WorkerError when it is not a result, as
    the fleet client says of one its models cannot read."""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not (isinstance(data, dict) and isinstance(data.get("call_id"), str)
            and isinstance(data.get("host"), str)):
        raise WorkerError(f"call {call_id}: unreadable answer {text[:200]!r}")
    return data


# ------------------------------------------------------------------------------ run


def run(args: argparse.Namespace, line: Line | None = None, host: str | None = None
        ) -> int | Handover | None:
    """Run a plain call: its exit status once its result is printed; a Handover when it
    was sent and is still to be waited for; None when it is not plain (nothing sent).
    `line`: connections open already (their owner closes them), `host`: the workspace's
    host when it is known (`bashfleet.client.cli.plain_image` made the workspace)."""
    if line is None:
        url, identity = _fleet_of(args)
        if url is None or identity is None:
            return None
    else:
        url, identity = line.url, line.identity
    call_id = new_call_id()
    call = call_data(args, call_id=call_id, owner=identity.owner)
    if call is None:
        return None
    owned = line is None
    if line is None:
        use_light_client()
        line = Line(url, identity, redis_client(url))
    try:
        sending = line.prepare(call, args, host)
        if sending is None:
            return None
        return line.send(sending, args)
    finally:
        if owned:
            line.close()


class _Sending(NamedTuple):
    """A call ready to go: its id, queue, host and reply channel, and the SEND script's
    keys and args."""

    call_id: str
    queue: str
    host: str
    channel: str
    keys: list[str]
    args: list[object]


class Line:
    """A plain run's connections: the client, and its reply channel's subscription (one
    channel for every request of the run, subscribed once); the last call's result."""

    def __init__(self, url: str, identity: Identity, client: Any) -> None:
        self.url = url
        self.identity = identity
        self.client = client
        self.pubsub = client.pubsub()
        self.channel: str | None = None
        self.result: dict[str, Any] | None = None
        """The result the last call sent through `send` printed (None until one did)."""
        self._aead = False

    def close(self) -> None:
        self.pubsub.close()
        self.client.close()

    def listen(self) -> str | None:
        """The reply channel, subscribed (the first time); None when Redis did not confirm
        the subscription within SUBSCRIBE_WAIT_S."""
        if self.channel is None:
            channel = names.reply_channel(new_call_id())
            if not _subscribed(self.pubsub, channel):
                return None
            self.channel = channel
        return self.channel

    def prepare(self, call: dict[str, Any], args: argparse.Namespace,
                host: str | None = None) -> _Sending | None:
        """The call's message, signed for its host's queue (`host`, else the one named or
        its workspace's), with the reply channel listened to; None when the fleet client
        must send it (nothing was sent)."""
        try:
            host = host or args.host or _workspace_host(self.client, self.identity,
                                                        args.workspace)
            if host is None:
                return None
            names.validate_host(host)
            channel = self.listen()
            if channel is None:
                return None
        except connection_errors(OSError) as exc:
            raise unreachable(self.url, exc) from None
        except redis_errors(ValueError):
            return None  # nothing sent: the fleet client tries, and says what is wrong
        queue = names.exec_queue(host)
        call_id = call["call_id"]
        message = call_message(self.identity, call, queue, channel)
        keys, script_args = send_keys_args(call_id, queue, host, message, require_alive=True,
                                           owner_tag=self.identity.call_tag(call_id),
                                           fresh_id=True)  # `run` made it: new_call_id
        return _Sending(call_id, queue, host, channel, keys, script_args)

    def control(self, task: str, request: dict[str, Any], host: str,
                timeout: float = CTL_TIMEOUT_S) -> dict[str, Any] | None:
        """Send a control request (`request`: its model's JSON data) to `host` and wait for
        its answer (at most `timeout`): the reply as data (`ok` or `error`); None when
        nothing was sent (the host is down, or the reply channel not confirmed).
        WorkerLost / WorkerError as `control_verdict` says. The caller holds Ctrl-C off
        meanwhile (`Interrupts`), so a request sent is always answered here."""
        try:
            sent = self.push_control(task, request, host, timeout)
            if sent is None:
                return None
            task_id, token = sent
            sealed = self._control_answer(task_id, host, token, timeout)
        except connection_errors(OSError) as exc:
            raise unreachable(self.url, exc) from None
        return control_reply(self.identity.reply_keys(), task_id, host, sealed)

    def load_aead(self) -> None:
        """Load what opens a locked answer (AES-GCM) on a thread of its own, once: it
        loads while the first request is out (`bashfleet.worker.wire.auth` loads it on
        first use, and finds it loaded)."""
        if not self._aead:
            self._aead = True
            threading.Thread(target=_load_aead, name="bashfleet-aead", daemon=True).start()

    def push_control(self, task: str, request: dict[str, Any], host: str,
                     timeout: float = CTL_TIMEOUT_S) -> tuple[str, str] | None:
        """Put a control request on `host`'s control queue, answered on the reply channel
        and acted on within `timeout`: (its task id, the host's lock token); None when
        nothing was sent (the host is down, or the reply channel not confirmed)."""
        token = self.client.get(names.alive_key(host))
        channel = self.listen()
        if token is None or channel is None:
            return None
        task_id = new_task_id()
        self.load_aead()
        self.client.lpush(names.ctl_queue(host), control_task_message(
            self.identity, task, request, task_id=task_id, host=host, reply_to=channel,
            timeout=timeout))
        return task_id, str(token)

    def _control_answer(self, task_id: str, host: str, token: str, timeout: float) -> str:
        """A control request's answer as sent: heard on the channel, or read back (stored
        by the worker) at each WATCH_INTERVAL_S, when its host is also looked at."""
        deadline = time.monotonic() + timeout
        while True:
            look = time.monotonic() + WATCH_INTERVAL_S
            while (left := look - time.monotonic()) > 0:
                message = self.pubsub.get_message(timeout=left)
                if message is None or message["type"] != "message":
                    continue
                heard = reply_of(message["data"])
                if heard is not None and heard[0] == task_id:
                    return heard[1]
            stored = self.client.get(names.reply_key(task_id))
            if stored is not None:
                return str(stored)
            problem = control_verdict(host, token, self.client.get(names.alive_key(host)),
                                      now=time.monotonic(), deadline=deadline, timeout=timeout)
            if problem is not None:
                raise problem

    def send(self, sending: _Sending, args: argparse.Namespace) -> int | Handover | None:
        """Send the call and print its answer: its exit status; a Handover when it is
        still to be waited for; None when it was not sent (the host is down)."""
        interrupts = Interrupts()
        handover = Handover(sending.call_id, sending.queue, sending.host, interrupts,
                            sending.channel)
        self.load_aead()
        with interrupts.installed():
            try:
                sent = SEND(self.client, sending.keys, sending.args)
            except redis_errors(OSError):
                return handover  # sent or not: the fleet client's watch finds out
            if sent != "ok":
                return None  # "down", "taken": nothing was sent
            try:
                answer = _answer(self.pubsub, sending.call_id, interrupts)
            except redis_errors(OSError):
                return handover
        if answer is None:
            return handover
        from bashfleet.client.cli.run import report_plainly  # noqa: PLC0415

        text = open_reply(self.identity.reply_keys(), sending.call_id, answer)
        self.result = result_data(text, sending.call_id)
        return report_plainly(self.result, args)


def _fleet_of(args: argparse.Namespace) -> tuple[str | None, Identity | None]:
    """The fleet's URL and this client's identity (`fleet_of`) for a plain call; (None,
    None) when the call is not plain."""
    if not is_plain(args):
        return None, None
    return fleet_of()


def fleet_of() -> tuple[str | None, Identity | None]:
    """The fleet's URL and this client's identity, as `Fleet(admin=True)` finds them; (None,
    None) when the fleet client must say what is wrong, or its Redis speaks what the light
    client does not (TLS, Sentinel)."""
    try:
        url = resolve_url()
        if not url or not url.startswith(("redis://", "unix://")):
            return None, None
        return url, resolve_identity(url, None, admin=True)
    except Exception:  # the fleet client says it, in its words
        return None, None


def _workspace_host(client: Any, identity: Identity, workspace: str) -> str | None:
    """The host of a workspace of this client's owner (any owner's for an admin), from
    its sealed view; None when it cannot be read or opened here."""
    sealed = client.get(names.workspace_key(workspace))
    view = view_data(identity.record_keys(), workspace, sealed)
    if view is None or not isinstance(view.get("host"), str):
        return None
    if view.get("owner") != identity.owner and not identity.admin:
        return None
    host: str = view["host"]
    return host


def _subscribed(pubsub: Any, channel: str) -> bool:
    """Subscribe to the reply channel, before the call is sent; False when Redis did not
    confirm it within SUBSCRIBE_WAIT_S."""
    pubsub.subscribe(channel)
    deadline = time.monotonic() + SUBSCRIBE_WAIT_S
    while (left := deadline - time.monotonic()) > 0:
        message = pubsub.get_message(timeout=left)
        if message is not None and message["type"] == "subscribe":
            return True
    return False


def _answer(pubsub: Any, call_id: str, interrupts: Interrupts) -> str | None:
    """The call's answer (as sealed) heard within HANDOVER_S; None past it, or once
    Ctrl-C or SIGTERM was pressed."""
    deadline = time.monotonic() + HANDOVER_S
    while not (interrupts.sigint or interrupts.sigterm):
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        message = pubsub.get_message(timeout=min(left, TICK_S))
        if message is None or message["type"] != "message":
            continue
        heard = reply_of(message["data"])
        if heard is not None and heard[0] == call_id:
            return heard[1]
    return None


def _load_aead() -> None:
    """Load what opens a locked answer (`bashfleet.worker.wire.auth` loads it on first
    use, and finds it loaded)."""
    with contextlib.suppress(ImportError):
        auth.aesgcm_class()


def unreachable(url: str, exc: BaseException) -> Exception:
    """The fleet client's error for a Redis that cannot be reached (loaded only then)."""
    from bashfleet.client._sync import base  # noqa: PLC0415

    return base.unreachable(safe_url(url), exc)
