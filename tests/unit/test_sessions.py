"""RedisSessionStore on fakeredis: round trip, TTLs, fresh and damaged state, merges."""

from __future__ import annotations

import fakeredis
import pytest

from bashfleet.client import sessions
from bashfleet.client.dialects import SessionState, SessionStore
from bashfleet.client.sessions import (
    SESSION_STATE_TTL_S,
    RedisSessionStore,
    merge_states,
    session_state_key,
)
from bashfleet.worker.wire import auth, names
from bashfleet.worker.wire.models import JobHandle

JOB = JobHandle(id="j1", host="h1", pid=41, pgid=41, output_path="/jobs/j1.log")


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(decode_responses=True)


@pytest.fixture
def store(client: fakeredis.FakeRedis) -> RedisSessionStore:
    return RedisSessionStore(client)


def full_state() -> SessionState:
    state = SessionState(cwd="/src", env={"A": "1", "B": "two words"}, host="h1")
    state.remember(JOB, "npm run dev", stderr_path="/jobs/j1.err")
    state.offsets["j1"] = 120
    return state


def test_it_is_a_session_store(store: RedisSessionStore) -> None:
    typed: SessionStore = store  # the dialects' protocol, checked by mypy
    assert typed is store


def test_round_trip(store: RedisSessionStore) -> None:
    state = full_state()
    store.save("s1", state)
    loaded = store.load("s1")
    assert loaded == state
    assert loaded is not state
    assert loaded.pids == {41: "j1"}  # int keys survive JSON


def test_unknown_session_is_fresh(store: RedisSessionStore, client: fakeredis.FakeRedis) -> None:
    assert store.load("never-seen") == SessionState()
    assert client.keys("*") == []  # loading writes nothing


def test_key_is_under_the_prefix_and_apart_from_the_fleet_pin(
    store: RedisSessionStore, client: fakeredis.FakeRedis
) -> None:
    store.save("s1", SessionState(host="h1"))
    assert client.keys("*") == ["bashfleet:session-state:s1"]
    assert session_state_key("s1").startswith(names.PREFIX)
    assert session_state_key("s1") != names.shell_key("s1")


def test_every_save_sets_and_refreshes_the_ttl(
    store: RedisSessionStore, client: fakeredis.FakeRedis
) -> None:
    assert SESSION_STATE_TTL_S == 24 * 3600
    store.save("s1", SessionState())
    assert 0 < store.ttl("s1") <= SESSION_STATE_TTL_S
    client.expire(session_state_key("s1"), 5)
    store.save("s1", SessionState(cwd="/w"))
    assert store.ttl("s1") > SESSION_STATE_TTL_S - 5
    client.expire(session_state_key("s1"), 5)
    store.commit("s1", SessionState(), SessionState(cwd="/x"))
    assert store.ttl("s1") > SESSION_STATE_TTL_S - 5


def test_custom_ttl(client: fakeredis.FakeRedis) -> None:
    store = RedisSessionStore(client, ttl_s=60)
    store.save("s1", SessionState())
    assert 0 < store.ttl("s1") <= 60


def test_expired_session_is_fresh(store: RedisSessionStore, client: fakeredis.FakeRedis) -> None:
    store.save("s1", full_state())
    client.delete(session_state_key("s1"))  # what the TTL does
    assert store.load("s1") == SessionState()
    assert store.ttl("s1") == -2


def test_a_new_store_sees_the_session(client: fakeredis.FakeRedis) -> None:
    """A restarted client (a new store on the same Redis) resumes the session."""
    RedisSessionStore(client).save("s1", full_state())
    assert RedisSessionStore(client).load("s1") == full_state()


def test_damaged_state_starts_afresh(
    store: RedisSessionStore, client: fakeredis.FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    damaged = auth.seal(None, auth.SESSION_STATE, "s1", '{"cwd": 5, "unknown": true}')
    client.set(session_state_key("s1"), damaged)
    assert store.load("s1") == SessionState()
    client.set(session_state_key("s2"), auth.seal(None, auth.SESSION_STATE, "s2", "not json"))
    assert store.load("s2") == SessionState()
    assert "unreadable state" in caplog.text


@pytest.mark.parametrize("bad", ["", "a b", "x" * 65, "../etc", "s:1"])
def test_invalid_session_ids_are_refused(store: RedisSessionStore, bad: str) -> None:
    for action in (
        lambda: store.load(bad),
        lambda: store.save(bad, SessionState()),
        lambda: store.commit(bad, SessionState(), SessionState()),
    ):
        with pytest.raises(ValueError, match="invalid session id"):
            action()


def test_delete(store: RedisSessionStore) -> None:
    store.save("s1", full_state())
    store.delete("s1")
    assert store.load("s1") == SessionState()


# ------------------------------------------------------------------------------ merge


def test_merge_keeps_what_each_side_changed() -> None:
    base = full_state()
    mine = base.model_copy(deep=True)
    mine.env["C"] = "3"  # this call exported C...
    del mine.env["A"]  # ...and unset A
    mine.cwd = "/src/web"
    theirs = base.model_copy(deep=True)
    theirs.offsets["j1"] = 500  # meanwhile a check read more output
    theirs.env["B"] = "changed"  # and another call changed B
    theirs.remember(JobHandle(id="j2", host="h1", pid=42, pgid=42, output_path="/o"), "x")
    merged = merge_states(base, mine, theirs)
    assert merged.env == {"B": "changed", "C": "3"}
    assert merged.cwd == "/src/web"
    assert merged.offsets == {"j1": 500}
    assert set(merged.jobs) == {"j1", "j2"}
    assert merged.pids == {41: "j1", 42: "j2"}
    assert merged.host == "h1"


def test_merge_my_change_wins_a_conflict() -> None:
    base = SessionState(env={"A": "0"}, host=None)
    mine = SessionState(env={"A": "mine"}, host="h1")
    theirs = SessionState(env={"A": "theirs"}, host="h2")
    assert merge_states(base, mine, theirs) == SessionState(env={"A": "mine"}, host="h1")


def test_merge_without_changes_is_theirs() -> None:
    base = full_state()
    theirs = SessionState(cwd="/elsewhere")
    assert merge_states(base, base.model_copy(deep=True), theirs) == theirs


def test_commit_merges_onto_the_stored_state(store: RedisSessionStore) -> None:
    base = full_state()
    store.save("s1", base)
    # Two calls loaded the same state; both commit what they changed.
    first = base.model_copy(deep=True)
    first.offsets["j1"] = 300
    second = base.model_copy(deep=True)
    second.env["NEW"] = "1"
    store.commit("s1", base, first)
    merged = store.commit("s1", base, second)
    assert merged == store.load("s1")
    assert merged.offsets["j1"] == 300
    assert merged.env["NEW"] == "1"


def test_commit_onto_a_missing_session_stores_the_changes(store: RedisSessionStore) -> None:
    mine = SessionState(host="h9", cwd="/w")
    store.commit("s1", SessionState(), mine)
    assert store.load("s1") == mine


def test_commit_starts_over_when_another_client_saved_meanwhile(
    store: RedisSessionStore, client: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = SessionState()
    store.save("s1", base)
    real_merge = sessions.merge_states
    merges: list[SessionState] = []

    def racing_merge(b: SessionState, m: SessionState, t: SessionState) -> SessionState:
        merges.append(t)
        if len(merges) == 1:  # another process saves between our read and our write
            RedisSessionStore(client).save("s1", SessionState(env={"OTHER": "1"}))
        return real_merge(b, m, t)

    monkeypatch.setattr(sessions, "merge_states", racing_merge)
    merged = store.commit("s1", base, SessionState(cwd="/mine"))
    assert len(merges) == 2
    assert merged == SessionState(cwd="/mine", env={"OTHER": "1"}) == store.load("s1")


KEY = "session-test-key-" + "7" * 20


def test_a_sealed_state_round_trips_and_a_forged_one_is_refused(
    client: fakeredis.FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    keyed = RedisSessionStore(client, key=KEY)
    keyed.save("s1", SessionState(cwd="/repo", env={"A": "1"}))
    assert keyed.load("s1") == SessionState(cwd="/repo", env={"A": "1"})
    # A Redis writer without the key: its state (unsealed, sealed with another key, or
    # ours moved to another session) is never used; the session starts afresh.
    evil = '{"env": {"PATH": "/tmp/evil"}}'
    for forged in (
        evil,
        auth.seal(None, auth.SESSION_STATE, "s1", evil),
        auth.seal("another-key-" + "1" * 20, auth.SESSION_STATE, "s1", evil),
    ):
        client.set(session_state_key("s1"), forged)
        assert keyed.load("s1") == SessionState()
    keyed.save("s2", SessionState(cwd="/elsewhere"))
    moved = client.get(session_state_key("s2"))
    assert isinstance(moved, str)
    client.set(session_state_key("s1"), moved)
    assert keyed.load("s1") == SessionState()
    assert caplog.text.count("starting afresh") == 4
