"""The client's reply listener (the blocking one, generated from
`client/_async/replies.py`), against fakeredis' pub/sub."""

from __future__ import annotations

import time
from collections.abc import Iterator

import fakeredis
import pytest
import redis

from bashfleet.client import records
from bashfleet.client._core.constants import SUBSCRIBE_WAIT_S
from bashfleet.client._sync.concurrency import Tasks
from bashfleet.client._sync.replies import Replies
from bashfleet.worker.fleet import registry
from bashfleet.worker.wire import names


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = fakeredis.FakeRedis(decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def replies(r: redis.Redis) -> Iterator[Replies]:
    tasks = Tasks()
    listener = Replies(r, tasks)
    yield listener
    listener.close()
    tasks.stop()


def test_an_answer_published_on_the_channel_reaches_its_waiter(
    r: redis.Redis, replies: Replies
) -> None:
    waiter = replies.expect("t1")
    assert replies.listening  # the first expect waits for the subscription
    registry.deliver_reply(r, registry.Reply("t1", replies.channel, '{"ok": 1}'))
    assert waiter.wait(5) == '{"ok": 1}'


def test_answers_go_to_their_own_waiters(r: redis.Redis, replies: Replies) -> None:
    first, second = replies.expect("a"), replies.expect("b")
    registry.deliver_reply(r, registry.Reply("b", replies.channel, "B"))
    registry.deliver_reply(r, registry.Reply("a", replies.channel, "A"))
    assert (first.wait(5), second.wait(5)) == ("A", "B")


def test_an_answer_for_nobody_waiting_is_dropped(r: redis.Redis, replies: Replies) -> None:
    waiter = replies.expect("mine")
    registry.deliver_reply(r, registry.Reply("other", replies.channel, "x"))
    registry.deliver_reply(r, registry.Reply("mine", replies.channel, "y"))
    assert waiter.wait(5) == "y"


def test_a_forgotten_waiter_hears_nothing(r: redis.Redis, replies: Replies) -> None:
    waiter = replies.expect("t2")
    replies.forget("t2")
    registry.deliver_reply(r, registry.Reply("t2", replies.channel, "late"))
    assert waiter.wait(0.3) is None


def test_an_answer_missed_while_not_listening_is_read_back(
    r: redis.Redis, replies: Replies
) -> None:
    # Published before anyone listened (as while the listener reconnects): stored.
    registry.deliver_reply(r, registry.Reply("t3", replies.channel, "kept"))
    waiter = replies.expect("t3")
    assert waiter.wait(0.2) is None
    assert records.stored_reply(r, "t3") == "kept"


def test_an_answer_delivered_twice_keeps_the_first(r: redis.Redis, replies: Replies) -> None:
    # The listener and the watch (reading the stored copy) may both deliver it.
    waiter = replies.expect("t5")
    replies.deliver("t5", "first")
    replies.deliver("t5", "second")
    assert waiter.wait(1) == "first"
    assert replies.answered("t5")


def test_each_client_has_its_own_valid_channel(r: redis.Redis) -> None:
    one, two = Replies(r, Tasks()), Replies(r, Tasks())
    assert one.channel != two.channel
    assert names.valid_reply_channel(one.channel)
    assert names.valid_reply_channel(two.channel)


def test_with_redis_down_the_first_call_is_not_held_up() -> None:
    # As the client connects (from a URL: no retries of its own).
    down = redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    tasks = Tasks()
    listener = Replies(down, tasks)
    try:
        started = time.monotonic()
        listener.expect("t4")  # returns once the first attempt failed
        assert time.monotonic() - started < SUBSCRIBE_WAIT_S
        assert not listener.listening
        with pytest.raises(redis.ConnectionError):
            records.stored_reply(down, "t4")
    finally:
        listener.close()
        tasks.stop()
