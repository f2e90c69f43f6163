"""Answers reach their caller on its reply channel, and without it (a cut subscription)."""

from __future__ import annotations

import json
import uuid

import redis

from bashfleet.client import Fleet, records
from bashfleet.client._core.sending import open_reply
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.wire import names
from bashfleet.worker.wire.names import Task

from .conftest import WorkerProcess, raw_task, wait_for


def _cut_reply_subscriptions(client: redis.Redis) -> int:
    """Close the connections of the clients' reply listeners (SUBSCRIBE, no patterns:
    the workers' own pub/sub, kombu's, is by pattern and stays)."""
    cut = 0
    for info in client.client_list():
        if int(info.get("sub", 0)) > 0 and int(info.get("psub", 0)) == 0:
            client.client_kill_filter(_id=info["id"])
            cut += 1
    return cut


def test_answers_come_back_on_the_callers_channel_and_are_stored(
    two_hosts: tuple[WorkerProcess, WorkerProcess], fleet: Fleet, redis_client: redis.Redis
) -> None:
    call_id = f"c{uuid.uuid4().hex[:12]}"
    result = fleet.run("echo back", host=two_hosts[0].host, call_id=call_id)
    assert result.stdout == "back\n"
    assert fleet._replies.listening
    # The stored copy is the same answer, for a caller that missed the publish (locked
    # for the key that signed the call: only its caller reads it).
    stored = records.stored_reply(redis_client, call_id)
    assert stored is not None and '"stdout":"back\\n"' in open_reply(fleet._keys, call_id,
                                                                      stored)
    # Kept in the call's record (written with its end, expiring with it): no key of its own.
    assert redis_client.hget(names.call_key(call_id), names.CALL_REPLY_FIELD) == stored
    assert not redis_client.exists(names.reply_key(call_id))
    assert 0 < redis_client.ttl(names.call_key(call_id)) <= names.REPLY_TTL_S


def test_calls_are_answered_while_the_reply_subscription_is_cut(
    two_hosts: tuple[WorkerProcess, WorkerProcess], fleet: Fleet, redis_client: redis.Redis
) -> None:
    host = two_hosts[0].host
    assert fleet.run("true", host=host).exit_code == 0  # listening now
    for round_ in range(3):
        assert _cut_reply_subscriptions(redis_client) >= 1
        # Whether an answer comes while the listener reconnects (read back from its
        # stored copy) or after, every call gets its own, once.
        results = [fleet.run(f"echo {round_}-{i}", host=host) for i in range(3)]
        assert [r.stdout for r in results] == [f"{round_}-{i}\n" for i in range(3)]
    wait_for(lambda: fleet._replies.listening, 10, "the listener to subscribe again")


def test_control_answers_survive_a_cut_subscription(
    two_hosts: tuple[WorkerProcess, WorkerProcess], fleet: Fleet, redis_client: redis.Redis
) -> None:
    job = fleet.run("sleep 30", host=two_hosts[1].host, mode="background").job
    assert job is not None
    _cut_reply_subscriptions(redis_client)
    assert fleet.check(job.id).running
    assert not fleet.kill(job.id).running


def test_two_clients_hear_only_their_own_answers(
    two_hosts: tuple[WorkerProcess, WorkerProcess], redis_server: RedisServer, fleet: Fleet
) -> None:
    other = Fleet(redis_server.url)
    try:
        assert other._replies.channel != fleet._replies.channel
        ours = fleet.run("echo ours", host=two_hosts[0].host)
        theirs = other.run("echo theirs", host=two_hosts[1].host)
        assert (ours.stdout, theirs.stdout) == ("ours\n", "theirs\n")
    finally:
        other.close()


def _raw_ctl(fleet: Fleet, host: str, task: str, args: list[object]) -> dict[str, object]:
    """Send a signed control message with any arguments; its answer envelope."""
    signed = fleet._identity.signed(task, args, names.ctl_queue(host))
    answer = raw_task(fleet, task, signed, names.ctl_queue(host), f"t{uuid.uuid4().hex[:12]}")
    envelope = json.loads(answer)
    assert isinstance(envelope, dict)
    return envelope


def test_a_control_message_with_wrong_arguments_is_answered_invalid(
    two_hosts: tuple[WorkerProcess, WorkerProcess], fleet: Fleet
) -> None:
    host = two_hosts[0].host
    for args in ([], ["j1", None, None, None, None, "extra"], [1, 2, 3, 4, 5, 6, 7]):
        envelope = _raw_ctl(fleet, host, Task.CHECK, list(args))
        error = envelope.get("error")
        assert isinstance(error, dict) and error["kind"] == "invalid", envelope
        assert "invalid arguments" in str(error["message"])
    # The control consumer goes on answering.
    jobs = _raw_ctl(fleet, host, Task.JOBS, [{}])
    assert "ok" in jobs
