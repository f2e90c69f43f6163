"""How long a call keeps anything in Redis: its record for as long as it waits and runs,
then minutes (days when it started a job); its reply as long; the Redis nonce only where
the host has no memory of its own. On fakeredis."""

from __future__ import annotations

from collections.abc import Iterator

import fakeredis
import pytest
import redis

from bashfleet.client import records
from bashfleet.client._core.routing import IdLookup, ask_every_host
from bashfleet.worker.fleet import registry
from bashfleet.worker.wire import auth, names
from bashfleet.worker.wire.names import CallState


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = fakeredis.FakeRedis(decode_responses=True)
    yield client
    client.flushall()


def _queued(r: redis.Redis, call_id: str) -> None:
    r.hset(names.call_key(call_id), mapping={"call_id": call_id, "state": "queued"})
    r.expire(names.call_key(call_id), names.CALL_TTL_S)


@pytest.mark.parametrize(("started_job", "ttl"), [
    (False, names.FINISHED_TTL_S),
    (True, names.JOB_TTL_S),
])
def test_a_finished_call_is_kept_minutes_unless_it_started_a_job(
    started_job: bool, ttl: int
) -> None:
    assert names.finished_call_ttl_s(started_job) == ttl


def test_a_finished_record_outlives_every_signed_message() -> None:
    # A message delivered again after its call ended meets the record and is refused.
    assert names.FINISHED_TTL_S > auth.DEFAULT_TTL_S + auth.CLOCK_SKEW_S
    assert names.REPLY_TTL_S <= names.FINISHED_TTL_S


def test_the_claim_keeps_the_senders_ttl_and_the_finish_shortens_it(r: redis.Redis) -> None:
    _queued(r, "c1")
    r.expire(names.call_key("c1"), 1000)  # as the sender set it (less: to see it kept)
    assert registry.claim_call(r, "c1", "alpha", "t1", 42) == "ok"
    assert 990 < r.ttl(names.call_key("c1")) <= 1000
    reply = registry.Reply("c1", names.reply_channel("tok"), "answer")
    previous, sent = registry.finish_and_reply(r, "alpha", "c1", {"exit_code": 0}, reply=reply)
    assert (previous, sent) == ("running", True)
    assert 0 < r.ttl(names.call_key("c1")) <= names.FINISHED_TTL_S
    # The reply is kept in the record, which expires with it: no key of its own.
    assert records.call_record(r, "c1")[names.CALL_REPLY_FIELD] == "answer"
    assert not r.exists(names.reply_key("c1"))


def test_a_record_redis_lost_is_written_again_with_a_ttl(r: redis.Redis) -> None:
    assert registry.claim_call(r, "c2", "alpha", "t1", 42) == "ok"
    assert names.CALL_TTL_S - 10 < r.ttl(names.call_key("c2")) <= names.CALL_TTL_S


def test_a_call_that_started_a_job_is_kept_as_long_as_the_job(r: redis.Redis) -> None:
    _queued(r, "c3")
    registry.claim_call(r, "c3", "alpha", "t1", 42)
    reply = registry.Reply("c3", names.reply_channel("tok"), "answer")
    registry.finish_and_reply(r, "alpha", "c3", {"exit_code": None, "job_id": "j3"},
                              reply=reply)
    assert names.FINISHED_TTL_S < r.ttl(names.call_key("c3")) <= names.JOB_TTL_S
    # Its reply is kept apart, minutes only: not as long as the record.
    assert names.CALL_REPLY_FIELD not in records.call_record(r, "c3")
    assert 0 < r.ttl(names.reply_key("c3")) <= names.REPLY_TTL_S
    assert records.stored_reply(r, "c3") == "answer"


@pytest.mark.parametrize(("state", "longest"), [
    (CallState.LOST, names.FINISHED_TTL_S),
    (CallState.CANCELLING, names.CALL_TTL_S),
    (CallState.STOPPING, names.CALL_TTL_S),
])
def test_a_marked_call_keeps_its_record_while_it_may_run(
    r: redis.Redis, state: CallState, longest: int
) -> None:
    _queued(r, "c4")
    registry.claim_call(r, "c4", "alpha", "t1", 42)
    assert registry.mark_call(r, "c4", state) == "running"
    assert longest - 10 < r.ttl(names.call_key("c4")) <= longest


def test_a_withdrawn_call_is_kept_minutes(r: redis.Redis) -> None:
    _queued(r, "c5")
    assert records.withdraw_call(r, "c5", CallState.CANCELLED) == "queued"
    assert 0 < r.ttl(names.call_key("c5")) <= names.FINISHED_TTL_S


def test_a_claim_without_a_nonce_writes_no_nonce_key(r: redis.Redis) -> None:
    # The consumers check nonces in the host's own memory (bashfleet.worker.fleet.nonces) and
    # pass none to the claim: one SET fewer per call.
    _queued(r, "c6")
    assert registry.claim_call(r, "c6", "alpha", "t1", 42) == "ok"
    assert not [key for key in r.scan_iter() if str(key).startswith(names.nonce_key(""))]


@pytest.mark.parametrize(("found", "ask"), [
    (IdLookup(), True),
    (IdLookup(job_host="h1"), False),
    (IdLookup(call={"host": "h2", "state": "done"}), False),
    (IdLookup(call={"host": "", "state": "queued"}), False),
])
def test_an_id_redis_forgot_is_asked_of_every_host(found: IdLookup, ask: bool) -> None:
    assert ask_every_host(found) is ask


def test_nothing_a_short_call_leaves_outlives_its_finished_ttl(r: redis.Redis) -> None:
    _queued(r, "c7")
    registry.claim_call(r, "c7", "alpha", "t1", 42)
    reply = registry.Reply("c7", names.reply_channel("tok"), "x" * 1000)
    registry.finish_and_reply(r, "alpha", "c7", {"exit_code": 0}, reply=reply)
    ttls = {str(key): r.ttl(key) for key in r.scan_iter()}
    assert ttls and all(0 < ttl <= names.FINISHED_TTL_S for ttl in ttls.values()), ttls
