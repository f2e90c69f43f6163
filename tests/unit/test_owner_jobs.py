"""A listing of one owner's jobs reads that owner's index, not every job of the host: on
the worker (`control.list_jobs`) and in Redis for a dead host. On fakeredis, with job
records on a temporary disk."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest
import redis

from bashfleet.client import records
from bashfleet.worker.engine.jobs import jobs
from bashfleet.worker.fleet import control, registry
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire import auth, names
from bashfleet.worker.wire.control import JobsRequest
from bashfleet.worker.wire.models import JobRecord

KEYS = ("k" * 32,)
RING = auth.keyring(KEYS)


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = fakeredis.FakeRedis(decode_responses=True)
    yield client
    client.flushall()


def _job(settings: Settings, job_id: str, owner: str, started_at: float) -> JobRecord:
    settings.jobs_dir.mkdir(parents=True, exist_ok=True)
    output = settings.jobs_dir / f"{job_id}.log"
    output.write_text("out\n")
    record = JobRecord(
        id=job_id, host=settings.host, pid=1, pgid=1, start_time=1.0, marker=job_id,
        command="sleep 1", cwd="/", output_path=str(output),
        status_path=str(settings.jobs_dir / f"{job_id}.status.json"), started_at=started_at,
        owner=owner,
    )
    jobs.save_record(record, settings)
    jobs.write_status(record, 0)
    return record


def _published(r: redis.Redis, settings: Settings, owners: dict[str, str]) -> None:
    now = time.time()
    for index, (job_id, owner) in enumerate(owners.items()):
        record = _job(settings, job_id, owner, now + index)
        registry.save_job(r, record, keys=KEYS, running=False, exit_code=0, ended_at=now)


def test_a_saved_job_is_indexed_under_its_owner_on_its_host(r: redis.Redis,
                                                           tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, host="alpha")
    _published(r, settings, {"j1": "ann", "j2": "bob", "j3": "ann"})
    assert registry.owner_job_ids(r, "alpha", "ann") == ["j1", "j3"]
    assert registry.owner_job_ids(r, "alpha", "bob") == ["j2"]
    assert registry.owner_job_ids(r, "beta", "ann") == []
    assert 0 < r.ttl(names.owner_jobs_key("alpha", registry.owner_space("ann"))) <= names.JOB_TTL_S


def test_the_worker_lists_an_owners_jobs_from_its_index(r: redis.Redis, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(state_dir=tmp_path, host="alpha", signing_key="k" * 32)
    _published(r, settings, {f"j{i}": ("ann" if i % 10 == 0 else "bob") for i in range(50)})
    read: list[str] = []
    real_load = jobs.load_record

    def counted(job_id: str, settings: Settings | None = None) -> JobRecord:
        read.append(job_id)
        return real_load(job_id, settings)

    monkeypatch.setattr(jobs, "load_record", counted)
    monkeypatch.setattr(jobs, "local_records", lambda *_: pytest.fail("every record read"))
    rt = control.Runtime(settings=settings, redis=r, instance="t1")
    listed = control.list_jobs(rt, JobsRequest(owner="ann"))
    assert [view.id for view in listed.jobs] == [f"j{i}" for i in range(0, 50, 10)]
    assert sorted(read) == sorted(f"j{i}" for i in range(0, 50, 10))  # ann's only


def test_a_job_whose_files_are_gone_is_left_out(r: redis.Redis, tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, host="alpha", signing_key="k" * 32)
    _published(r, settings, {"j1": "ann", "j2": "ann"})
    jobs.record_path(settings, "j1").unlink()
    rt = control.Runtime(settings=settings, redis=r, instance="t1")
    assert [view.id for view in control.list_jobs(rt, JobsRequest(owner="ann")).jobs] == ["j2"]


def test_a_dead_hosts_listing_reads_the_owners_index(r: redis.Redis, tmp_path: Path) -> None:
    ANN = registry.owner_space("ann")  # noqa: N806 - read as a constant below
    settings = Settings(state_dir=tmp_path, host="alpha")
    _published(r, settings, {"j1": "ann", "j2": "bob", "j3": "ann"})
    assert [v.id for v in records.list_jobs(r, "alpha", keys=RING, space=ANN)] == ["j1", "j3"]
    assert [v.id for v in records.list_jobs(r, "alpha", keys=RING)] == ["j1", "j2", "j3"]
    # An expired job is pruned from the index read.
    r.delete(names.job_key("j3"))
    assert [v.id for v in records.list_jobs(r, "alpha", keys=RING, space=ANN)] == ["j1"]
    assert registry.owner_job_ids(r, "alpha", "ann") == ["j1"]
