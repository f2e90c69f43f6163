"""The registry's key logic on fakeredis: names, TTLs on every key, lock and call states."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any, cast

import fakeredis
import pytest
import redis

from bashfleet.client import records
from bashfleet.worker.fleet import celery_apps, registry
from bashfleet.worker.wire import auth, names
from bashfleet.worker.wire import records as wire_records
from bashfleet.worker.wire.models import JobRecord
from bashfleet.worker.wire.names import CallState

#: The worker's sealing keys, and the keyring a client verifies with.
KEYS = ("k" * 32,)
RING = auth.keyring(KEYS)


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = fakeredis.FakeRedis(decode_responses=True)
    yield client
    client.flushall()


def _record(job_id: str = "j1", host: str = "alpha") -> JobRecord:
    return JobRecord(
        id=job_id, host=host, pid=100, pgid=100, start_time=1.0, marker=job_id,
        command="sleep 1", cwd="/", output_path=f"/tmp/{job_id}.log",
        status_path=f"/tmp/{job_id}.status.json", started_at=time.time(), call_id="c1",
    )


def _assert_every_key_expires(r: redis.Redis) -> None:
    keys = cast("list[str]", r.keys("*"))
    assert keys
    for key in keys:
        assert key.startswith(names.PREFIX)
        assert r.ttl(key) > 0, f"{key} has no TTL"


def test_queue_and_key_names() -> None:
    assert names.exec_queue("b1") == "bashfleet.b1.exec"
    assert names.ctl_queue("b1") == "bashfleet.b1.ctl"
    assert names.pool_queue("gpu") == "bashfleet.pool.gpu.exec"
    assert names.exec_queues("b1", ["gpu"]) == [
        "bashfleet.b1.exec", "bashfleet.any.exec", "bashfleet.pool.gpu.exec",
    ]
    assert names.alive_key("b1") == "bashfleet:alive:b1"
    assert names.call_key("c1") == "bashfleet:call:c1"


@pytest.mark.parametrize("host", ["any", "pool", "pool.x", "", "a b", "-x", "x" * 65, "a/b"])
def test_host_ids_that_would_collide_or_break_keys_are_refused(host: str) -> None:
    with pytest.raises(ValueError, match="invalid host id"):
        names.validate_host(host)


def test_valid_host_ids() -> None:
    for host in ("build-1", "build-1.example.com", "b_2", "A"):
        assert names.validate_host(host) == host
    with pytest.raises(ValueError, match="invalid label"):
        names.validate_label("gpu.big")


def test_every_key_has_a_ttl(r: redis.Redis) -> None:
    registry.acquire_host(r, "alpha", "t1")
    record = {"concurrency": 2, "labels": "gpu"}
    assert registry.heartbeat(r, "alpha", "t1", record, KEYS) != "taken"
    _queued(r, "c1", names.exec_queue("alpha"), "alpha")
    assert registry.claim_call(r, "c1", "alpha", "t1", 42) == "ok"
    registry.update_call(r, "c1", pid=5, pgid=5, marker="c1")
    registry.save_job(r, _record(), keys=KEYS, running=True)
    registry.save_offsets(r, "j1", 10, 0, KEYS)
    r.set(names.shell_key("s1"), "{}", ex=names.SESSION_TTL_S)
    registry.set_host_fields(r, "alpha", {"exec_ready": 7})
    _assert_every_key_expires(r)
    assert r.ttl(names.alive_key("alpha")) <= names.ALIVE_TTL_S
    registry.finish_and_reply(r, "alpha", "c1", dict(exit_code=0))[0]
    _assert_every_key_expires(r)


def test_host_lock_is_exclusive(r: redis.Redis) -> None:
    assert registry.acquire_host(r, "alpha", "first") is None
    assert registry.acquire_host(r, "alpha", "second") == "first"
    # The holder's heartbeat renews; another instance's heartbeat is refused.
    assert registry.heartbeat(r, "alpha", "first", {}, KEYS) != "taken"
    assert registry.heartbeat(r, "alpha", "second", {}, KEYS) == "taken"
    assert r.get(names.alive_key("alpha")) == "first"
    # Only the holder releases it.
    registry.release_host(r, "alpha", "second")
    assert r.get(names.alive_key("alpha")) == "first"
    registry.release_host(r, "alpha", "first")
    assert r.get(names.alive_key("alpha")) is None
    assert registry.acquire_host(r, "alpha", "second") is None


def test_take_over_needs_the_dead_holders_token(r: redis.Redis) -> None:
    registry.acquire_host(r, "alpha", "dead")
    assert not registry.take_over_host(r, "alpha", "someone-else", "new")
    assert r.get(names.alive_key("alpha")) == "dead"
    assert registry.take_over_host(r, "alpha", "dead", "new")
    assert r.get(names.alive_key("alpha")) == "new"
    assert 0 < r.ttl(names.alive_key("alpha")) <= names.ALIVE_TTL_S


#: The keys whose TTLs are of hours, and those TTLs (renewed only by a renewing beat).
_LONG_TTLS = {
    names.host_key("alpha"): names.HOST_TTL_S, names.HOSTS_KEY: names.HOST_TTL_S,
    names.running_key("alpha"): names.RUNNING_TTL_S, names.jobs_key("alpha"): names.JOB_TTL_S,
}


@pytest.mark.parametrize(("renew", "record_kept", "renewed"), [
    (True, True, True),     # a renewing beat renews them all
    (False, True, False),   # a beat between renewals leaves them as they are
    (True, False, True),
    (False, False, True),   # a beat that writes the record again gives it its TTL at once
])
def test_heartbeat_renews_the_ttls_of_hours_only_when_asked_or_the_record_was_missing(
    r: redis.Redis, *, renew: bool, record_kept: bool, renewed: bool,
) -> None:
    registry.acquire_host(r, "alpha", "t1")
    assert registry.heartbeat(r, "alpha", "t1", {"instance": "t1"}, KEYS) == "missing"
    r.sadd(names.running_key("alpha"), "c1")
    r.zadd(names.jobs_key("alpha"), {"j1": 1.0})
    for key in _LONG_TTLS:
        r.expire(key, 100)
    if not record_kept:
        r.delete(names.host_key("alpha"))  # Redis lost it
    outcome = registry.heartbeat(r, "alpha", "t1", {"instance": "t1"}, KEYS, renew=renew)
    assert outcome == ("ok" if record_kept else "missing")
    assert r.ttl(names.alive_key("alpha")) == names.ALIVE_TTL_S  # every beat renews the lock
    assert r.hget(names.host_key("alpha"), "instance") == "t1"
    for key, ttl in _LONG_TTLS.items():
        if renewed:
            assert r.ttl(key) > ttl - 5, key
        else:
            assert 0 < r.ttl(key) <= 100, key


def test_heartbeat_retakes_an_expired_lock_nobody_took(r: redis.Redis) -> None:
    registry.acquire_host(r, "alpha", "t1")
    r.delete(names.alive_key("alpha"))  # as if it expired during a long pause
    assert registry.heartbeat(r, "alpha", "t1", {}, KEYS) != "taken"
    assert r.get(names.alive_key("alpha")) == "t1"


def test_host_listing(r: redis.Redis) -> None:
    registry.acquire_host(r, "alpha", "t1")
    ready = registry.readiness(KEYS, "alpha", "t1", {"exec": 1, "ctl": 2})
    registry.heartbeat(
        r, "alpha", "t1", {"instance": "t1", "concurrency": 3, "labels": "gpu,big", **ready}, KEYS
    )
    registry.acquire_host(r, "beta", "t2")
    registry.heartbeat(r, "beta", "t2", {"instance": "t2", "concurrency": 1}, KEYS)
    _queued(r, "c1", names.exec_queue("alpha"), "alpha")
    registry.claim_call(r, "c1", "alpha", "t1", 42)
    assert records.live_hosts(r) == ["alpha", "beta"]
    infos = {info.host: info for info in records.list_hosts(r, keys=RING)}
    assert infos["alpha"].alive and infos["alpha"].ready
    assert (infos["alpha"].slots, infos["alpha"].busy) == (3, 1)
    assert infos["alpha"].labels == ("gpu", "big")
    assert infos["beta"].alive and not infos["beta"].ready
    # A host whose heartbeat expired is listed, dead.
    r.delete(names.alive_key("beta"))
    infos = {info.host: info for info in records.list_hosts(r, keys=RING)}
    assert not infos["beta"].alive and infos["beta"].busy == 0
    assert records.live_hosts(r) == ["alpha"]


def test_the_busy_set_keeps_its_ttl_through_idle_spells_without_a_claim_setting_one(
    r: redis.Redis,
) -> None:
    registry.reset_running(r, "alpha")  # a starting worker: an empty set, held open
    key = names.running_key("alpha")
    for call_id in ("c1", "c2"):  # the second claim comes after the host went idle
        _queued(r, call_id, "q", "alpha")
        assert registry.claim_call(r, call_id, "alpha", "t1", 42) == "ok"
        assert 0 < r.ttl(key) <= names.RUNNING_TTL_S
        assert list(registry.busy_calls(r, "alpha")) == [call_id]  # never the sentinel
        registry.finish_and_reply(r, "alpha", call_id, {"exit_code": 0})
        assert 0 < r.ttl(key) <= names.RUNNING_TTL_S  # not deleted as it emptied
    assert registry.busy_calls(r, "alpha") == {}
    assert r.smembers(key) == {names.BUSY_SENTINEL}


def test_call_states_guard_at_most_once(r: redis.Redis) -> None:
    assert records.send_call(r, "c1", "q", "alpha", "{}", require_alive=False) == "ok"
    # Ids are never reused.
    assert records.send_call(r, "c1", "q", "alpha", "{}", require_alive=False) == "taken"
    assert registry.claim_call(r, "c1", "alpha", "t1", 42) == "ok"
    assert registry.claim_call(r, "c1", "alpha", "t1", 42) == "running"  # not twice
    assert records.withdraw_call(r, "c1") == "running"  # too late to withdraw
    assert records.call_record(r, "c1")["state"] == "running"
    assert r.sismember(names.running_key("alpha"), "c1")
    assert registry.finish_and_reply(r, "alpha", "c1", dict(exit_code=0))[0] == "running"
    record = records.call_record(r, "c1")
    assert record["state"] == "done" and record["exit_code"] == "0"
    assert not r.sismember(names.running_key("alpha"), "c1")


def test_a_withdrawn_call_is_never_claimed(r: redis.Redis) -> None:
    _queued(r, "c2", "q", None)
    assert records.withdraw_call(r, "c2", CallState.CANCELLED) == "queued"
    assert registry.claim_call(r, "c2", "alpha", "t1", 42) == "cancelled"
    # A call without a record (Redis lost it with its message in a failover) counts as
    # queued: withdrawn, so a message of it that turns up later is never run.
    assert records.withdraw_call(r, "nope") == "queued"
    assert registry.claim_call(r, "nope", "alpha", "t1", 42) == "abandoned"


def test_cancelled_and_stopped_calls_end_so(r: redis.Redis) -> None:
    for call_id, transient, final in (("c3", "cancelling", "cancelled"),
                                      ("c4", "stopping", "stopped")):
        _queued(r, call_id, "q", "alpha")
        registry.claim_call(r, call_id, "alpha", "t1", 42)
        marked = registry.mark_call(
            r, call_id, CallState(transient), only_from=(CallState.RUNNING,)
        )
        assert marked == "running"
        assert registry.finish_and_reply(r, "alpha", call_id, dict())[0] == transient
        assert records.call_record(r, call_id)["state"] == final
    # A transition from a state not allowed is refused.
    assert registry.mark_call(r, "c3", CallState.LOST) == "cancelled"
    assert records.call_record(r, "c3")["state"] == "cancelled"


def test_jobs_listing_and_views(r: redis.Redis) -> None:
    registry.acquire_host(r, "alpha", "t1")
    registry.save_job(r, _record("j1"), keys=KEYS, running=True)
    registry.save_job(r, _record("j2"), keys=KEYS, running=False, exit_code=3, ended_at=5.0)
    registry.save_offsets(r, "j1", 12, 4, KEYS)
    assert records.job_host(r, "j1") == "alpha"
    assert wire_records.job_offsets(RING, "j1", registry.job_fields(r, "j1")) == (12, 4)
    assert wire_records.job_offsets(RING, "j2", registry.job_fields(r, "j2")) == (0, 0)
    views = {view.id: view for view in records.list_jobs(r, "alpha", keys=RING)}
    assert views["j1"].state == "running" and views["j1"].running
    assert views["j2"].state == "ended" and views["j2"].exit_code == 3
    # While the host is down, a job last seen running is unknown.
    r.delete(names.alive_key("alpha"))
    assert {v.id: v for v in records.list_jobs(r, "alpha", keys=RING)}["j1"].state == "unknown"
    # A job whose hash expired leaves the listing.
    r.delete(names.job_key("j2"))
    assert [v.id for v in records.list_jobs(r, "alpha", keys=RING)] == ["j1"]
    assert r.zrange(names.jobs_key("alpha"), 0, -1) == ["j1"]


def test_wire_config_is_json_only_and_keeps_no_celery_results() -> None:
    config = celery_apps.wire_config("redis://127.0.0.1:1/0")
    assert config["accept_content"] == ["json"]
    assert config["task_serializer"] == "json"
    # Answers travel as replies: Celery stores nothing.
    assert config["result_backend"] is None
    assert config["task_ignore_result"] is True
    assert config["broker_transport"] == "bashfleet.worker.fleet.transport:Transport"


def _listener(r: redis.Redis, channel: str) -> Any:
    pubsub = r.pubsub()  # type: ignore[no-untyped-call]
    pubsub.subscribe(channel)
    assert pubsub.get_message(timeout=1)["type"] == "subscribe"
    return pubsub


def test_a_reply_is_stored_and_published_on_the_callers_channel(r: redis.Redis) -> None:
    channel = names.reply_channel("client1")
    pubsub = _listener(r, channel)
    registry.deliver_reply(r, registry.Reply("t1", channel, '{"ok": 1}'))
    message = pubsub.get_message(timeout=1)
    assert names.parse_reply_message(message["data"]) == ("t1", '{"ok": 1}')
    assert records.stored_reply(r, "t1") == '{"ok": 1}'
    assert 0 < r.ttl(names.reply_key("t1")) <= names.REPLY_TTL_S


def test_a_reply_to_a_foreign_channel_is_only_stored(r: redis.Redis) -> None:
    pubsub = _listener(r, "elsewhere")
    registry.deliver_reply(r, registry.Reply("t2", "elsewhere", "x"))
    # fakeredis delivers a publish at once, so an empty read now means none was sent (a
    # read that waits has hung once in a full run, inside fakeredis's selector).
    assert pubsub.get_message(timeout=0) is None
    r.publish("elsewhere", "control")
    assert pubsub.get_message(timeout=0)["data"] == "control"  # the listener does hear
    assert records.stored_reply(r, "t2") == "x"


@pytest.mark.parametrize(
    ("channel", "valid"),
    [("bashfleet:replies:abc123", True), ("bashfleet:replies:", False),
     ("bashfleet:reply:abc", False), ("celery@host.reply", False), (None, False),
     ("bashfleet:replies:a b", False)],
)
def test_only_reply_channels_of_ours_are_valid(channel: str | None, valid: bool) -> None:
    assert names.valid_reply_channel(channel) is valid


@pytest.mark.parametrize(
    "message", ["no newline", "\nno id", ""],
)
def test_malformed_reply_messages_are_ignored(message: str) -> None:
    assert names.parse_reply_message(message) is None


def test_finishing_delivers_the_reply_in_the_same_step(r: redis.Redis) -> None:
    channel = names.reply_channel("client2")
    pubsub = _listener(r, channel)
    _queued(r, "c8", "q", "alpha")
    registry.claim_call(r, "c8", "alpha", "t1", 42)
    reply = registry.Reply("c8", channel, '{"exit_code": 0}')
    assert registry.finish_and_reply(r, "alpha", "c8", {"exit_code": 0}, reply=reply) == (
        "running", True
    )
    assert records.call_record(r, "c8")["state"] == "done"
    assert names.parse_reply_message(pubsub.get_message(timeout=1)["data"]) == (
        "c8", '{"exit_code": 0}'
    )
    assert records.stored_reply(r, "c8") == '{"exit_code": 0}'  # for a missed publish


def test_a_reply_is_held_back_when_the_call_ended_from_a_held_state(r: redis.Redis) -> None:
    _queued(r, "c9", "q", "alpha")
    registry.claim_call(r, "c9", "alpha", "t1", 42)
    registry.mark_call(r, "c9", CallState.CANCELLING, only_from=(CallState.RUNNING,))
    reply = registry.Reply("c9", None, "{}")
    held = registry.finish_and_reply(
        r, "alpha", "c9", {}, reply=reply, hold_in=("cancelling", "stopping")
    )
    assert held == ("cancelling", False)
    assert records.stored_reply(r, "c9") is None  # the worker amends it, then delivers
    assert records.call_record(r, "c9")["state"] == "cancelled"
    registry.deliver_reply(r, registry.Reply("c9", None, '{"amended": 1}'))
    assert records.stored_reply(r, "c9") == '{"amended": 1}'  # kept apart, read all the same


def test_a_claim_records_the_nonce_and_refuses_a_replay(r: redis.Redis) -> None:
    _queued(r, "c10", "q", "alpha")
    assert registry.claim_call(r, "c10", "alpha", "t1", 42, nonce="n1", nonce_ttl_s=60) == "ok"
    assert 0 < r.pttl(names.nonce_key("n1")) <= 60_000
    _queued(r, "c11", "q", "alpha")
    assert registry.claim_call(
        r, "c11", "alpha", "t1", 42, nonce="n1", nonce_ttl_s=60
    ) == "replayed"
    assert records.call_record(r, "c11")["state"] == "queued"  # nothing claimed


def test_update_call_sets_fields_and_returns_the_state(r: redis.Redis) -> None:
    _queued(r, "c12", "q", "alpha")
    registry.claim_call(r, "c12", "alpha", "t1", 42)
    assert registry.update_call(r, "c12", pid=7, pgid=7, marker="m") == "running"
    assert records.call_record(r, "c12")["pgid"] == "7"
    assert registry.update_call(r, "nope", pid=1) is None


def test_send_checks_the_host_and_records_at_once(r: redis.Redis) -> None:
    queue = names.exec_queue("alpha")
    # No worker holds the host: nothing is recorded, nothing pushed.
    assert records.send_call(r, "c5", queue, "alpha", _message("c5"), require_alive=True) == "down"
    assert records.call_record(r, "c5") == {}
    assert r.llen(queue) == 0
    registry.acquire_host(r, "alpha", "t1")
    assert records.send_call(r, "c5", queue, "alpha", _message("c5"), require_alive=True) == "ok"
    record = records.call_record(r, "c5")
    assert (record["state"], record["queue"], record["host"]) == ("queued", queue, "alpha")
    assert 0 < r.ttl(names.call_key("c5")) <= names.CALL_TTL_S
    assert records.queued_ids(r, queue) == {"c5"}
    assert records.send_call(r, "c5", queue, "alpha", "x", require_alive=True) == "taken"
    assert r.llen(queue) == 1  # a taken id pushes nothing
    # Unrouted calls record no host.
    assert records.send_call(r, "c6", names.ANY_EXEC_QUEUE, None, "{}",
                             require_alive=False) == "ok"
    assert records.call_record(r, "c6")["host"] == ""


def test_send_looks_up_only_an_id_its_caller_chose(r: redis.Redis) -> None:
    queue = names.exec_queue("alpha")
    assert records.send_call(r, "c7", queue, None, _message("c7"), require_alive=False,
                             fresh_id=True) == "ok"
    # A chosen id that is in use is refused, nothing pushed ...
    assert records.send_call(r, "c7", queue, None, "x", require_alive=False) == "taken"
    assert records.queued_ids(r, queue) == {"c7"}
    # ... a fresh one (new_call_id's) is not looked up: SEND writes without an EXISTS.
    record = records.call_record(r, "c7")
    assert (record["state"], record["queue"]) == ("queued", queue)


def test_withdraw_moves_only_a_queued_call(r: redis.Redis) -> None:
    _queued(r, "c13", "q", "alpha")
    assert records.withdraw_call(r, "c13", CallState.CANCELLED) == "queued"
    assert records.call_record(r, "c13")["state"] == "cancelled"
    assert records.withdraw_call(r, "c13") == "cancelled"  # too late: left as it is
    assert records.call_record(r, "c13")["state"] == "cancelled"
    # No record (lost in a failover): recorded withdrawn, so its message never runs.
    assert records.withdraw_call(r, "c14") == "queued"
    assert records.call_record(r, "c14")["state"] == "abandoned"
    assert 0 < r.ttl(names.call_key("c14")) <= names.CALL_TTL_S


def test_scripts_are_loaded_again_after_a_redis_restart(r: redis.Redis) -> None:
    _queued(r, "c7", "q", "alpha")
    r.script_flush()  # as a restarted Redis would have forgotten them
    assert registry.claim_call(r, "c7", "alpha", "t1", 42) == "ok"
    assert registry.finish_and_reply(r, "alpha", "c7", dict(exit_code=None))[0] == "running"
    assert records.call_record(r, "c7")["exit_code"] == ""


def _queued(r: redis.Redis, call_id: str, queue: str, host: str | None) -> None:
    """A call recorded as queued (as `send_call` records it), its message not pushed."""
    r.hset(names.call_key(call_id), mapping={
        "call_id": call_id, "state": CallState.QUEUED, "queue": queue, "host": host or "",
        "sent_at": time.time(),
    })
    r.expire(names.call_key(call_id), names.CALL_TTL_S)


def _message(call_id: str) -> str:
    # The shape kombu pushes: the task id in the headers.
    return json.dumps({"body": "W10=", "headers": {"task": "bashfleet.exec", "id": call_id}})


def test_the_lost_message_scan_finds_messages_by_their_parsed_ids(r: redis.Redis) -> None:
    queue = names.exec_queue("h1")
    r.lpush(queue, _message("c-other"), _message("c-mine"), "not a task message")
    found = records.queued_ids(r, queue)
    assert found == {"c-other", "c-mine"}
    assert "c-min" not in found  # the whole id, not a prefix


def test_both_sides_keep_a_queue_in_the_one_list_of_its_name() -> None:
    # No priority steps but 0: kombu keeps every message of a queue in the list named
    # like the queue, the one list the lost-message scan and `queue_depths` read.
    url = "redis://127.0.0.1:1/0"
    for app in (celery_apps.client_celery(url), celery_apps.worker_celery(url, "celery.worker:x")):
        assert app.conf.broker_transport_options["priority_steps"] == [0]


def test_a_very_long_queue_counts_as_still_waiting(r: redis.Redis) -> None:
    queue = names.exec_queue("h3")
    r.lpush(queue, _message("a"), _message("b"), _message("c"))
    assert records.queued_ids(r, queue, limit=2) is None  # every call in it waits its turn
    assert records.queued_ids(r, queue, limit=3) == {"a", "b", "c"}


def test_a_claim_sent_ahead_is_answered_later_and_the_same_each_time(r: redis.Redis) -> None:
    # The script is not loaded yet (NOSCRIPT): the answer runs it again, once.
    _queued(r, "c20", "q", "alpha")
    sent = registry.send_claim(r, "c20", "alpha", "inst", 1234)
    assert records.call_record(r, "c20")["state"] == "queued"
    assert sent.answer() == "ok"
    assert sent.answer() == "ok"
    assert records.call_record(r, "c20")["state"] == "running"
    # Loaded now: Redis runs the claim as it is sent, before anyone reads its answer.
    _queued(r, "c21", "q", "alpha")
    sent = registry.send_claim(r, "c21", "alpha", "inst", 1234)
    assert records.call_record(r, "c21")["state"] == "running"
    assert sent.answer() == "ok"
    assert r.ping() is True  # the connection went back to the pool, its reply read
    records.withdraw_call(r, "c22", CallState.CANCELLED)
    assert registry.send_claim(r, "c22", "alpha", "inst", 1234).answer() == "cancelled"
    assert records.call_record(r, "c22")["state"] == "cancelled"  # nothing claimed


def test_a_claim_whose_answer_never_comes_raises_at_every_ask(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    _queued(r, "c23", "q", "alpha")
    sent = registry.send_claim(r, "c23", "alpha", "inst", 1234)
    connection = sent._connection
    assert connection is not None

    def lost(*_: object, **__: object) -> object:
        raise redis.ConnectionError("Redis went away")

    monkeypatch.setattr(connection, "read_response", lost)
    for _ in range(2):
        with pytest.raises(redis.ConnectionError):
            sent.answer()
    monkeypatch.undo()
    assert r.ping() is True  # the pool serves a working connection again
