"""The fleet's state in Redis as a client reads and writes it, blocking: one function per
read or write (`call_record`, `host_info`, `stored_reply`, `send_call`, `withdraw_call`,
`list_jobs`...), each taking a `redis.Redis` with text replies.

Generated from the asyncio module (`client/_async/records.py`, by
`scripts/unasync.py`); `Fleet` uses it, and so do tests and tools that look at the
fleet's state.
"""

from __future__ import annotations

from bashfleet.client._sync.records import (
    call_record,
    events_after,
    host_alive_token,
    host_info,
    job_host,
    job_views,
    known_hosts,
    last_seq,
    list_hosts,
    list_jobs,
    live_hosts,
    lookup_id,
    push,
    queue_depths,
    queued_ids,
    send_call,
    server_instance,
    stored_reply,
    watch_snapshot,
    withdraw_call,
)

__all__ = [
    "call_record",
    "events_after",
    "host_alive_token",
    "host_info",
    "job_host",
    "job_views",
    "known_hosts",
    "last_seq",
    "list_hosts",
    "list_jobs",
    "live_hosts",
    "lookup_id",
    "push",
    "queue_depths",
    "queued_ids",
    "send_call",
    "server_instance",
    "stored_reply",
    "watch_snapshot",
    "withdraw_call",
]
