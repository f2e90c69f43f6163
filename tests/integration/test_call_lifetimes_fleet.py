"""What a call leaves in Redis, through real workers: minutes of record and answer, no
nonce key for a signed call; an older call's kept output still read once its record is
gone (its host keeps it on disk, and the live hosts are asked); a job listing that names
the owner's own jobs."""

from __future__ import annotations

import uuid

import pytest
import redis

from bashfleet.client import Fleet
from bashfleet.client.errors import UnknownJob
from bashfleet.worker.wire import names

from .conftest import WorkerProcess


def test_a_call_leaves_only_minutes_of_record_and_answer(
    two_hosts: tuple[WorkerProcess, WorkerProcess], fleet: Fleet, redis_client: redis.Redis
) -> None:
    call_id = f"c{uuid.uuid4().hex[:12]}"
    assert fleet.run("echo short", host=two_hosts[0].host, call_id=call_id).stdout == "short\n"
    assert 0 < redis_client.ttl(names.call_key(call_id)) <= names.FINISHED_TTL_S
    # Its answer is kept in that record, which it expires with.
    assert redis_client.hget(names.call_key(call_id), names.CALL_REPLY_FIELD)
    assert not redis_client.exists(names.reply_key(call_id))
    # The host's own memory checked the signed call's nonce: no Redis key for it.
    assert not list(redis_client.scan_iter(match=names.nonce_key("*"), count=1000))


def test_an_older_calls_kept_output_is_read_after_its_record_left_redis(
    two_hosts: tuple[WorkerProcess, WorkerProcess], fleet: Fleet, redis_client: redis.Redis
) -> None:
    call_id = f"c{uuid.uuid4().hex[:12]}"
    result = fleet.run("seq 1 100000", host=two_hosts[1].host, call_id=call_id)
    assert result.spill is not None and result.spill.stdout_path, result
    # As if FINISHED_TTL_S had passed.
    redis_client.delete(names.call_key(call_id), names.reply_key(call_id))
    chunk = fleet.read_output(call_id, offset=0, limit=12)
    assert chunk.text == "1\n2\n3\n4\n5\n6\n" and chunk.size > 500_000


def test_an_id_no_host_keeps_is_unknown(
    two_hosts: tuple[WorkerProcess, WorkerProcess], fleet: Fleet
) -> None:
    with pytest.raises(UnknownJob, match="unknown or expired"):
        fleet.read_output(f"c{uuid.uuid4().hex[:12]}")


def test_a_job_is_listed_from_its_owners_index(
    two_hosts: tuple[WorkerProcess, WorkerProcess], fleet: Fleet, redis_client: redis.Redis
) -> None:
    host = two_hosts[0].host
    job = fleet.run("sleep 30", host=host, mode="background").job
    assert job is not None
    try:
        space = fleet._identity.space  # the owner's space: a MAC of its key, not its name
        assert job.id in redis_client.zrange(names.owner_jobs_key(host, space), 0, -1)
        assert job.id in [view.id for view in fleet.jobs(host)]
    finally:
        fleet.kill(job.id)
