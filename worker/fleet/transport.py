"""kombu's Redis transport, with one Redis client per channel instead of one per command.

kombu builds a new `redis.Redis` object for every publish, LPUSH and event it sends
(`Channel.conn_or_acquire`), on top of a connection pool it keeps anyway. Building one
costs ~50 µs of CPU; a call made three of them on the worker (its task events) and
one on the client. A Redis client is thread-safe (each command takes a connection
from the pool), so a channel keeps one for as long as its pool lives.

Both sides use it through `broker_transport` (`celery_apps.wire_config`).

A consumer also learns here which queue a message really came from: kombu hands a task
the `routing_key` its sender wrote in the message, which anyone who pushes a message
onto another queue writes too. `TrueQueue` overwrites it with the list the message was
popped from, so a signed message's target is checked against the truth
(`bashfleet.worker.fleet.verify`).
"""

from __future__ import annotations

import threading
from typing import Any

from kombu.transport import redis as kombu_redis

#: What `broker_transport` names to use this transport.
TRANSPORT = "bashfleet.worker.fleet.transport:Transport"


#: The same for a Redis behind Sentinel (`sentinel://`).
SENTINEL_TRANSPORT = "bashfleet.worker.fleet.transport:SentinelTransport"


class SharedClient:
    """Mixin of a kombu Redis channel: one synchronous client per connection pool."""

    pool: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._client_lock = threading.Lock()
        self._shared_client: Any = None
        super().__init__(*args, **kwargs)

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[misc]
        with self._client_lock:
            client = self._shared_client
            # A new pool (kombu replaces it after a connection error, and a Sentinel
            # channel after a failover) gets a new client.
            if client is None or client.connection_pool is not self.pool:
                client = self._shared_client = super()._create_client()  # type: ignore[misc]
            return client


class TrueQueue:
    """Mixin of a kombu channel: a consumed message's `routing_key` is the queue it was
    taken from (the default exchange routes by queue name, so for an honest sender the
    two are the same), never what its sender wrote."""

    def basic_consume(
        self, queue: str, no_ack: bool, callback: Any, consumer_tag: str, **kwargs: Any
    ) -> Any:
        def from_queue(message: Any) -> Any:
            message.delivery_info = {**(message.delivery_info or {}), "routing_key": queue}
            return callback(message)

        return super().basic_consume(  # type: ignore[misc]
            queue, no_ack, from_queue, consumer_tag, **kwargs
        )


class Channel(TrueQueue, SharedClient, kombu_redis.Channel):
    """A Redis channel that reuses its synchronous client."""


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with `Channel` above."""

    Channel = Channel


class SentinelChannel(TrueQueue, SharedClient, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel, reusing its synchronous client like `Channel`."""


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Sentinel transport with `SentinelChannel` above."""

    Channel = SentinelChannel
