"""Whether a task's message may be acted on: its signature, expiry, target queue,
nonce and owner, checked before anything runs.

    verify(rt, task, args, answer) -> Message    or auth.AuthError
      signature and expiry          auth.verify, against the host's keys
      target                        signed for this very queue, one of this host's
      owner                         an owner key acts as its own owner only
      nonce                         single use: the host's own memory, else Redis
                                    (with the call's claim, or `use_nonce`)

A refusal's answer is sealed with the key that signed the message (if any); once the
message verified, the answer is locked with that key (`bashfleet.worker.fleet.answers`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from celery import current_task

from bashfleet.worker.fleet import registry
from bashfleet.worker.fleet.answers import Answer
from bashfleet.worker.fleet.control import Runtime
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire import auth, names, owner_keys
from bashfleet.worker.wire.names import Task

#: What a signed message seen before is told (it is not acted on).
REPLAYED = "replayed message refused (nonce seen before)"


@dataclass(frozen=True)
class Nonce:
    """A signed message's nonce, to record when the call is claimed."""

    value: str
    ttl_s: float


@dataclass(frozen=True)
class Message:
    """A task's arguments, verified, the nonce still to record in Redis (None: none),
    and whether the admin key signed it."""

    args: tuple[Any, ...]
    nonce: Nonce | None
    admin: bool = False
    owner: str | None = None
    """The owner whose key signed it (None: the fleet's or the admin key, which act as
    the owner the message names)."""
    fleet: bool = False
    """Whether a fleet key signed it (the operator's, as the admin key is)."""


def own_queues(settings: Settings, task: str) -> list[str]:
    """The queues a message for `task` may come from on this host: its command queues
    (its own, the any queue, its pools) for a call, its control queue otherwise."""
    if task == Task.EXEC:
        return names.exec_queues(settings.host, settings.labels)
    return [names.ctl_queue(settings.host)]


def verify(rt: Runtime, task: str, args: tuple[Any, ...], answer: Answer) -> Message:
    """Check a message's signature, expiry, target and nonce; auth.AuthError when it
    must be refused. The answer is then sealed with the key that signed the message.

    The target is the queue the message was signed for: it must be the queue this
    consumer took it from (as its transport saw it, `message_queue`), and one of this
    host's.
    The nonce is checked against the host's own memory, shared by its consumers and
    kept on its disk across restarts; only where a host keeps none is it left for Redis
    to record (with the claim, or `use_nonce`). With no key configured (a worker run
    --insecure-unsigned) a signed envelope is unwrapped unverified and plain arguments
    are taken as they are.
    """
    keys = rt.keys
    if not keys:
        answer.locked = True  # unsigned fleet: `lock` with no key writes it in clear
        if len(args) == 1 and auth.is_envelope(args[0]):
            return Message(tuple(args[0]["args"]), None)
        return Message(args, None)
    verified = auth.verify(args[0] if len(args) == 1 else None, task, keys, time.time())
    answer.key = keys[verified.key_id]
    auth.check_target(verified.target, message_queue(), own_queues(rt.settings, task))
    owner = check_owner(verified)
    answer.locked = True
    expires = verified.expires + auth.CLOCK_SKEW_S
    if rt.nonces is not None:
        if not rt.nonces.first_use(verified.nonce, expires):
            raise auth.AuthError("replayed", REPLAYED)
        # Checked by the host's own memory: nothing left for Redis to record. A message
        # delivered again (or replayed on another host's queue) meets its call's record,
        # kept longer than the message is valid.
        nonce = None
    else:
        nonce = Nonce(verified.nonce, expires - time.time())
    admin = verified.key_id == rt.admin_key_id
    return Message(tuple(verified.args), nonce, admin=admin, owner=owner,
                   fleet=owner is None and not admin)


def check_owner(verified: auth.Verified) -> str | None:
    """The owner whose key signed a message (None: the fleet's or the admin key); an
    AuthError (`wrong_owner`) when an owner key signed a message that names another
    owner: the key says who acts, whatever the message claims."""
    owner = owner_keys.key_owner(verified.key_id)
    if owner is None:
        return None
    body = verified.args[0] if len(verified.args) == 1 else None
    named = body.get("owner") if isinstance(body, dict) else None
    if not isinstance(named, str) or not owner_keys.covers(owner, named):
        raise auth.AuthError(
            "wrong_owner", f"message signed with {owner}'s key for owner {named!r} refused: "
            "an owner key acts as its own owner only")
    return owner


def use_nonce(rt: Runtime, nonce: Nonce | None) -> None:
    """Record a nonce the host's own memory left to Redis; AuthError when it was used."""
    if nonce is not None and not registry.use_nonce(rt.redis, nonce.value, nonce.ttl_s):
        raise auth.AuthError("replayed", REPLAYED)


def message_queue() -> str | None:
    """The queue the running task's message came from (None when not run by Celery)."""
    request = getattr(current_task, "request", None)
    delivery = getattr(request, "delivery_info", None) or {}
    queue = delivery.get("routing_key")
    return str(queue) if queue else None
