"""Owners are credentials, not names anyone may claim, on a real fleet: two owners with
keys of their own (`bashfleet owner add`) on one host, their clients connected as the
clients' Redis user (`bashfleet.worker.wire.acl`), the worker as the workers'.

Neither sees, drives or ends the other's workspaces, jobs, sessions or events, through
the Python API, the CLI (a process), or Redis with the clients' credentials; an owner
key cannot sign as another owner; the admin sees all. Every refusal is preceded by the
attack working where it used to (the fleet key every client held, a record read as it
was stored), so that no assertion passes for the wrong reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from bashfleet.client import Fleet, UnknownJob, UnknownWorkspace
from bashfleet.client._core.sending import new_call_id
from bashfleet.client._sync import records as sync_records
from bashfleet.client.dialects import NativeDialect
from bashfleet.client.errors import BashfleetError, Unauthorized, UnknownCall, WaitTimeout
from bashfleet.client.mcp_server import FleetBackend, ToolServer, session_owner
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.wire import acl, auth, names
from bashfleet.worker.wire.events import EVENT_NAME
from bashfleet.worker.wire.models import Call, CallResult
from bashfleet.worker.wire.names import Task, exec_queue
from bashfleet.worker.wire.owner_keys import OwnerKey

from .conftest import WorkerFactory, WorkerProcess, raw_task, wait_for

HOST = "own1"
FLEET_KEY = os.environ["BASHFLEET_SIGNING_KEY"]
ADMIN_KEY = "admin-" + uuid.uuid4().hex
ALICE = OwnerKey.issue(FLEET_KEY, "alice")
BOB = OwnerKey.issue(FLEET_KEY, "bob")


class Users:
    """The fleet's two Redis users, made on the suite's Redis for this module."""

    def __init__(self, server: RedisServer) -> None:
        self.worker_password = secrets.token_hex(12)
        self.client_password = secrets.token_hex(12)
        self.port = server.port

    def url(self, user: str, password: str) -> str:
        return f"redis://{user}:{password}@127.0.0.1:{self.port}/0"

    @property
    def worker_url(self) -> str:
        return self.url(acl.WORKER_USER, self.worker_password)

    @property
    def client_url(self) -> str:
        return self.url(acl.CLIENT_USER, self.client_password)


@pytest.fixture(scope="module")
def users(redis_server: RedisServer, redis_client: redis.Redis) -> Iterator[Users]:
    made = Users(redis_server)
    for user, password, rules in ((acl.WORKER_USER, made.worker_password, acl.worker_rules()),
                                  (acl.CLIENT_USER, made.client_password, acl.client_rules())):
        _acl(redis_client, "SETUSER", *acl.setuser_args(user, password, rules))
    try:
        yield made
    finally:
        _acl(redis_client, "DELUSER", acl.WORKER_USER, acl.CLIENT_USER)


def _acl(client: redis.Redis, *args: str) -> Any:
    return client.execute_command("ACL", *args)  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def host(session_workers: WorkerFactory, users: Users) -> Iterator[WorkerProcess]:
    """A host whose worker connects as the workers' user, with an admin key."""
    yield from session_workers.module_host(HOST, env={
        "BASHFLEET_REDIS_URL": users.worker_url, "BASHFLEET_ADMIN_KEY": ADMIN_KEY})


@contextlib.contextmanager
def _env(**values: str | None) -> Iterator[None]:
    """The process's BASHFLEET_* variables as given, for the time a client is made."""
    before = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def owner_client(users: Users, key: OwnerKey) -> Fleet:
    """An owner's client as deployed: its owner key only, the clients' Redis user."""
    with _env(BASHFLEET_OWNER_KEY=key.text, BASHFLEET_SIGNING_KEY=None):
        return Fleet(users.client_url)


@pytest.fixture(scope="module")
def alice(host: WorkerProcess, users: Users) -> Iterator[Fleet]:
    client = owner_client(users, ALICE)
    yield client
    client.close()


@pytest.fixture(scope="module")
def bob(host: WorkerProcess, users: Users) -> Iterator[Fleet]:
    client = owner_client(users, BOB)
    yield client
    client.close()


@pytest.fixture(scope="module")
def admin(host: WorkerProcess, users: Users) -> Iterator[Fleet]:
    with _env(BASHFLEET_ADMIN_KEY=ADMIN_KEY):
        client = Fleet(users.worker_url, admin=True)
    yield client
    client.close()


@pytest.fixture(scope="module")
def operator(host: WorkerProcess, users: Users) -> Iterator[Fleet]:
    """A client holding the fleet key (what every client held before owner keys)."""
    client = Fleet(users.worker_url, owner="bob")
    yield client
    client.close()


@pytest.fixture(scope="module")
def bobs_redis(users: Users) -> Iterator[redis.Redis]:
    """Raw Redis with the clients' credentials (what bob's machine holds)."""
    client = redis.Redis.from_url(users.client_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture(scope="module")
def workers_redis(users: Users) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(users.worker_url, decode_responses=True)
    yield client
    client.close()


class AliceHas:
    """What alice made: a workspace, a background job in it (its command carries a
    secret), the call that started it, a session's shell."""

    def __init__(self, alice: Fleet) -> None:
        self.secret = f"ALICE-SECRET-{uuid.uuid4().hex}"
        self.seq = "0-0"
        self.workspace = alice.workspace(host=HOST)
        result = alice.run(f"echo {self.secret}; sleep 300", workspace=self.workspace.id,
                           mode="background", tags={"t": "owners"})
        assert result.job is not None, result
        self.job = result.job.id
        self.call = result.call_id
        self.session = f"shared-{uuid.uuid4().hex[:8]}"
        shell = alice.run(f"cd /tmp && export ALICE_VAR={self.secret}", host=HOST,
                          session=self.session)
        assert shell.exit_code == 0, shell


@pytest.fixture(scope="module")
def alice_has(alice: Fleet, workers_redis: redis.Redis) -> Iterator[AliceHas]:
    since = _last_seq(workers_redis)
    made = AliceHas(alice)
    made.seq = since
    yield made
    with contextlib.suppress(BashfleetError):
        alice.kill(made.job)
    with contextlib.suppress(BashfleetError):
        made.workspace.delete()


def _last_seq(client: redis.Redis) -> str:
    newest = cast("list[Any]", client.xrevrange(names.EVENTS_KEY, "+", "-", count=1))
    return str(newest[0][0]) if newest else "0-0"


# ------------------------------------------------------------- signing as another


def _signed_exec(client: Fleet, key: str, kid: str | None, owner: str, command: str, *,
                 call_id: str | None = None) -> CallResult:
    call = Call(call_id=call_id or f"c{uuid.uuid4().hex[:20]}", command=command, owner=owner,
                background=True)
    queue = exec_queue(HOST)
    args: list[object] = [auth.sign(key, Task.EXEC, [call.model_dump(mode="json")], time.time(),
                      target=queue, kid=kid)]
    return CallResult.model_validate_json(raw_task(client, Task.EXEC, list(args), queue,
                                                   call.call_id))


def test_an_owner_key_cannot_sign_as_another_owner(
    alice: Fleet, bob: Fleet, operator: Fleet, workers_redis: redis.Redis
) -> None:
    # The attack as it was: the fleet key, which every client held, signs as bob; the
    # job is bob's (he lists it, he can end it).
    mark = f"as-bob-{uuid.uuid4().hex[:8]}"
    worked = _signed_exec(operator, FLEET_KEY, None, "bob", f"sleep 300 # {mark}")
    assert worked.error is None and worked.job is not None, worked
    assert worked.job.id in {view.id for view in bob.jobs(HOST)}
    bob.kill(worked.job.id)
    # The same message signed with alice's key: refused, nothing started for bob.
    before = {view.id for view in bob.jobs(HOST)}
    refused = _signed_exec(alice, ALICE.secret, ALICE.key_id, "bob", f"sleep 300 # {mark}")
    assert refused.error is not None and refused.error.kind == "unauthorized", refused
    assert "acts as its own owner only" in refused.error.message
    assert refused.job is None and {view.id for view in bob.jobs(HOST)} == before
    # alice's key naming bob's key id: its MAC is not bob's. The worker cannot tell whose
    # it is, so its refusal is sealed with the fleet's key: alice cannot even read it.
    call_id = f"c{uuid.uuid4().hex[:20]}"
    with pytest.raises(Unauthorized):
        _signed_exec(alice, ALICE.secret, BOB.key_id, "bob", "true", call_id=call_id)
    stored = cast("str", workers_redis.get(names.reply_key(call_id)))
    forged = CallResult.model_validate_json(
        auth.open_answer(auth.keyring([FLEET_KEY]), auth.REPLY, call_id, stored))
    assert forged.error is not None and forged.error.kind == "unauthorized", forged
    assert forged.job is None
    # And a client holding alice's key cannot even ask to be bob.
    with _env(BASHFLEET_OWNER_KEY=ALICE.text), pytest.raises(BashfleetError, match="not"):
        Fleet(bob._raw_url, owner="bob")


# ---------------------------------------------------------------- the Python API


def test_neither_sees_drives_nor_ends_the_others_jobs_and_workspaces(
    alice: Fleet, bob: Fleet, admin: Fleet, users: Users, alice_has: AliceHas
) -> None:
    job, workspace = alice_has.job, alice_has.workspace.id
    # What worked before owner keys: a client with the fleet key, as alice, reaches them.
    as_alice = Fleet(users.worker_url, owner="alice")
    try:
        assert as_alice.check(job).running
        assert as_alice.open_workspace(workspace).id == workspace
    finally:
        as_alice.close()
    # alice sees hers.
    assert job in {view.id for view in alice.jobs(HOST)}
    assert workspace in {view.id for view in alice.workspaces()}
    # bob sees nothing of them, and cannot drive or end them.
    assert job not in {view.id for view in bob.jobs(HOST)}
    assert workspace not in {view.id for view in bob.workspaces()}
    for act in (bob.check, bob.kill):
        with pytest.raises(UnknownJob):
            act(job)
    with pytest.raises(BashfleetError):
        bob.read_output(job)
    with pytest.raises(BashfleetError):
        bob.read_output(alice_has.call)
    with pytest.raises(UnknownWorkspace):
        bob.open_workspace(workspace)
    try:
        ran = bob.run("echo in-alices", workspace=workspace, host=HOST)
    except BashfleetError:
        pass  # refused before it was sent
    else:
        assert ran.error is not None and ran.error.kind == "not_found", ran
    assert alice.check(job).running  # still alive, whatever bob tried
    # The admin sees both owners' jobs.
    mine = bob.run("sleep 300", host=HOST, mode="background")
    assert mine.job is not None
    try:
        every = {view.id: view.owner for view in admin.jobs(HOST, all_owners=True)}
        assert every.get(job) == "alice" and every.get(mine.job.id) == "bob"
        with pytest.raises(BashfleetError):
            bob.jobs(HOST, all_owners=True)
    finally:
        bob.kill(mine.job.id)


def test_an_owners_files_and_snapshots_are_its_own(
    alice: Fleet, bob: Fleet, alice_has: AliceHas, tmp_path: Path
) -> None:
    """Files travel through the clients' Redis user (chunk lists MACed with the owner's
    key) and the worker's answers; a snapshot's record is alice's to list."""
    ws = alice_has.workspace
    ws.write_file("note.txt", alice_has.secret)
    assert ws.read_file("note.txt") == alice_has.secret.encode()
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "big.bin").write_bytes(os.urandom(3 * 2**20))  # several chunks
    ws.upload(tmp_path / "up", "up")
    ws.download("up", tmp_path / "down")
    assert (tmp_path / "down" / "big.bin").read_bytes() == (
        tmp_path / "up" / "big.bin").read_bytes()
    snap = ws.snapshot()
    deleted = False
    try:
        assert snap.id in {s.id for s in alice.snapshots()}
        assert snap.id not in {s.id for s in bob.snapshots()}
        assert not bob.delete_snapshot(snap.id)  # "gone already", as far as bob can tell
        assert snap.id in {s.id for s in alice.snapshots()}
        deleted = alice.delete_snapshot(snap.id)  # the same call, by its owner: done
        assert deleted and snap.id not in {s.id for s in alice.snapshots()}
    finally:
        if not deleted:
            alice.delete_snapshot(snap.id)


# ------------------------------------------------- an id is not a bearer token


def _missing_id() -> str:
    return f"c{uuid.uuid4().hex[:20]}"


def _said(exc: BaseException, item_id: str) -> str:
    """An error's text with the id it names taken out (to compare two ids' answers)."""
    return str(exc).replace(item_id, "<id>")


def test_wait_on_anothers_job_is_told_as_no_such_job(
    alice: Fleet, bob: Fleet, operator: Fleet, alice_has: AliceHas
) -> None:
    """bob waited on alice's job and was told `still running after 1s` (it exists); now
    exactly what an id no job has gets, as soon."""
    job, missing = alice_has.job, _missing_id()
    with pytest.raises(WaitTimeout):  # the job is there and runs: alice waits on it
        alice.wait(job, timeout=0.3)
    answers: dict[str, tuple[str, float]] = {}
    for item in (missing, job, alice_has.call):  # the call that started it, too
        started = time.monotonic()
        with pytest.raises(UnknownJob) as caught:
            bob.wait(item, timeout=5)
        answers[item] = (_said(caught.value, item), time.monotonic() - started)
    texts = {text for text, _ in answers.values()}
    assert texts == {"no such job: <id> (unknown or expired)"}, answers
    assert all(took < 2.0 for _, took in answers.values()), answers  # not after 5 s
    with pytest.raises(WaitTimeout):  # the fleet key's client (the operator's): all
        operator.wait(job, timeout=0.3)
    # The CLI, as bob runs it: the same words, the same exit status, as soon.
    done = {item: _timed_cli(bob, "wait", item, "--timeout", "20") for item in (missing, job)}
    (gone, gone_s), (theirs, theirs_s) = done[missing], done[job]
    assert theirs.returncode == gone.returncode != 0, done
    assert theirs.stderr.replace(job, "<id>") == gone.stderr.replace(missing, "<id>"), done
    assert "no such job" in theirs.stderr and theirs_s < gone_s + 5 < 20, done


def _timed_cli(client: Fleet, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = _cli(client, *args)
    return done, time.monotonic() - started


def _running_call(client: Fleet) -> tuple[str, threading.Thread]:
    """A foreground `sleep` of `client`'s owner, running (its `run` waits in a thread)."""
    call_id = new_call_id()
    thread = threading.Thread(target=lambda: client.run("sleep 60", host=HOST,
                                                        call_id=call_id), daemon=True)
    thread.start()
    wait_for(lambda: client.call_progress(call_id).state == "running", 30, "the call to run")
    return call_id, thread


def _queued_call(client: Fleet) -> str:
    """A call of `client`'s owner waiting in a queue no worker serves (as `run` records
    and pushes one): cancelling it withdraws it from the queue."""
    call_id = new_call_id()
    queue = names.pool_queue(f"nobody-{uuid.uuid4().hex[:6]}")
    assert client._on_redis(sync_records.send_call, call_id, queue, None, "{}",
                            require_alive=False,
                            owner_tag=client._identity.call_tag(call_id)) == "ok"
    return call_id


def test_cancel_and_detach_of_anothers_call_are_told_as_no_such_call(
    alice: Fleet, bob: Fleet, operator: Fleet, host: WorkerProcess, bobs_redis: redis.Redis
) -> None:
    """A call id was a bearer token: bob, knowing alice's queued call's id, withdrew it
    (`cancel` said True). Now another owner's call, queued or running, is answered as an
    id no call has, word for word; the fleet key's client (the operator's) acts on all."""
    missing = _missing_id()
    with pytest.raises(UnknownCall) as nothing:
        bob.cancel(missing)
    expected = _said(nothing.value, missing)
    queued = _queued_call(alice)
    # The id alone reaches the call's record with the clients' credentials: what a
    # cancel by id used to act on.
    assert bobs_redis.hget(names.call_key(queued), "state") == "queued"
    for act in (bob.cancel, bob.detach):
        with pytest.raises(UnknownCall) as theirs:
            act(queued)
        assert _said(theirs.value, queued) == expected
    assert alice.call_progress(queued).state == "queued"  # untouched
    assert alice.cancel(queued)  # its owner withdraws it
    call_id, thread = _running_call(alice)
    try:
        for act in (bob.cancel, bob.detach):
            with pytest.raises(UnknownCall) as theirs:
                act(call_id)
            assert _said(theirs.value, call_id) == expected
        # bob forges the record's owner (his credentials write call records): the host
        # goes by the owner it sealed there when it claimed the call, not by the name.
        key = names.call_key(call_id)
        kept = [str(value) for value in bobs_redis.hmget(key, ["owner", "owner_tag"])]
        assert kept[0] == "alice"
        bobs_redis.hset(key, mapping={"owner": "bob",
                                      "owner_tag": bob._identity.call_tag(call_id)})
        for act in (bob.cancel, bob.detach):
            with pytest.raises(UnknownCall) as forged:
                act(call_id)
            assert _said(forged.value, call_id) == expected
        assert alice.call_progress(call_id).state == "running"
        bobs_redis.hset(key, mapping=dict(zip(("owner", "owner_tag"), kept, strict=True)))
        assert operator.cancel(call_id)  # the fleet key: the operator's, acts on all
        thread.join(30)
        assert not thread.is_alive()
    finally:
        with contextlib.suppress(BashfleetError):
            alice.cancel(call_id)


def _events_until(client: Fleet, since: str, stop_job: str) -> list[str]:
    """The job ids of the `started` events `client` hears after `since`, up to `stop_job`'s."""
    seen: list[str] = []
    for event in client.events(since=since, kinds=("started",)):
        seen.append(event.job_id)
        if event.job_id == stop_job:
            return seen
    raise AssertionError("the events ended")


def test_events_show_an_owner_its_own_and_the_admin_all(
    alice: Fleet, bob: Fleet, admin: Fleet, alice_has: AliceHas
) -> None:
    # bob's job starts after alice's, both tagged alike: a listener that reaches bob's
    # has passed alice's.
    later = bob.run("sleep 300", host=HOST, mode="background", tags={"t": "owners"})
    assert later.job is not None
    try:
        assert alice_has.job in _events_until(alice, alice_has.seq, alice_has.job)
        everyone = _events_until(admin, alice_has.seq, later.job.id)
        assert alice_has.job in everyone  # the admin hears both
        bobs = _events_until(bob, alice_has.seq, later.job.id)
        assert alice_has.job not in bobs and bobs[-1] == later.job.id
        # The CLI, as a process, with bob's key and the clients' Redis user: the first
        # event tagged t=owners it shows is bob's, never alice's earlier one.
        shown = _cli(bob, "events", "--since", alice_has.seq, "--kind", "started",
                     "--count", "1", "--json", "--tag", "t=owners")
        assert shown.returncode == 0, shown
        assert json.loads(shown.stdout)["job_id"] == later.job.id
        assert alice_has.secret not in shown.stdout
    finally:
        bob.kill(later.job.id)


def test_sessions_of_the_same_name_are_apart(
    alice: Fleet, bob: Fleet, alice_has: AliceHas, bobs_redis: redis.Redis
) -> None:
    mine = bob.run("pwd; echo \"[$ALICE_VAR]\"", host=HOST, session=alice_has.session)
    assert mine.exit_code == 0 and alice_has.secret not in mine.stdout, mine
    assert mine.stdout.splitlines()[0] != "/tmp" and "[]" in mine.stdout
    again = alice.run('pwd; echo "$ALICE_VAR"', host=HOST, session=alice_has.session)
    assert again.stdout.splitlines() == ["/tmp", alice_has.secret]  # hers, untouched
    # Her shell is in Redis under her space, locked: bob can neither name nor read it.
    key = names.shell_key(alice_has.session, ALICE.space)
    stored = cast("str | None", bobs_redis.get(key))
    assert stored is not None and alice_has.secret not in stored
    assert alice_has.secret in auth.unlock(auth.keyring([ALICE.secret]), auth.SHELL,
                                           alice_has.session, stored)
    with pytest.raises(auth.AuthError):
        auth.unlock(auth.keyring([BOB.secret, BOB.reader]), auth.SHELL, alice_has.session,
                    stored)
    assert bobs_redis.get(names.shell_key(alice_has.session)) is None  # no shared name


# --------------------------------------------------- Redis with the clients' user


def _refused(call: Any, *args: Any) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        call(*args)


def test_redis_as_the_client_user_cannot_read_forge_or_drop_what_others_have(
    alice: Fleet, alice_has: AliceHas, bobs_redis: redis.Redis, workers_redis: redis.Redis
) -> None:
    r = bobs_redis
    bob_keys = auth.keyring([BOB.secret, BOB.reader])
    fleet_keys = auth.keyring([FLEET_KEY])
    # No listing of keys, channels, clients.
    _refused(r.keys, "bashfleet:*")
    _refused(r.scan, 0)
    _refused(r.execute_command, "PUBSUB", "CHANNELS")
    _refused(r.execute_command, "CLIENT", "LIST")
    _refused(r.zrange, names.jobs_key(HOST), 0, -1)  # the host's every job id
    _refused(r.smembers, names.running_key(HOST))
    assert r.scard(names.running_key(HOST)) >= 0  # counted, never listed
    # alice's job record: stored (the workers read it whole), her command locked.
    job = r.hgetall(names.job_key(alice_has.job))
    assert job and job["host"] == HOST
    assert alice_has.secret in auth.unlock(fleet_keys, auth.JOB, alice_has.job, str(job["record"]))
    assert not any(alice_has.secret in value for value in job.values())
    with pytest.raises(auth.AuthError):
        auth.unlock(bob_keys, auth.JOB, alice_has.job, str(job["record"]))
    # Neither forged nor dropped (the workers' user can: the command is not the refusal).
    _refused(r.hset, names.job_key(alice_has.job), "state", "ended")
    _refused(r.delete, names.job_key(alice_has.job))
    _refused(r.expire, names.job_key(alice_has.job), 1)
    assert workers_redis.hget(names.job_key(alice_has.job), "state") == "running"
    assert workers_redis.expire(names.job_key(alice_has.job), names.JOB_TTL_S)  # a worker may
    # Her workspace's view, her events, her answer: read, never opened.
    view = cast("str | None", r.get(names.workspace_key(alice_has.workspace.id)))
    assert view is not None and "alice" in auth.unlock(
        fleet_keys, "workspace", alice_has.workspace.id, view)
    assert '"alice"' not in view
    with pytest.raises(auth.AuthError):
        auth.unlock(bob_keys, "workspace", alice_has.workspace.id, view)
    _refused(r.set, names.workspace_key(alice_has.workspace.id), "x")
    _refused(r.delete, names.workspace_key(alice_has.workspace.id))
    entries = cast("list[tuple[str, dict[str, str]]]",
                   r.xrange(names.EVENTS_KEY, alice_has.seq, "+"))
    hers = [fields["e"] for _, fields in entries if alice_has.job in _opened(fields["e"])]
    assert hers, "alice's events are in the stream"
    assert not any(alice_has.secret in fields["e"] for _, fields in entries)
    for text in hers:
        with pytest.raises(auth.AuthError):
            auth.unlock(bob_keys, auth.EVENT, EVENT_NAME, text)
    _refused(r.xadd, names.EVENTS_KEY, {"e": "forged"})
    _refused(r.publish, names.EVENTS_CHANNEL, "1-0\nforged")
    _refused(r.execute_command, "PSUBSCRIBE", "bashfleet:replies:*")
    reply = sync_records.stored_reply(r, alice_has.call)
    if reply is not None:  # kept REPLY_TTL_S
        assert alice_has.secret not in reply
        with pytest.raises(auth.AuthError):
            auth.unlock(bob_keys, auth.REPLY, alice_has.call, reply)
    # Her quotas and job index are under her space: her name finds nothing.
    assert r.zrange(names.quota_key("workspaces", "alice"), 0, -1) == []
    assert r.zrange(names.owner_jobs_key(HOST, "alice"), 0, -1) == []
    assert alice_has.job in r.zrange(names.owner_jobs_key(HOST, ALICE.space), 0, -1)
    _refused(r.zrem, names.quota_key("workspaces", ALICE.space), alice_has.workspace.id)
    _refused(r.get, names.nonce_key("x"))
    _refused(r.hset, names.host_key(HOST), "concurrency", "999")
    # The queues: a client pushes and counts, never reads, takes or drops.
    queue = exec_queue(HOST)
    r.llen(queue)
    _refused(r.lrange, queue, 0, -1)
    assert isinstance(workers_redis.lrange(queue, 0, -1), list)  # a worker reads it
    _refused(r.lpop, queue)
    _refused(r.delete, queue)
    _refused(r.ltrim, queue, 0, 0)
    assert alice.check(alice_has.job).running


def _opened(text: str) -> str:
    with contextlib.suppress(auth.AuthError):
        return auth.unlock(auth.keyring([FLEET_KEY]), auth.EVENT, EVENT_NAME, text)
    return ""


# ------------------------------------------------------------------------ the CLI


def _cli(client: Fleet, *args: str, key: OwnerKey = BOB) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BASHFLEET_")}
    env.update(BASHFLEET_REDIS_URL=client._raw_url, BASHFLEET_OWNER_KEY=key.text,
               BASHFLEET_STATE_DIR=os.environ["BASHFLEET_STATE_DIR"])
    return subprocess.run([sys.executable, "-m", "bashfleet.client.cli", *args], env=env, text=True,
                          capture_output=True, timeout=60, check=False)


def test_the_cli_with_an_owner_key_shows_and_reaches_its_own_only(
    alice: Fleet, bob: Fleet, alice_has: AliceHas
) -> None:
    # alice's CLI lists her job and workspace (the listing works: its absence below
    # is not a broken listing).
    listed = json.loads(_cli(alice, "ps", "--json", key=ALICE).stdout)
    assert alice_has.job in {job["id"] for job in listed}
    shown = _cli(alice, "workspace", "ls", key=ALICE)
    assert alice_has.workspace.id in shown.stdout, shown
    # bob's CLI: none of it.
    listed = json.loads(_cli(bob, "ps", "--json").stdout)
    assert alice_has.job not in {job["id"] for job in listed}
    assert alice_has.workspace.id not in _cli(bob, "workspace", "ls").stdout
    for verb in ("check", "kill", "output"):
        done = _cli(bob, verb, alice_has.job)
        assert done.returncode != 0 and alice_has.secret not in done.stdout, done
    gone = _cli(bob, "workspace", "rm", alice_has.workspace.id)
    assert gone.returncode != 0, gone
    assert alice.check(alice_has.job).running
    assert alice_has.workspace.id in {view.id for view in alice.workspaces()}
    ran = _cli(bob, "run", "--host", HOST, "--session", alice_has.session,
               'echo "[$ALICE_VAR]"')
    assert ran.returncode == 0 and "[]" in ran.stdout, ran


# ------------------------------------------------------------------------------ MCP


def test_an_mcp_server_holds_its_owners_key_only(
    alice: Fleet, bob: Fleet, users: Users, bobs_redis: redis.Redis
) -> None:
    """An MCP server given alice's key (and no fleet key) runs its session as a sub-owner
    of alice: its jobs are its own (another session's tools and bob cannot reach them),
    alice lists its workspaces, and nothing it stores is readable by bob."""
    session = f"mcp-{uuid.uuid4().hex[:10]}"
    owner = session_owner(session, "alice")
    assert owner == f"alice::session:{session}"
    with _env(BASHFLEET_OWNER_KEY=ALICE.text, BASHFLEET_SIGNING_KEY=None):
        backend = FleetBackend(users.client_url, owner=owner, started_by="alice")
        server = ToolServer(NativeDialect(), backend, session, host=HOST)
        try:
            answer = server.call("bash", {"command": "sleep 300", "mode": "background"})
            assert not answer.is_error, answer.text
            runner, _ = backend.connect()
            fleet = runner.fleet  # type: ignore[attr-defined]
            assert fleet.owner == owner and fleet._identity.owner_key
            [job] = [view for view in fleet.jobs(HOST) if view.command == "sleep 300"]
            assert job.owner == owner
            with pytest.raises(UnknownJob):
                bob.check(job.id)
            with pytest.raises(UnknownJob):
                alice.check(job.id)  # another owner to the fleet: its session's own
            assert {view.owner for view in alice.agent_workspaces()} >= {owner}
            stored = cast("str | None", bobs_redis.get(names.session_state_key(
                session, ALICE.space)))
            assert stored is not None
            with pytest.raises(auth.AuthError):
                auth.unlock(auth.keyring([BOB.secret]), auth.SESSION_STATE, session, stored)
            fleet.kill(job.id)
        finally:
            server.delete_workspaces()
            backend.reset()
