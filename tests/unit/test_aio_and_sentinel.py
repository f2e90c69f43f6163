"""Pure parts of the clients and of Sentinel support: the watch's verdicts (table tests),
the task message, `sentinel://` URLs (and that no password ever shows)."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bashfleet.client._core.constants import (
    FAILOVER_GRACE_S,
    LOCK_GONE_GRACE_S,
    MESSAGE_LOST_GRACE_S,
    MESSAGE_TAKEN_BY_LIVE_HOST_GRACE_S,
)
from bashfleet.client._core.identity import outage_grace_s
from bashfleet.client._core.routing import Route
from bashfleet.client._core.watch import KEEP_WAITING, Pending, message_task_id, verdict
from bashfleet.client.aio import AsyncFleet
from bashfleet.client.errors import FleetUnavailable, WorkerLost
from bashfleet.worker.fleet.celery_apps import wire_config
from bashfleet.worker.fleet.connect import (
    POOL_MAX_CONNECTIONS,
    async_redis_client,
    redis_client,
    safe_url,
    sentinel_target,
)
from bashfleet.worker.fleet.transport import SENTINEL_TRANSPORT, TRANSPORT
from bashfleet.worker.wire.messages import task_message
from bashfleet.worker.wire.models import CallResult

NOW = 1000.0


def _pending(target: str | None = "h1", label: str | None = None, **fields: Any) -> Pending:
    return Pending("c1", Route("q", target, label), **fields)


def _kind(found: Any) -> str:
    if found.problem is None:
        return "wait"
    if isinstance(found.problem, CallResult):
        return "result"
    assert isinstance(found.problem, WorkerLost)
    return "withdraw-lost" if found.withdraw else "lost"


@pytest.mark.parametrize(
    ("record", "tokens", "pending", "live", "expected"),
    [
        # running on a live instance: wait
        ({"state": "running", "host": "h1", "instance": "t1"}, {"h1": "t1"}, {}, None, "wait"),
        # another instance holds the host now: its worker died
        ({"state": "running", "host": "h1", "instance": "t1"}, {"h1": "t2"}, {}, None, "lost"),
        # the lock is gone, but not for long yet (a late heartbeat, a failover): wait
        ({"state": "running", "host": "h1", "instance": "t1"}, {"h1": None},
         {"lock_gone_since": NOW - 0.5}, None, "wait"),
        ({"state": "running", "host": "h1", "instance": "t1"}, {"h1": None},
         {"lock_gone_since": NOW - LOCK_GONE_GRACE_S}, None, "lost"),
        # the host's lock was not read this pass: no verdict on it
        ({"state": "running", "host": "h2", "instance": "t1"}, {"h1": "t1"}, {}, None, "wait"),
        ({"state": "lost", "host": "h1", "note": "its consumer died"}, {}, {}, None, "lost"),
        ({"state": "cancelled"}, {}, {}, None, "result"),  # kind cancelled: a cancel
        ({"state": "abandoned"}, {}, {}, None, "result"),
        ({"state": "done"}, {"h1": "t1"}, {}, None, "wait"),  # its answer is on its way
        # queued for a live host: wait; for a dead one: withdraw
        ({"state": "queued"}, {"h1": "t1"}, {}, None, "wait"),
        ({"state": "queued"}, {"h1": None}, {}, None, "withdraw-lost"),
        ({}, {"h1": None}, {}, None, "withdraw-lost"),  # no record: lost with Redis' data
        # its message gone from the queue, unclaimed, past the grace: withdraw (a host
        # whose lock is held gets the longer one: its consumer claims late under load)
        ({"state": "queued"}, {"h1": None}, {"missing_since": NOW - MESSAGE_LOST_GRACE_S},
         None, "withdraw-lost"),
        ({"state": "queued"}, {}, {"missing_since": NOW - MESSAGE_LOST_GRACE_S},
         None, "withdraw-lost"),
        ({"state": "queued"}, {"h1": "t1"}, {"missing_since": NOW - MESSAGE_LOST_GRACE_S},
         None, "wait"),
        ({"state": "queued"}, {"h1": "t1"},
         {"missing_since": NOW - MESSAGE_TAKEN_BY_LIVE_HOST_GRACE_S}, None, "withdraw-lost"),
        ({"state": "queued"}, {}, {"target": None, "missing_since": NOW - MESSAGE_LOST_GRACE_S},
         ["h1"], "withdraw-lost"),
        ({"state": "queued"}, {"h1": "t1"}, {"missing_since": NOW - 1.0}, None, "wait"),
        # any host: wait while one lives
        ({"state": "queued"}, {}, {"target": None}, ["h1"], "wait"),
        ({"state": "queued"}, {}, {"target": None}, [], "withdraw-lost"),
        ({"state": "queued"}, {}, {"target": None}, None, "wait"),  # not read this pass
    ],
)
def test_watch_verdicts(
    record: dict[str, str], tokens: dict[str, str | None], pending: dict[str, Any],
    live: list[str] | None, expected: str,
) -> None:
    target = pending.pop("target", "h1")
    found = verdict(_pending(target, **pending), record, tokens, live, NOW)
    assert _kind(found) == expected
    if expected == "wait":
        assert found == KEEP_WAITING


def test_lost_messages_name_the_call_and_what_happened() -> None:
    found = verdict(_pending(), {"state": "queued"}, {"h1": None}, None, NOW)
    assert isinstance(found.problem, WorkerLost)
    assert "no live worker is left in host h1 to run call c1" in found.problem.message
    assert found.problem.call_id == "c1"


# --------------------------------------------------------------------------- messages


def test_task_message_shape() -> None:
    now = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    message = json.loads(task_message(
        "bashfleet.check", [{"id": "j1"}], task_id="t1", queue="bashfleet.h.ctl",
        reply_to="bashfleet:replies:x", argsrepr="'j1'", expires_s=30.0, now=now,
        sender="gen1@box",
    ))
    assert json.loads(base64.b64decode(message["body"])) == [
        [{"id": "j1"}], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None},
    ]
    headers, properties = message["headers"], message["properties"]
    assert (headers["task"], headers["id"], headers["root_id"]) == ("bashfleet.check", "t1", "t1")
    assert headers["expires"] == "2030-01-02T03:04:35+00:00"
    assert headers["origin"] == "gen1@box"
    assert properties["expiration"] == "30000"
    assert properties["reply_to"] == "bashfleet:replies:x"
    assert properties["delivery_info"] == {"exchange": "", "routing_key": "bashfleet.h.ctl"}


@given(st.text(min_size=1, max_size=200))
def test_task_message_carries_any_command(command: str) -> None:
    message = json.loads(task_message(
        "bashfleet.exec", [{"command": command}], task_id="c", queue="q", reply_to="r",
        argsrepr="x",
    ))
    assert json.loads(base64.b64decode(message["body"]))[0][0]["command"] == command
    # What the lost-message scan looks for, found only where the id is.
    assert json.dumps(message).count('"id": "c"') == 1
    assert message_task_id(json.dumps(message)) == "c"


# --------------------------------------------------------------------------- sentinel


def test_sentinel_urls_parse() -> None:
    url = "sentinel://u:p%40ss@10.0.0.1:26379,[::1]:26380,h3/2?master=m&sentinel_password=sp"
    target = sentinel_target(url)
    assert target is not None
    assert target.sentinels == (("10.0.0.1", 26379), ("::1", 26380), ("h3", 26379))
    assert (target.master, target.username, target.password, target.db) == ("m", "u", "p@ss", 2)
    assert target.sentinel_password == "sp"
    assert target.kombu_url() == (
        "sentinel://u:p%40ss@10.0.0.1:26379/2;sentinel://u:p%40ss@[::1]:26380/2;"
        "sentinel://u:p%40ss@h3:26379/2"
    )
    assert target.transport_options() == {
        "master_name": "m", "sentinel_kwargs": {"password": "sp"},
    }
    assert safe_url(url) == (
        "sentinel://u:**@10.0.0.1:26379,[::1]:26380,h3:26379/2?master=m&sentinel_password=**"
    )


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("sentinel://h:1/0", "master"),
        ("sentinel://h:x/0?master=m", "port"),
        ("sentinel://:pw@/0?master=m", "at least one sentinel"),
        ("sentinel://h:1/x?master=m", "database"),
    ],
)
def test_bad_sentinel_urls_say_what_is_wrong(url: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem) as info:
        sentinel_target(url)
    assert "pw" not in str(info.value)


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~!*",
               min_size=1, max_size=30))
def test_safe_url_masks_every_password(password: str) -> None:
    assert safe_url(f"sentinel://:{password}@h1:1,h2:2/0?master=m") == (
        "sentinel://:**@h1:1,h2:2/0?master=m"
    )
    assert safe_url(f"sentinel://h1:1/0?master=m&sentinel_password={password}") == (
        "sentinel://h1:1/0?master=m&sentinel_password=**"
    )
    assert safe_url(f"redis://:{password}@h1:6379/0") == "redis://:**@h1:6379/0"


def test_wire_config_picks_the_transport() -> None:
    plain = wire_config("redis://h:6379/0")
    assert (plain["broker_url"], plain["broker_transport"]) == ("redis://h:6379/0", TRANSPORT)
    sentinel = wire_config("sentinel://:pw@h1:1,h2:2/0?master=m")
    assert sentinel["broker_transport"] == SENTINEL_TRANSPORT
    assert sentinel["broker_url"] == "sentinel://:pw@h1:1/0;sentinel://:pw@h2:2/0"


def test_waiting_callers_ride_out_only_a_failover() -> None:
    assert outage_grace_s("redis://h:6379/0") == 0.0
    assert outage_grace_s("sentinel://h1:1/0?master=m") == FAILOVER_GRACE_S


def test_an_async_fleet_belongs_to_one_event_loop() -> None:
    fleet = AsyncFleet("redis://127.0.0.1:1/0")  # nothing listens: nothing is reached
    with pytest.raises(FleetUnavailable):
        asyncio.run(fleet.hosts())
    with pytest.raises(RuntimeError, match="another event loop"):
        asyncio.run(fleet.hosts())


def test_in_flight_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        AsyncFleet("redis://127.0.0.1:1/0", max_in_flight=0)


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:1/0",
    "unix:///nonexistent/redis.sock",
    "sentinel://127.0.0.1:1?master=primary",
])
def test_every_client_pool_takes_more_connections_than_a_worker_has_slots(url: str) -> None:
    """redis-py 8 caps a pool at 100 connections unless told: a 256-slot worker's claims,
    or an AsyncFleet's thousand calls, failed past it ("Too many connections")."""
    pools = [redis_client(url).connection_pool,
             redis_client(url, binary=True).connection_pool,
             async_redis_client(url).connection_pool]
    assert [getattr(pool, "max_connections", None) for pool in pools] == \
        [POOL_MAX_CONNECTIONS] * 3
    assert POOL_MAX_CONNECTIONS >= 1_000


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0", "unix:///nonexistent.sock",
                                 "sentinel://127.0.0.1:1/0?master=m"])
def test_no_client_sends_a_command_again_by_itself(url: str, binary: bool) -> None:
    """redis-py's own constructor retries a command whose answer was lost (10 times in
    redis-py 8): a SEND or CLAIM script sent twice could queue or claim a call twice. The
    fleet's clients, sync and asyncio, of each URL form, send nothing again."""
    import redis  # noqa: PLC0415

    from bashfleet.worker.fleet import connect  # noqa: PLC0415

    # What the property guards against: the library's plain client does retry.
    plain: Any = redis.Redis().connection_pool.make_connection()
    assert plain.retry.get_retries() > 0
    for client in (connect._redis_py_client(url, binary=binary),
                   connect.async_redis_client(url, binary=binary)):
        connection: Any = client.connection_pool.make_connection()
        assert connection.retry.get_retries() == 0, (url, type(client))
