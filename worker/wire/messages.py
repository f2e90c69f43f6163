"""A Celery task message as kombu's Redis transport puts it on a queue list: built here,
without Celery or kombu, so a client can send with one LPUSH (or inside a Lua script
that records the call in the same round trip) and no thread per call.

What Celery 5 (task protocol 2) and kombu's Redis transport push for
`send_task(name, args=..., queue=Q, task_id=..., reply_to=..., ignore_result=True,
argsrepr=..., kwargsrepr="{}", expires=...)` with the JSON serializer, captured from
them and pinned by `tests/integration/test_async_fleet.py` (the two built side by side)
and by a real worker running what this builds. bashfleet's queues have one priority
step (`priority_steps` [0] on both sides), so the list is the queue's own name, and the
default exchange ("") routes by the queue's name: no binding is read.
"""

from __future__ import annotations

import base64
import json
import math
import os
import socket
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datetime import datetime

#: The embed part of a protocol 2 body: no callbacks, chain or chord.
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def origin() -> str:
    """What Celery names a sender in its messages: `gen<pid>@<hostname>`."""
    return f"gen{os.getpid()}@{socket.gethostname()}"


def random_uuid() -> str:
    """A random (version 4) UUID as text, as `str(uuid.uuid4())` gives it: a message's
    delivery tag (the `uuid` module is not loaded for it: it loads `platform` too)."""
    data = bytearray(os.urandom(16))
    data[6] = data[6] & 0x0F | 0x40  # version 4
    data[8] = data[8] & 0x3F | 0x80  # the RFC 4122 variant
    text = data.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def iso_utc(timestamp: float) -> str:
    """`datetime.fromtimestamp(timestamp, UTC).isoformat()`: what Celery writes as a
    message's expiry, without loading `datetime` (2 ms of a CLI's control request)."""
    fraction, seconds = math.modf(timestamp)
    micro = round(fraction * 1e6)  # as datetime rounds it: half to even, of the fraction
    if micro >= 1_000_000:
        seconds, micro = seconds + 1, micro - 1_000_000
    elif micro < 0:
        seconds, micro = seconds - 1, micro + 1_000_000
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{text}.{micro:06d}+00:00" if micro else f"{text}+00:00"


def task_message(
    task: str, args: list[Any], *, task_id: str, queue: str, reply_to: str, argsrepr: str,
    expires_s: float | None = None, now: datetime | None = None, sender: str | None = None,
) -> str:
    """The JSON text kombu pushes on list `queue` for this task (see the module doc).

    `expires_s`: the worker drops the message unrun after this many seconds (control
    calls); `now` and `sender` are for tests (default: the clock, `origin()`).
    """
    body = json.dumps([args, {}, _EMBED])
    expires = None
    if expires_s is not None:
        start = now.timestamp() if now is not None else time.time()
        expires = iso_utc(start + expires_s)
    headers: dict[str, Any] = {
        "lang": "py", "task": task, "id": task_id, "shadow": None, "eta": None,
        "expires": expires, "group": None, "group_index": None, "retries": 0,
        "timelimit": [None, None], "root_id": task_id, "parent_id": None,
        "argsrepr": argsrepr, "kwargsrepr": "{}", "origin": sender or origin(),
        "ignore_result": True, "replaced_task_nesting": 0, "stamped_headers": None,
        "stamps": {},
    }
    properties: dict[str, Any] = {
        "correlation_id": task_id, "reply_to": reply_to, "argsrepr": argsrepr,
        "kwargsrepr": "{}", "delivery_mode": 2,
    }
    if expires_s is not None:
        properties["expiration"] = str(int(expires_s * 1000))
    properties.update({
        "delivery_info": {"exchange": "", "routing_key": queue}, "priority": 0,
        "body_encoding": "base64", "delivery_tag": random_uuid(),
    })
    return json.dumps({
        "body": base64.b64encode(body.encode("utf-8")).decode("ascii"),
        "content-encoding": "utf-8", "content-type": "application/json",
        "headers": headers, "properties": properties,
    })
