"""The client's core (`bashfleet.client._core`), pure: routing, owner lookups, messages and answers,
the judgement of results, the watch's notes, job-event admission, whole output. Table
tests, and hypothesis where a rule must hold for any input."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bashfleet.client import local
from bashfleet.client._core import records as core_records
from bashfleet.client._core.constants import RETRY_DELAYS_S, WATCH_INTERVAL_S, backoff
from bashfleet.client._core.events import EventCursor
from bashfleet.client._core.identity import Identity, record_keys_at, resolve_identity
from bashfleet.client._core.messages import (
    NOT_RUN_KINDS,
    build_call,
    control_message,
    decode_control,
    decode_result,
    exec_message,
    raise_if_not_run,
    unstarted_result,
)
from bashfleet.client._core.output import FullRead, full_reads, with_full_output
from bashfleet.client._core.routing import (
    IdLookup,
    Placement,
    Route,
    call_record_of,
    checked_call_id,
    job_target,
    output_host,
    route,
)
from bashfleet.client._core.sending import HostsSeenAlive, control_verdict
from bashfleet.client._core.watch import (
    Outage,
    Pending,
    due,
    message_task_id,
    note_queue,
)
from bashfleet.client.errors import (
    CallNotRun,
    CallRejected,
    HostUnavailable,
    OutputTooLarge,
    Unauthorized,
    UnknownCall,
    UnknownJob,
    WorkerError,
    WorkerLost,
)
from bashfleet.worker.settings import get_settings
from bashfleet.worker.wire import auth, names
from bashfleet.worker.wire import records as wire_records
from bashfleet.worker.wire.control import CheckRequest
from bashfleet.worker.wire.events import JobEvent, seal_event
from bashfleet.worker.wire.messages import task_message
from bashfleet.worker.wire.models import (
    SYSTEM_ERROR_KINDS,
    CallResult,
    CheckResult,
    HostInfo,
    JobRecord,
    RunRequest,
    Spill,
    SystemError_,
    TruncationInfo,
)

# ---------------------------------------------------------------------------- routing


def _info(host: str, *labels: str, alive: bool = True) -> HostInfo:
    return HostInfo(host=host, alive=alive, labels=labels)


@pytest.mark.parametrize(
    ("placement", "live", "infos", "expected"),
    [
        (Placement(host="b"), [], [], Route("bashfleet.b.exec", "b")),  # checked when sent
        (Placement(), ["a"], [], Route(names.ANY_EXEC_QUEUE, None)),
        (Placement(), [], [], HostUnavailable),
        (Placement(label="gpu"), ["a", "b"], [_info("a"), _info("b", "gpu")],
         Route("bashfleet.pool.gpu.exec", None, "gpu")),
        (Placement(label="gpu"), ["a"], [_info("a")], HostUnavailable),
        (Placement(label="gpu"), [], [_info("b", "gpu", alive=False)], HostUnavailable),
        (Placement(host="../etc"), [], [], CallRejected),
        (Placement(label="gpu.big"), ["a"], [], CallRejected),
    ],
)
def test_route(placement: Placement, live: list[str], infos: list[HostInfo],
               expected: Route | type[Exception]) -> None:
    if isinstance(expected, Route):
        assert route(placement, live, infos) == expected
    else:
        with pytest.raises(expected):
            route(placement, live, infos)


@pytest.mark.parametrize(
    ("found", "expected"),
    [
        (IdLookup(job_host="h1"), ("h1", "j1")),  # a job id
        (IdLookup(call={"job_id": "j9", "host": "h2"}, call_job_host="h2"), ("h2", "j9")),
        (IdLookup(call={"host": "h2"}), UnknownJob),  # a call that started no job
        (IdLookup(call={"job_id": "j9"}), UnknownJob),  # its job's record expired
        (IdLookup(), UnknownJob),
    ],
)
def test_job_target(found: IdLookup, expected: tuple[str, str] | type[Exception]) -> None:
    if isinstance(expected, tuple):
        assert job_target("j1", found) == expected
    else:
        with pytest.raises(expected):
            job_target("j1", found)


def test_output_host_is_the_jobs_else_the_calls() -> None:
    assert output_host("x", IdLookup(job_host="h1", call={"host": "h2"})) == "h1"
    assert output_host("x", IdLookup(call={"host": "h2"})) == "h2"
    with pytest.raises(UnknownJob):
        output_host("x", IdLookup(call={"host": ""}))


def test_unknown_calls_are_a_call_level_error() -> None:
    with pytest.raises(UnknownCall) as bad:
        checked_call_id("../x")
    assert not isinstance(bad.value, UnknownJob)
    with pytest.raises(UnknownCall) as gone:
        call_record_of("c1", {})
    assert gone.value.id == "c1" and "no such call: c1" in gone.value.message
    assert call_record_of("c1", {"host": "h"}) == {"host": "h"}


# --------------------------------------------------------------------------- messages

KEY = "k" * 32
SIGNED = Identity(owner="agent:a", signing_key=KEY, admin=False, shell_key=KEY,
                  verifying_keys=(KEY,))


def _sealed(task_id: str, payload: str, key: str | None = KEY) -> str:
    return auth.lock([key] if key else [], auth.REPLY, task_id, payload)


ADMIN_KEY = "a" * 32
UNSIGNED = Identity(owner="agent:a", signing_key=None, admin=False, shell_key=None)


def _envelope(message: str) -> dict[str, Any]:
    """The signed envelope a task message carries (its first argument)."""
    body = json.loads(base64.b64decode(json.loads(message)["body"]))
    envelope = body[0][0]
    assert isinstance(envelope, dict)
    return envelope


def test_every_signed_message_names_the_queue_it_is_pushed_on() -> None:
    call = build_call(RunRequest(command="true"), SIGNED.owner)
    sent = exec_message(SIGNED, call, "bashfleet.h1.exec", "r")
    envelope = _envelope(sent)
    assert envelope["target"] == "bashfleet.h1.exec"
    assert json.loads(sent)["properties"]["delivery_info"]["routing_key"] == envelope["target"]
    verified = auth.verify(envelope, names.Task.EXEC, SIGNED.reply_keys(), now=0.0)
    auth.check_target(verified.target, "bashfleet.h1.exec", {"bashfleet.h1.exec"})
    with pytest.raises(auth.AuthError) as moved:  # pushed onto another host's queue
        auth.check_target(verified.target, "bashfleet.h2.exec", {"bashfleet.h2.exec"})
    assert moved.value.reason == "wrong_target"
    control = _envelope(control_message(SIGNED, CheckRequest(id="j1"), task_id="t1",
                                        host="h1", reply_to="r", timeout=30.0))
    assert control["target"] == names.ctl_queue("h1")


def test_record_keys_are_the_fleets_and_an_admins() -> None:
    admin = Identity(owner="o", signing_key=ADMIN_KEY, admin=True, shell_key=KEY,
                     verifying_keys=(KEY, ADMIN_KEY))
    assert admin.record_keys() == auth.keyring([KEY, ADMIN_KEY])
    assert SIGNED.record_keys() == auth.keyring([KEY])
    assert UNSIGNED.record_keys() == {}


def test_a_control_message_asks_as_its_owner_and_expires() -> None:
    message = json.loads(control_message(
        SIGNED, CheckRequest(id="j1"), task_id="t1", host="h1", reply_to="r", timeout=30.0,
    ))
    assert message["headers"]["expires"] is not None
    assert message["properties"]["delivery_info"]["routing_key"] == "bashfleet.h1.ctl"
    assert message["headers"]["argsrepr"] == "'j1'"


@pytest.mark.parametrize(
    ("kind", "error"),
    [("not_found", UnknownJob), ("invalid", CallRejected), ("unauthorized", Unauthorized),
     ("unavailable", HostUnavailable), ("worker_lost", WorkerLost), ("internal", WorkerError)],
)
def test_a_control_error_is_its_typed_exception(kind: str, error: type[Exception]) -> None:
    answer = json.dumps({"error": {"kind": kind, "message": "m"}})
    with pytest.raises(error):
        decode_control(SIGNED.reply_keys(), "t1", "h1", _sealed("t1", answer), CheckResult)


def test_a_control_answer_decodes_to_its_model() -> None:
    answer = json.dumps({"ok": {"id": "j1", "host": "h1", "running": True}})
    checked = decode_control(SIGNED.reply_keys(), "t1", "h1", _sealed("t1", answer),
                             CheckResult)
    assert (checked.id, checked.running) == ("j1", True)


def test_a_forged_answer_is_never_trusted() -> None:
    forged = _sealed("c1", CallResult(call_id="c1", host="h", exit_code=0).model_dump_json(),
                     key="x" * 32)
    with pytest.raises(Unauthorized):
        decode_result(SIGNED.reply_keys(), "c1", forged)
    with pytest.raises(Unauthorized):  # nor one meant for another task
        decode_result(SIGNED.reply_keys(), "c2", _sealed("c1", "{}"))


def _failed(kind: str, message: str = "m", **fields: Any) -> CallResult:
    return CallResult(call_id="c1", host="h1", error=SystemError_(kind=kind, message=message),
                      **fields)


@pytest.mark.parametrize("kind", sorted(SYSTEM_ERROR_KINDS))
def test_only_a_call_that_did_not_run_raises(kind: str) -> None:
    result = _failed(kind)
    if kind not in NOT_RUN_KINDS:
        assert raise_if_not_run(result) is result
        return
    with pytest.raises(CallNotRun) as caught:
        raise_if_not_run(result)
    assert (caught.value.kind, caught.value.result) == (kind, result)
    assert caught.value.message == "call c1 did not run: m"


def test_ran_calls_never_raise() -> None:
    for result in (CallResult(call_id="c", host="h", exit_code=3),
                   CallResult(call_id="c", host="h", signal=9, timed_out=True)):
        assert raise_if_not_run(result) is result


def test_a_cancel_and_a_lost_worker_are_kinds_of_their_own() -> None:
    """Workers answer a cancel as `cancelled` and a call they killed as they were stopped
    as `worker_lost`: kinds of their own, never recognised by their words."""
    from bashfleet.worker.fleet import tasks  # noqa: PLC0415 - the worker's side of the wire

    assert tasks._refusal("c1", "cancelled")[0] == "cancelled"
    assert tasks._END_NOTES["cancelling"][0] == "cancelled"
    assert tasks._END_NOTES["stopping"][0] == "worker_lost"
    # The client reads a kind as sent: the message is for a person.
    for kind in ("cancelled", "worker_lost"):
        text = json.dumps({"call_id": "c1", "host": "h",
                           "error": {"kind": kind, "message": "anything at all"}})
        result = decode_result({}, "c1", auth.seal(None, auth.REPLY, "c1", text))
        assert result.error is not None and result.error.kind == kind


def test_an_unknown_kind_reads_as_internal() -> None:
    text = json.dumps({"call_id": "c1", "host": "h", "error": {"kind": "new", "message": "m"}})
    result = decode_result({}, "c1", auth.seal(None, auth.REPLY, "c1", text))
    assert result.error is not None and result.error.kind == "internal"


@pytest.mark.parametrize(("state", "kind"), [("cancelled", "cancelled"),
                                             ("abandoned", "unavailable")])
def test_a_call_withdrawn_before_it_started(state: str, kind: str) -> None:
    result = unstarted_result("c1", "h1", state)
    assert result.error is not None and result.error.kind == kind
    assert result.exit_code is None and "did not run" in result.error.message


def test_an_owner_must_be_a_valid_name() -> None:
    with pytest.raises(CallRejected, match="invalid owner"):
        resolve_identity("redis://127.0.0.1:1/0", "no spaces allowed", admin=False)


def test_a_local_fleets_record_keys_are_found_at_its_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bashfleet up` after `down` makes a fleet with new keys at a new address: a
    listener that follows it verifies its events with those, and only at that address."""
    monkeypatch.delenv("BASHFLEET_SIGNING_KEY", raising=False)
    monkeypatch.delenv("BASHFLEET_ADMIN_KEY", raising=False)
    monkeypatch.setenv("BASHFLEET_STATE_DIR", str(tmp_path / "state"))
    get_settings.cache_clear()  # the local fleet is found through the cached settings
    try:
        url = "redis://127.0.0.1:7001/0"
        local.save_state(local.FleetState(redis_url=url, redis_owned=True, signing_key=KEY,
                                          admin_key=ADMIN_KEY), get_settings())
        assert record_keys_at(url, admin=False) == auth.keyring([KEY])
        assert record_keys_at(url, admin=True) == auth.keyring([KEY, ADMIN_KEY])
        assert record_keys_at("redis://127.0.0.1:7002/0", admin=True) == {}
        assert resolve_identity(url, None, admin=True).record_keys() == \
            record_keys_at(url, admin=True)
    finally:
        get_settings.cache_clear()


# ------------------------------------------------------------------------------ watch


@given(task_id=st.from_regex(r"[A-Za-z0-9_.-]{1,64}", fullmatch=True),
       command=st.text(max_size=200))
def test_the_scan_finds_any_message_by_its_id(task_id: str, command: str) -> None:
    message = task_message(names.Task.EXEC, [{"command": command, "call_id": task_id}],
                           task_id=task_id, queue="q", reply_to="r", argsrepr=repr(command))
    assert message_task_id(message) == task_id


@pytest.mark.parametrize("text", ["", "not json", '{"headers": {}}', '"id": "'])
def test_what_is_not_a_message_has_no_id(text: str) -> None:
    assert message_task_id(text) is None


def test_note_queue() -> None:
    pending = Pending("c1", Route("q", "h1"))
    note_queue(pending, {"c1"}, now=10.0)
    assert pending.missing_since is None
    note_queue(pending, set(), now=11.0)
    note_queue(pending, set(), now=12.0)
    assert pending.missing_since == 11.0  # since first seen gone
    note_queue(pending, None, now=13.0)  # too long to scan: it waits its turn
    assert pending.missing_since is None


def test_an_outage_is_tolerated_for_its_grace() -> None:
    outage = Outage(grace_s=30.0)
    assert not outage.outlasted(100.0)
    assert not outage.outlasted(129.0)
    assert outage.outlasted(130.0)
    outage.ended()
    assert not outage.outlasted(200.0)
    assert Outage(grace_s=0.0).outlasted(5.0)  # a single Redis: said at once


@pytest.mark.parametrize(
    ("token", "now", "expected"),
    [("t1", 5.0, None), (None, 5.0, WorkerLost), ("t2", 5.0, WorkerLost),
     ("t1", 31.0, WorkerError)],
)
def test_control_verdict(token: str | None, now: float, expected: type[Exception] | None) -> None:
    found = control_verdict("h1", "t1", token, now=now, deadline=30.0, timeout=30.0)
    assert (None if found is None else type(found)) is expected


@given(st.integers(min_value=0, max_value=1000))
def test_backoff_repeats_its_last_delay(attempt: int) -> None:
    assert backoff(RETRY_DELAYS_S, attempt) == RETRY_DELAYS_S[min(attempt, 4)]


# ----------------------------------------------------------------------------- events


def _event(job_id: str, kind: str, seq: str, at: float = 1000.0) -> JobEvent:
    return JobEvent.model_validate({"kind": kind, "job_id": job_id, "host": "h", "at": at,
                                    "command": "c", "output_path": "/o", "seq": seq})


RING = auth.keyring([KEY])


def _entry(event: JobEvent, key: str = KEY) -> tuple[str, dict[str, str]]:
    """A stream entry as a worker with `key` adds it."""
    return event.seq, {"e": seal_event([key], event)}


def test_a_redis_restart_replays_nothing_it_showed_nor_the_past() -> None:
    """`bashfleet events` across a Redis restart that lost its data: the workers publish
    their jobs again (new stream ids); the listener shows only what is new."""
    cursor = EventCursor("100-0", started_at=1000.0, keys=RING)
    assert cursor.connected("run-1", now=1000.0, keys=RING) is False
    assert cursor.admit(_event("j1", "started", "101-0", at=1001.0))
    cursor.heard_from_redis(1050.0)
    # Redis restarts empty, as another instance.
    assert cursor.connected("run-2", now=1060.0, keys=RING) is True
    replayed = [
        _event("j1", "started", "200-0", at=1001.0),  # shown before
        _event("j0", "started", "200-1", at=900.0),  # started before the listener
        _event("j0", "ended", "200-2", at=950.0),  # ... and ended before it too
    ]
    assert [cursor.admit(e) for e in replayed] == [False, False, False]
    # What happened during the outage, or after, is news.
    assert cursor.admit(_event("j1", "ended", "200-3", at=1055.0))
    assert cursor.admit(_event("j2", "started", "200-4", at=1061.0))
    assert not cursor.admit(_event("j1", "ended", "200-5", at=1055.0))  # never twice


def test_without_a_restart_an_old_stamp_is_still_news() -> None:
    # An end found late (its status unknown: stamped at the job's start) is news while
    # Redis is the same instance.
    cursor = EventCursor("100-0", started_at=1000.0, keys=RING)
    cursor.connected("run-1", now=1000.0, keys=RING)
    assert cursor.connected("run-1", now=1010.0, keys=RING) is False  # same instance
    assert cursor.admit(_event("j0", "ended", "101-0", at=10.0))


def test_malformed_entries_move_the_cursor() -> None:
    cursor = EventCursor("100-0", started_at=0.0, keys=RING)
    good = _event("j1", "started", "102-0")
    found = cursor.take_entries([("101-0", {"e": "junk"}), _entry(good)])
    assert [e.job_id for e in found] == ["j1"] and cursor.last == "102-0"
    assert cursor.catch_up_start() == "(102-0"


def _forgeries(event: JobEvent) -> list[str]:
    """What a Redis writer without the key can add: the bare JSON, an "unsealed" mark,
    a seal by its own key, a locked event whose ciphertext was changed."""
    body = event.model_dump_json()
    sealed = seal_event([KEY], event.model_copy(update={"exit_code": 3}))
    head, _, locked = sealed.partition("\n")
    return [body, f"-:-\n{body}", seal_event(["attacker-" + "1" * 24], event),
            f"{head}\n{locked[:-8]}AAAAAAAA"]


def test_forged_events_are_never_delivered() -> None:
    cursor = EventCursor("100-0", started_at=0.0, keys=RING)
    ended = _event("j1", "ended", "105-0").model_copy(update={"exit_code": 0})
    entries = [(f"101-{i}", {"e": text}) for i, text in enumerate(_forgeries(ended))]
    assert cursor.take_entries(entries) == []
    assert cursor.last == "101-3"  # passed over, never to be read again
    published = {"type": "message", "data": names.event_message("102-0", _forgeries(ended)[2])}
    assert cursor.take_message(published) is None
    assert [e.job_id for e in cursor.take_entries([_entry(ended)])] == ["j1"]


def test_a_listener_verifies_with_the_keys_of_the_fleet_it_hears() -> None:
    """A local fleet brought down and up seals with its new key: the listener that follows
    it to its new address verifies with that key, and no longer with the old one."""
    new_key = "n" * 32
    cursor = EventCursor("0-0", started_at=0.0, keys=RING)
    cursor.connected("run-1", now=0.0, keys=RING)
    cursor.connected("run-2", now=10.0, keys=auth.keyring([new_key]))
    old, new = _event("j1", "started", "20-0", at=20.0), _event("j2", "started", "21-0", at=21.0)
    assert cursor.take_entries([_entry(old, KEY)]) == []
    assert [e.job_id for e in cursor.take_entries([_entry(new, new_key)])] == ["j2"]


_EVENTS = st.lists(
    st.tuples(st.sampled_from(["j1", "j2", "j3"]), st.sampled_from(["started", "ended"]),
              st.integers(0, 50), st.integers(0, 3), st.booleans()),
    max_size=40,
)


@given(_EVENTS)
def test_admitted_events_are_once_and_in_order(raw: list[tuple[str, str, int, int, bool]]) -> None:
    cursor = EventCursor("0-0", started_at=0.0, keys=RING)
    cursor.connected("run-1", now=0.0, keys=RING)
    delivered: list[JobEvent] = []
    for job_id, kind, millis, count, restart in raw:
        if restart:
            cursor.connected(f"run-{millis}", now=float(millis), keys=RING)
        event = _event(job_id, kind, f"{millis}-{count}", at=float(millis))
        if cursor.admit(event):
            delivered.append(event)
    keys = [(int(e.seq.split("-")[0]), int(e.seq.split("-")[1])) for e in delivered]
    assert keys == sorted(set(keys))  # in stream order, each once
    for job_id in ("j1", "j2", "j3"):
        kinds = [e.kind for e in delivered if e.job_id == job_id]
        assert kinds in ([], ["started"], ["ended"], ["started", "ended"])


# ------------------------------------------------------------------------ whole output


def _cut(total_bytes: int, lines: int = 100) -> TruncationInfo:
    return TruncationInfo(direction="tail", truncated=True, limit="lines", total_lines=lines,
                          total_bytes=total_bytes, shown_lines=10, shown_bytes=100,
                          shown_ranges=((91, 100),))


def _kept(**fields: Any) -> CallResult:
    base: dict[str, Any] = {
        "call_id": "c1", "host": "h1", "exit_code": 0, "stdout": "tail\n",
        "stdout_truncation": _cut(5000),
        "spill": Spill(host="h1", stdout_path="/s/c1.out", stdout_bytes=5000),
        "error_digest": ("error: x",),
    }
    return CallResult(**{**base, **fields})


@pytest.mark.parametrize(
    ("result", "max_bytes", "expected"),
    [
        (_kept(), 10_000, [FullRead("stdout", 5000)]),
        (_kept(stdout_truncation=None), 10_000, []),  # nothing was cut
        (_kept(backgrounded=True), 10_000, []),  # a job's output is still being written
        (_kept(), 4999, OutputTooLarge),
        (_kept(spill=None), 10_000, WorkerError),
        (_kept(spill=Spill(host="h1", error="disk full")), 10_000, WorkerError),
    ],
)
def test_full_reads(result: CallResult, max_bytes: int,
                    expected: list[FullRead] | type[Exception]) -> None:
    if isinstance(expected, list):
        assert full_reads(result, max_bytes) == expected
        return
    with pytest.raises(expected) as caught:
        full_reads(result, max_bytes)
    if isinstance(caught.value, OutputTooLarge):
        assert (caught.value.size, caught.value.limit) == (5000, 4999)
        assert caught.value.result is result and "/s/c1.out" in caught.value.message


def test_the_whole_output_replaces_the_tail() -> None:
    whole = with_full_output(_kept(), {"stdout": "all\n" * 100})
    assert whole.stdout == "all\n" * 100
    info = whole.stdout_truncation
    assert info is not None and not info.truncated
    assert (info.shown_lines, info.shown_bytes, info.shown_ranges) == (100, 5000, ((1, 100),))
    assert whole.error_digest == ()


# ---------------------------------------------------------------------------- records


def _host(host: str, key: str = KEY, **fields: str) -> dict[str, str]:
    """A host record as its worker (holding `key`) writes it: sealed."""
    record = {"host": host, "instance": "t1", "concurrency": "4", "labels": "gpu", **fields}
    return {**record, wire_records.SEAL: wire_records.host_seal([key], host, record)}


def test_host_listing_entries_read_from_one_pipeline() -> None:
    answers = [_host("a"), "t1", 3, 7,  # two calls and the busy set's sentinel
               {}, None, 0, 0]  # a host without a record is left out
    infos = core_records.host_infos(["a", "b"], answers, RING)
    assert [(i.host, i.alive, i.slots, i.busy, i.queued, i.labels) for i in infos] == [
        ("a", True, 4, 2, 7, ("gpu",))]
    assert [command for command, _ in core_records.host_reads("a")] == [
        "hgetall", "get", "scard", "llen"]


@pytest.mark.parametrize(
    "record",
    [
        {"host": "a", "instance": "t1", "concurrency": "4"},  # no seal: a Redis writer's
        {**_host("a"), "concurrency": "512"},  # a real record changed
        _host("a", key="attacker-" + "1" * 24),  # sealed with another key
        _host("b"),  # another host's record copied here
    ],
)
def test_a_host_record_that_does_not_verify_is_left_out(record: dict[str, str]) -> None:
    answers = [record, "t1", 0, 0, _host("c"), "t1", 0, 0]
    assert [i.host for i in core_records.host_infos(["a", "c"], answers, RING)] == ["c"]


def _job_hash(job_id: str, key: str = KEY, **fields: str) -> dict[str, str]:
    """A job's hash as its worker (holding `key`) writes it: sealed."""
    record = JobRecord(id=job_id, host="h1", pid=10, pgid=10, start_time=1.0, marker=job_id,
                       command="make", cwd="/src", output_path=f"/jobs/{job_id}.log",
                       status_path=f"/jobs/{job_id}.status.json", started_at=1000.0,
                       call_id="c1")
    stored = {"record": wire_records.lock_record([key], record), "host": "h1",
              "state": "running", **fields}
    return {**stored, wire_records.SEAL: wire_records.job_seal([key], job_id, stored)}


def test_a_job_listing_names_the_expired_ids() -> None:
    listing = core_records.job_listing(["j1", "j2"], [{}, {}], host_alive=True, keys=RING)
    assert (listing.views, listing.expired) == ([], ["j1", "j2"])


def test_a_forged_job_is_left_out_of_listings_never_believed() -> None:
    forged = {**_job_hash("j2"), "state": "ended", "exit_code": "0"}  # one HSET, no key
    hashes = [_job_hash("j1"), forged, _job_hash("j3", key="attacker-" + "1" * 24)]
    listing = core_records.job_listing(["j1", "j2", "j3"], hashes, host_alive=True, keys=RING)
    assert [v.id for v in listing.views] == ["j1"]
    assert listing.expired == []  # left out, not pruned: its worker seals it again
    views = core_records.job_views(["j1", "j2", "j3"], hashes, {"h1": "t1"}, RING)
    assert list(views) == ["j1"] and views["j1"].state == "running"
    # A dead host's running job shows `unknown`, verified all the same.
    assert core_records.job_views(["j1"], hashes[:1], {}, RING)["j1"].state == "unknown"


@pytest.mark.parametrize(("apart", "in_record", "answer"), [
    ("a1", None, "a1"),        # kept apart (a call that started a job, a control reply)
    (None, "r1", "r1"),        # kept in the call's record
    ("a1", "r1", "r1"),        # both: the record's, written with the call's end
    (None, None, None),        # not answered yet
])
def test_a_watch_snapshot_is_laid_out_as_read(
    apart: str | None, in_record: str | None, answer: str | None
) -> None:
    snapshot = core_records.watch_snapshot(
        2, ("state", "host"), ["h1"],
        [apart, None, ["done", "h1", in_record], [None, None, None], "t"])
    assert snapshot.answers == [answer, None]
    assert snapshot.records == [{"state": "done", "host": "h1"},
                                {"state": None, "host": None}]
    assert snapshot.tokens == {"h1": "t"}


@pytest.mark.parametrize(("events", "host", "now", "fresh"), [
    ([], "a", 10.0, False),                              # never seen: look it up
    ([("saw", "a", 10.0)], "a", 10.5, True),             # seen within the window
    ([("saw", "a", 10.0)], "a", 11.0, False),            # the window is over
    ([("saw", "a", 10.0)], "b", 10.5, False),            # another host
    ([("saw", "a", 10.0), ("lost", "a", 0.0)], "a", 10.1, False),  # its lock found gone
    ([("saw", "a", 10.0), ("saw", "a", 10.8)], "a", 11.5, True),   # seen again
])
def test_a_host_seen_alive_is_not_looked_up_again_within_its_window(
    events: list[tuple[str, str, float]], host: str, now: float, fresh: bool
) -> None:
    seen = HostsSeenAlive(1.0)
    for what, name, at in events:
        if what == "saw":
            seen.saw(name, at)
        else:
            seen.lost(name)
    assert seen.fresh(host, now) is fresh


@pytest.mark.parametrize(("sent_at", "now", "looked_at"), [
    (10.0, 10.0, False),                         # just sent: most are answered sooner
    (10.0, 10.0 + WATCH_INTERVAL_S - 0.01, False),
    (10.0, 10.0 + WATCH_INTERVAL_S, True),       # waited a whole interval
    (None, 0.0, True),                           # sent by another process: at once
])
def test_the_watch_looks_at_a_call_once_it_waited_an_interval(
    sent_at: float | None, now: float, looked_at: bool
) -> None:
    route = Route("q", "h1")
    pending = Pending("c1", route) if sent_at is None else Pending("c1", route, sent_at=sent_at)
    assert due(pending, now) is looked_at
