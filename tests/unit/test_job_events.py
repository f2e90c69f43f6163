"""Job events: published once per transition (fakeredis runs the script), parsed back,
filtered; the native dialect's note on jobs that ended; tag validation."""

from __future__ import annotations

import time
from typing import Any

import fakeredis
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from bashfleet.client._core.events import (
    EventCursor,
    job_matches,
    parse_entry,
    parse_published,
    seq_key,
)
from bashfleet.client.dialects.base import SessionState
from bashfleet.client.dialects.native import NativeDialect
from bashfleet.client.dialects.testing import FakeRunner
from bashfleet.client.records import job_views
from bashfleet.worker.fleet import registry
from bashfleet.worker.wire import auth, names
from bashfleet.worker.wire.events import JobEvent, ended_event, event_matches, started_event
from bashfleet.worker.wire.models import JobHandle, JobRecord, JobStatus, JobView, RunRequest


def _record(job_id: str = "j1", tags: dict[str, str] | None = None) -> JobRecord:
    return JobRecord(
        id=job_id, host="h1", pid=10, pgid=10, start_time=1.0, marker=job_id,
        command="make test", cwd="/src", output_path=f"/jobs/{job_id}.log",
        status_path=f"/jobs/{job_id}.status.json", started_at=1000.0, call_id="c1",
        tags=tags or {},
    )


KEYS = ("k" * 32,)
RING = auth.keyring(KEYS)


def _save(client: Any, record: JobRecord, **state: Any) -> str | None:
    return registry.save_job(client, record, keys=KEYS, **state)


@pytest.fixture
def client() -> Any:
    return fakeredis.FakeRedis(decode_responses=True)


def _events(client: Any) -> list[JobEvent]:
    entries = client.xrange(names.EVENTS_KEY, "-", "+")
    return [event for event in (parse_entry(i, f, RING) for i, f in entries) if event is not None]


def test_one_event_per_transition(client: Any) -> None:
    record = _record(tags={"agent": "a17"})
    assert _save(client, record, running=True) is not None
    assert _save(client, record, running=True) is None  # republished: no event
    first = _save(client, record, running=False, exit_code=3, ended_at=1041.5)
    assert first is not None
    # A check and the host's watcher both see the end: one event between them.
    assert _save(client, record, running=False, exit_code=3, ended_at=1041.5) is None
    started, ended = _events(client)
    assert (started.kind, ended.kind) == ("started", "ended")
    assert started.tags == ended.tags == {"agent": "a17"}
    assert (ended.exit_code, ended.duration_s, ended.at) == (3, 41.5, 1041.5)
    assert ended.seq == first and seq_key(ended.seq) > seq_key(started.seq)
    assert client.ttl(names.EVENTS_KEY) > 0


def test_published_and_stored_events_read_the_same(client: Any) -> None:
    pubsub = client.pubsub()
    pubsub.subscribe(names.EVENTS_CHANNEL)
    pubsub.get_message(timeout=1)  # the subscription
    _save(client, _record(), running=True)
    message = pubsub.get_message(timeout=1)
    assert message is not None
    assert parse_published(message["data"], RING) == _events(client)[0]


def test_cursor_skips_what_it_delivered() -> None:
    cursor = EventCursor("5-0", started_at=0.0, keys=RING)
    event = JobEvent(kind="started", job_id="j", host="h", at=1.0, command="c",
                     output_path="/o", seq="5-1")
    assert cursor.admit(event)
    assert not cursor.admit(event)  # heard twice (catch-up, then the channel)
    assert not cursor.admit(event.model_copy(update={"seq": "4-9"}))
    assert cursor.last == "5-1"


@given(st.lists(st.tuples(st.integers(0, 2**48), st.integers(0, 2**20)), min_size=1))
def test_seq_order_is_numeric(pairs: list[tuple[int, int]]) -> None:
    texts = [f"{ms}-{n}" for ms, n in pairs]
    assert sorted(texts, key=seq_key) == [f"{ms}-{n}" for ms, n in sorted(pairs)]


def test_malformed_entries_are_skipped() -> None:
    assert parse_entry("1-0", {"e": "not json"}, RING) is None
    assert parse_entry("1-0", {}, RING) is None
    assert parse_published("no newline", RING) is None


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({}, True),
        ({"host": "h1"}, True),
        ({"host": "h2"}, False),
        ({"kinds": ("ended",)}, False),
        ({"kinds": ("started", "ended")}, True),
        ({"tags": {"agent": "a17"}}, True),
        ({"tags": {"agent": "a17", "team": "x"}}, False),
        ({"job_id": "j1"}, True),
        ({"job_id": "j2"}, False),
    ],
)
def test_event_filters(filters: dict[str, Any], expected: bool) -> None:
    event = started_event(_record(tags={"agent": "a17"}))
    assert event_matches(event, **filters) is expected


def test_ended_event_without_status_says_so() -> None:
    event = ended_event(_record(), None)
    assert event.exit_code is None and event.note == "exit status unknown"
    status = JobStatus(signal=9, ended_at=1002.0)
    assert ended_event(_record(), status).model_dump(include={"signal", "duration_s"}) == {
        "signal": 9, "duration_s": 2.0,
    }


@pytest.mark.parametrize(
    "tags",
    [{"": "x"}, {"a b": "x"}, {"a=b": "x"}, {"k": "two\nlines"}, {"k": "x" * 257},
     {f"k{i}": "v" for i in range(17)}],
)
def test_bad_tags_are_refused(tags: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        RunRequest(command="true", tags=tags)


def test_job_views_and_tag_filter(client: Any) -> None:
    _save(client, _record("j1", {"agent": "a1"}), running=True)
    _save(client, _record("j2", {"agent": "a2"}), running=False, exit_code=0,
                      ended_at=1001.0)
    views = job_views(client, ["j1", "j2", "j-unknown"], keys=RING)
    assert sorted(views) == ["j1", "j2"]
    assert views["j1"].state == "unknown"  # host h1 holds no lock: not known to run
    assert views["j2"].state == "ended"
    assert [job_matches(v, tags={"agent": "a2"}) for v in views.values()] == [False, True]
    assert not job_matches(views["j2"], owner="someone")  # no owner recorded


# ------------------------------------------------------------------ the native note


class ViewingRunner(FakeRunner):
    """A fake runner that also knows how jobs are doing."""

    def __init__(self) -> None:
        super().__init__()
        self.views: dict[str, JobView] = {}

    def job_views(self, ids: list[str]) -> dict[str, JobView]:
        return {i: self.views[i] for i in ids if i in self.views}


def _view(job_id: str, *, ended: bool, exit_code: int | None = None) -> JobView:
    return JobView(
        id=job_id, host="b", pid=1, pgid=1, command="npm test", cwd="/", started_at=100.0,
        output_path=f"/jobs/{job_id}.log", state="ended" if ended else "running",
        running=not ended, exit_code=exit_code, ended_at=141.2 if ended else None,
    )


def test_native_tells_once_which_jobs_ended() -> None:
    runner = ViewingRunner()
    session = SessionState()
    session.remember(JobHandle(id="j9", host="b", pid=1, pgid=1, output_path="/jobs/j9.log"),
                     "npm test")
    dialect = NativeDialect(clock=time.time)
    runner.views["j9"] = _view("j9", ended=False)
    first = dialect.call("bash", {"command": "true"}, runner, session)
    assert "ended since your last call" not in first.text
    runner.views["j9"] = _view("j9", ended=True, exit_code=4)
    second = dialect.call("bash", {"command": "true"}, runner, session)
    assert second.text.endswith(
        "background jobs that ended since your last call:\n"
        "  job j9 (npm test): exited with code 4 after 41.2s; output: /jobs/j9.log on host b "
        "(bash_check id=j9 reads it)"
    )
    third = dialect.call("bash", {"command": "true"}, runner, session)
    assert "ended since your last call" not in third.text


def test_native_says_nothing_without_a_viewer() -> None:
    session = SessionState()
    session.remember(JobHandle(id="j9", host="b", pid=1, pgid=1, output_path="/o"), "x")
    text = NativeDialect().call("bash", {"command": "true"}, FakeRunner(), session)
    assert "ended since" not in text.text
