"""The fleet's authenticity, as pure logic: what a reader believes of a sealed job hash,
host record and event; a host's nonce memory, shared by its processes and kept across
restarts; the owner quota's script; which variables the worker strips when it execs
itself, and which paths settings name as secret; when a worker refuses to start without
a sandbox."""

from __future__ import annotations

import base64
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from bashfleet.worker.fleet import registry
from bashfleet.worker.fleet.connect import hash_fields
from bashfleet.worker.fleet.nonces import NonceMemory, parse_lines
from bashfleet.worker.fleet.supervisor import _own_secret_variable, unsandboxed_refusal
from bashfleet.worker.settings import Settings, secret_paths
from bashfleet.worker.wire import auth, names
from bashfleet.worker.wire.events import JobEvent, open_event, seal_event
from bashfleet.worker.wire.models import JobRecord
from bashfleet.worker.wire.records import (
    SEAL,
    host_seal,
    job_offsets,
    job_seal,
    lock_record,
    offsets_seal,
    open_host_info,
    open_job_view,
)

KEYS = ("k" * 32,)
RING = auth.keyring(KEYS)
ATTACKER = auth.keyring(["attacker-" + "9" * 24])


def _record(job_id: str = "j1", owner: str = "user:a") -> JobRecord:
    return JobRecord(
        id=job_id, host="h1", pid=10, pgid=10, start_time=1.0, marker=job_id,
        command="make test", cwd="/src", output_path=f"/jobs/{job_id}.log",
        status_path=f"/jobs/{job_id}.status.json", started_at=1000.0, call_id=f"c-{job_id}",
        owner=owner,
    )


def _job_hash(record: JobRecord, **state: object) -> dict[str, str]:
    fields = hash_fields({"record": lock_record(KEYS, record), "host": record.host,
                          "state": "running", **state})
    fields[SEAL] = job_seal(KEYS, record.id, fields)
    return fields


# ----------------------------------------------------------------- 5: sealed job hashes


def test_a_sealed_job_hash_reads_as_its_view() -> None:
    view = open_job_view(RING, "j1", _job_hash(_record()))
    assert view is not None and (view.id, view.state, view.running) == ("j1", "running", True)


@pytest.mark.parametrize(
    "forge",
    [
        # The attack as reported: HSET state ended exit_code 0 on a running job.
        lambda f: f.update(state="ended", exit_code="0"),
        lambda f: f.update(note="all tests passed"),
        lambda f: f.update(host="elsewhere"),
        lambda f: f.pop(SEAL),
        lambda f: f.update({SEAL: "-:-"}),
        lambda f: f.update({SEAL: job_seal(["attacker-" + "9" * 24], "j1", f)}),
    ],
)
def test_a_forged_job_hash_is_left_out(forge: Any) -> None:
    fields = _job_hash(_record())
    forge(fields)
    assert open_job_view(RING, "j1", fields) is None


def test_another_jobs_hash_copied_under_this_id_is_left_out() -> None:
    assert open_job_view(RING, "j2", _job_hash(_record("j1"))) is None


def test_an_unsigned_client_reads_without_checking_and_an_empty_hash_is_none() -> None:
    fields = hash_fields({"record": lock_record((), _record()), "host": "h1"})
    fields["state"] = "ended"  # an unsigned worker's hash: nothing to check
    view = open_job_view({}, "j1", fields)  # a keyless client (an --insecure-unsigned fleet)
    assert view is not None and view.state == "ended"
    assert open_job_view(RING, "j1", {}) is None


def test_forged_offsets_read_from_the_start() -> None:
    fields = {"offset": "12", "stderr_offset": "4",
              "offsets_seal": offsets_seal(KEYS, "j1", 12, 4)}
    assert job_offsets(RING, "j1", fields) == (12, 4)
    assert job_offsets(RING, "j1", {**fields, "offset": "99999"}) == (0, 0)
    assert job_offsets(RING, "j2", fields) == (0, 0)


# ---------------------------------------------------------------- 5: sealed host records


def _host(keys: tuple[str, ...] = KEYS, extra: dict[str, object] | None = None
          ) -> dict[str, str]:
    record = hash_fields({"host": "h1", "instance": "t1", "concurrency": 4, "labels": "gpu",
                          "heartbeat_at": 1000.0, "pid": 7})
    record[SEAL] = host_seal(keys, "h1", record)
    record.update(registry.readiness(keys, "h1", "t1", {"exec": 11, "ctl": 12}))
    record.update(hash_fields(extra or {}))
    return record


def test_a_sealed_host_record_reads_alive_and_ready() -> None:
    info = open_host_info(RING, "h1", _host(), "t1", 1)
    assert info is not None and info.alive and info.ready and info.slots == 4


@pytest.mark.parametrize(
    "change",
    [{"concurrency": 512}, {"labels": "gpu,prod"}, {"sandbox": '{"isolation": "strict"}'},
     {"instance": "t2"}],
)
def test_a_forged_host_record_is_left_out(change: dict[str, object]) -> None:
    assert open_host_info(RING, "h1", _host(extra=change), "t1", 0) is None


def test_readiness_of_another_instance_or_unsealed_is_not_ready() -> None:
    record = _host()
    record["exec_ready"] = "99"  # changed after it was sealed
    info = open_host_info(RING, "h1", record, "t1", 0)
    assert info is not None and not info.ready
    unsealed = _host(keys=())
    assert open_host_info(RING, "h1", unsealed, "t1", 0) is None


# ----------------------------------------------------------------------- 5: job events


def _event(**change: object) -> JobEvent:
    base = JobEvent(kind="ended", job_id="j1", host="h1", at=1.0, command="make",
                    output_path="/o", exit_code=3)
    return base.model_copy(update=change)


def test_a_sealed_event_opens_with_its_seq() -> None:
    event = open_event(RING, seal_event(KEYS, _event()), "5-1")
    assert event is not None and (event.exit_code, event.seq) == (3, "5-1")


def _tampered(locked: str) -> str:
    """A locked text with one byte of its ciphertext changed."""
    head, _, body = locked.partition("\n")
    raw = bytearray(base64.b64decode(body))
    raw[-1] ^= 1
    return f"{head}\n{base64.b64encode(bytes(raw)).decode()}"


@pytest.mark.parametrize(
    "text",
    [
        _event(exit_code=0).model_dump_json(),  # unsealed (the attack)
        f"-:-\n{_event(exit_code=0).model_dump_json()}",
        seal_event(["attacker-" + "9" * 24], _event(exit_code=0)),
        _tampered(seal_event(KEYS, _event())),
        seal_event(KEYS, _event()).replace(auth.key_id(KEYS[0]), auth.key_id("x" * 32)),
    ],
)
def test_a_forged_event_is_dropped(text: str) -> None:
    assert open_event(RING, text, "5-1") is None


def test_an_unsigned_client_takes_events_unchecked() -> None:
    event = open_event({}, seal_event((), _event()), "5-1")  # an unsigned worker's
    assert event is not None and event.exit_code == 3


# ------------------------------------------------------------- 7: the host's nonces


def test_nonces_are_shared_by_the_hosts_processes_and_kept_across_restarts(
    tmp_path: Path,
) -> None:
    path = tmp_path / "nonces" / "host.log"
    exec_consumer, ctl_consumer = NonceMemory(path), NonceMemory(path)
    later = time.time() + 300
    assert exec_consumer.first_use("n1", later)
    assert not ctl_consumer.first_use("n1", later)  # the other consumer took it
    assert ctl_consumer.first_use("n2", later)
    assert not exec_consumer.first_use("n2", later)
    restarted = NonceMemory(path)
    assert not restarted.first_use("n1", later) and not restarted.first_use("n2", later)
    assert restarted.first_use("n3", later)


def test_another_process_sees_the_nonces(tmp_path: Path) -> None:
    path = tmp_path / "host.log"
    NonceMemory(path).first_use("n-here", time.time() + 300)
    script = (
        "import sys, time\nfrom pathlib import Path\n"
        "from bashfleet.worker.fleet.nonces import NonceMemory\n"
        "m, later = NonceMemory(Path(sys.argv[1])), time.time() + 300\n"
        "print(m.first_use('n-here', later), m.first_use('n-there', later))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                          text=True, check=True, timeout=60)
    assert done.stdout.split() == ["False", "True"]
    assert not NonceMemory(path).first_use("n-there", time.time() + 300)


def test_expired_nonces_and_torn_lines(tmp_path: Path) -> None:
    now = time.time()
    assert parse_lines(f"{now - 1:.3f} old\n{now + 60:.3f} new\n{now + 60:.3f}", now) == {
        "new": pytest.approx(now + 60, abs=0.01)
    }
    path = tmp_path / "host.log"
    path.write_text(f"{now + 60:.3f} kept\n{now + 60:.3f} to")  # a process died mid-line
    memory = NonceMemory(path)
    assert not memory.first_use("kept", now + 60)
    assert memory.first_use("fresh", now + 60)
    assert not NonceMemory(path).first_use("fresh", now + 60)  # on a line of its own


def test_compaction_is_seen_by_the_other_process(tmp_path: Path, monkeypatch: Any) -> None:
    from bashfleet.worker.fleet import nonces  # noqa: PLC0415

    monkeypatch.setattr(nonces, "COMPACT_LINES", 3)
    path = tmp_path / "host.log"
    first, second = NonceMemory(path), NonceMemory(path)
    later = time.time() + 300
    for index in range(6):
        assert first.first_use(f"n{index}", later)
    assert all(not second.first_use(f"n{index}", later) for index in range(6))


def test_the_kept_descriptor_follows_the_file_not_a_removed_one(tmp_path: Path) -> None:
    # Each memory keeps its file open between uses: a file removed (or replaced) under
    # it is left, and what is written goes where the next process reads.
    path = tmp_path / "host.log"
    memory, other = NonceMemory(path), NonceMemory(path)
    later = time.time() + 300
    assert memory.first_use("a", later) and not other.first_use("a", later)
    path.unlink()
    assert memory.first_use("b", later)
    assert path.read_text().split()[1::2] == ["b"]
    assert not other.first_use("b", later)
    assert other.first_use("c", later) and not memory.first_use("c", later)
    assert not NonceMemory(path).first_use("c", later)


# ----------------------------------------------------------------- 8: the owner quota


@pytest.fixture
def r() -> Any:
    return fakeredis.FakeRedis(decode_responses=True)


def test_quota_takes_up_to_the_limit_then_refuses(r: Any) -> None:
    taken = [registry.quota_acquire(r, "jobs", "o1", f"c{i}", 3) for i in range(5)]
    assert [q.taken for q in taken] == [True, True, True, False, False]
    assert taken[3].held == 3 and taken[3].limit == 3
    assert 0 < taken[3].retry_after_s <= names.QUOTA_TTL_S
    # A member held already is never refused (a retry of the same start).
    assert registry.quota_acquire(r, "jobs", "o1", "c0", 3).taken
    # Another owner, or another kind, has its own count.
    assert registry.quota_acquire(r, "jobs", "o2", "c0", 3).taken
    assert registry.quota_acquire(r, "workspaces", "o1", "w0", 3).taken
    registry.quota_release(r, "jobs", "o1", "c1")
    assert registry.quota_acquire(r, "jobs", "o1", "c9", 3).taken
    ttl = r.pttl(names.quota_key("jobs", registry.owner_space("o1")))
    assert 0 < ttl <= names.QUOTA_TTL_S * 1000


def test_members_of_a_host_that_died_expire(r: Any) -> None:
    for index in range(2):
        assert registry.quota_acquire(r, "jobs", "o1", f"c{index}", 2, ttl_s=0.05).taken
    assert not registry.quota_acquire(r, "jobs", "o1", "c2", 2).taken
    deadline = time.monotonic() + 5
    while not registry.quota_acquire(r, "jobs", "o1", "c2", 2).taken:
        assert time.monotonic() < deadline, "expired members were never given back"


def test_refresh_keeps_live_members_past_the_limit(r: Any) -> None:
    assert registry.quota_refresh(r, "jobs", "o1", ["a", "b", "c"]) == 3
    assert not registry.quota_acquire(r, "jobs", "o1", "d", 2).taken


def test_a_jobs_state_keeps_its_place_until_it_ends(r: Any) -> None:
    record = _record()
    registry.save_job(r, record, keys=KEYS, running=True)
    assert r.zscore(names.quota_key("jobs", registry.owner_space("user:a")), "c-j1") is not None
    assert not registry.quota_acquire(r, "jobs", "user:a", "c-other", 1).taken
    registry.save_job(r, record, keys=KEYS, running=False, exit_code=0, ended_at=1001.0)
    assert r.zscore(names.quota_key("jobs", registry.owner_space("user:a")), "c-j1") is None
    assert registry.quota_acquire(r, "jobs", "user:a", "c-other", 1).taken
    session = record.model_copy(update={"id": "j2", "call_id": "c-j2", "stdin": "pipe"})
    registry.save_job(r, session, keys=KEYS, running=True)  # interactive: its own cap
    assert r.zscore(names.quota_key("jobs", registry.owner_space("user:a")), "c-j2") is None


# --------------------------------------------------- 9: the worker's own secrets, by name


@pytest.mark.parametrize(
    ("name", "stripped"),
    [
        ("BASHFLEET_SIGNING_KEY", True),
        ("BASHFLEET_SIGNING_KEYS_ACCEPTED", True),
        ("BASHFLEET_ADMIN_KEY", True),
        ("BASHFLEET_REDIS_URL", True),
        ("BASHFLEET_REDIS_PASSWORD", True),
        # Settings whose names look secret, and the files' paths (the sandbox hides them):
        ("BASHFLEET_SECRET_FILES", False),
        ("BASHFLEET_SECRET_DENY", False),
        ("BASHFLEET_SECRET_ALLOW", False),
        ("BASHFLEET_SIGNING_KEY_FILE", False),
        ("BASHFLEET_REDIS_URL_FILE", False),
        ("BASHFLEET_HOST", False),
    ],
)
def test_the_worker_strips_its_own_secrets_by_name(name: str, stripped: bool) -> None:
    assert _own_secret_variable(name) is stripped


def test_secret_paths_lists_every_file_setting(tmp_path: Path) -> None:
    key = tmp_path / "signing.key"
    key.write_text("k" * 32)
    settings = Settings(
        secret_files=(str(tmp_path / "app.env"), "/etc/netrc"), signing_key_file=key,
        redis_url_file=tmp_path / "redis.url", admin_key_file=tmp_path / "admin.key",
        admin_key="a" * 32, redis_url="redis://x",
    )
    assert secret_paths(settings) == [
        tmp_path / "app.env", Path("/etc/netrc"), key, tmp_path / "redis.url",
        tmp_path / "admin.key",
    ]
    assert secret_paths(Settings(redis_url="redis://x")) == []


def test_an_operators_deny_patterns_add_to_the_defaults() -> None:
    settings = Settings(secret_deny=("MYCO_*",))
    assert "MYCO_*" in settings.secret_deny and "*KEY*" in settings.secret_deny


# ------------------------------------------------------ no silent fallback to no sandbox


@pytest.mark.parametrize(
    ("isolation", "problem", "local", "refused"),
    [
        ("auto", "bwrap: No permissions to create a new namespace", False, True),
        ("auto", "bwrap: No permissions to create a new namespace", True, False),  # `up`
        ("auto", None, False, False),  # the sandbox works
        ("none", "isolation is none (settings)", False, False),  # asked for
        ("process", "no bwrap", False, False),  # startup_problems refuses it itself
    ],
)
def test_a_worker_refuses_to_run_calls_unsandboxed_unless_told(
    isolation: str, problem: str | None, local: bool, refused: bool
) -> None:
    refusal = unsandboxed_refusal(isolation, problem, local_fallback=local)
    assert (refusal is not None) is refused
    if refusal is not None:
        assert problem is not None and problem in refusal and "--isolation none" in refusal


def test_a_job_is_the_readers_to_wait_on_when_it_opens_or_was_forged_under_its_key() -> None:
    """`wait` tells another owner's job as no job is, but waits on one of its own that a
    Redis writer changed (not believed, and its real end still to come)."""
    from bashfleet.worker.wire.records import readers_job  # noqa: PLC0415

    record = _record()
    fields = _job_hash(record)
    keys = auth.keyring(KEYS)
    assert readers_job(keys, record.id, fields)
    assert readers_job(keys, record.id, {**fields, "state": "ended", "exit_code": "0"})
    assert not readers_job(ATTACKER, record.id, fields)
    assert not readers_job(keys, record.id, {})
