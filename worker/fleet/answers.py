"""Where a task's answer goes, sealed with which key, and its delivery.

Every task answers exactly once, whatever happens (`bashfleet.worker.fleet.tasks`): its
`Answer` says where (the task id, its message's `reply_to` channel), how it is sealed
(`bashfleet.worker.fleet.verify` sets the key that signed the message, and locks the
answer with it once the message verified), and whether it went already.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime

import redis
from celery import current_task

from bashfleet.worker.fleet import registry
from bashfleet.worker.fleet.control import Runtime
from bashfleet.worker.wire import auth
from bashfleet.worker.wire.models import Call

log = logging.getLogger("bashfleet.worker")

#: Pauses between attempts to deliver an answer while Redis is away (~30 s in all).
REPLY_RETRY_DELAYS_S = (0.1, 0.2, 0.5, 1.0, 2.0, 2.0, 4.0, 4.0, 8.0, 8.0)


@dataclass
class Answer:
    """Where the running task's answer goes, with which key it is sealed, and whether
    it went already."""

    task_id: str
    channel: str | None
    key: str | None = None
    sent: bool = False
    locked: bool = False
    """True once the message verified: the answer is then locked (encrypted) with the key
    that signed it; a refusal before that is only sealed (it holds nothing secret, and
    an unsigned client or one with another key can still read why)."""
    call: Call | None = None
    """The call, once its message was read (what Flower's view of it needs)."""
    expires_at: float | None = None
    """When the caller stops waiting for it (its message's expiry; `time.time()`)."""

    def reply(self, payload: str) -> registry.Reply:
        """The answer to deliver, locked with the key that signed the message: a client
        trusts no answer it cannot verify, and no other owner can read it."""
        if self.locked:
            sealed = auth.lock([self.key] if self.key else [], auth.REPLY, self.task_id,
                               payload)
        else:
            sealed = auth.seal(self.key, auth.REPLY, self.task_id, payload)
        return registry.Reply(self.task_id, self.channel, sealed)


def current_answer(rt: Runtime) -> Answer:
    """The answer of the task Celery runs now (its id, its message's `reply_to`),
    sealed with this worker's current key until the message names the key it used."""
    request = getattr(current_task, "request", None)
    return Answer(
        task_id=str(getattr(request, "id", None) or "?"),
        channel=getattr(request, "reply_to", None) or None,
        key=next(iter(rt.keys.values()), None),
        expires_at=_expiry(getattr(request, "expires", None)),
    )


def _expiry(expires: object) -> float | None:
    """A message's `expires` header (ISO 8601 text, or a datetime) as a timestamp."""
    if isinstance(expires, str):
        try:
            expires = datetime.fromisoformat(expires)
        except ValueError:
            return None
    return expires.timestamp() if isinstance(expires, datetime) else None


def deliver(rt: Runtime, answer: Answer, payload: str) -> None:
    """Deliver an answer not sent yet, retrying while Redis is away (as Celery's result
    backend did): a caller waits for it."""
    for delay in (*REPLY_RETRY_DELAYS_S, None):
        try:
            registry.deliver_reply(rt.redis, answer.reply(payload))
            answer.sent = True
            return
        except redis.RedisError as exc:
            if delay is None:
                log.error("could not deliver the answer of task %s: %s", answer.task_id, exc,
                          extra={"call_id": answer.task_id})
                return
            time.sleep(delay)
