"""The client of a Redis primary behind Sentinel (`connect.redis_client` of a
`sentinel://` URL): its writes that decide what runs wait for a replica. A module of its
own so that `connect` loads redis-py only for the processes that use it.
"""

from __future__ import annotations

import time
from typing import Any

import redis

#: How long a primary's count of connected replicas is trusted.
REPLICAS_TTL_S = 2.0


class ReplicatedRedis(redis.Redis):
    """A client of a primary behind Sentinel, which has replicas: the writes that decide
    whether a command runs and what its caller is told (a call's claim and its end, an
    answer) wait for a replica's acknowledgement (`Script.run_durable`), so a failover
    to that replica keeps them. A claim lost in a failover would let the promoted replica
    hand the same message out again: the command would run twice."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._replicas = (0, float("-inf"))

    def connected_replicas(self) -> int:
        """Replicas the primary has now (cached REPLICAS_TTL_S; 0 when it cannot say)."""
        count, checked = self._replicas
        now = time.monotonic()
        if now - checked < REPLICAS_TTL_S:
            return count
        try:
            role = self.execute_command("ROLE")  # type: ignore[no-untyped-call]
            count = len(role[2]) if role and role[0] == "master" else 0
        except redis.RedisError:
            count = 0
        self._replicas = (count, now)
        return count
