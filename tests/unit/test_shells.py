"""Shell sessions: how a session fills a call, what a call changes, and the store that
lays changes onto the shared shell (fakeredis), concurrent commits included."""

from __future__ import annotations

import threading

import fakeredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bashfleet.client.errors import CallRejected, SessionPinned
from bashfleet.client.sessions import ShellStore
from bashfleet.client.shells import (
    ShellChange,
    ShellState,
    apply_change,
    carryable,
    change_of,
    fill_request,
    session_cwd,
    workspace_gone,
)
from bashfleet.worker.wire import names
from bashfleet.worker.wire.models import CallResult, RunRequest, SystemError_


def ran(**fields: object) -> CallResult:
    fields.setdefault("exit_code", 0)
    return CallResult(call_id="c1", host="h1", **fields)


# ------------------------------------------------------------------------ fill_request


@pytest.mark.parametrize(
    ("request_fields", "expected"),
    [
        # The shell fills what the request leaves open.
        ({}, {"host": "h1", "cwd": "/w", "env": {"A": "1"}, "unset_env": ("LANG",),
              "capture_state": True}),
        # What the request says wins (its host is the pinned one: another is an error).
        ({"host": "h1", "cwd": "/x", "env": {"A": "2", "LANG": "C"}},
         {"host": "h1", "cwd": "/x", "env": {"A": "2", "LANG": "C"}, "unset_env": (),
          "capture_state": True}),
        # A label chooses a pool: the pin does not apply.
        ({"label": "gpu"}, {"host": None, "cwd": "/w"}),
        # A background job reports no final state.
        ({"mode": "background"}, {"capture_state": False, "host": "h1"}),
        ({"unset_env": ("TZ", "LANG")}, {"unset_env": ("LANG", "TZ")}),
        # A relative cwd is the session's cwd's subdirectory, as `cd` has it.
        ({"cwd": "tmp"}, {"cwd": "/w/tmp"}),
        ({"cwd": "../x/./y"}, {"cwd": "/x/y"}),
        ({"cwd": "~/src"}, {"cwd": "~/src"}),
    ],
)
def test_fill_request(request_fields: dict[str, object], expected: dict[str, object]) -> None:
    shell = ShellState(host="h1", cwd="/w", env={"A": "1"}, unset_env=("LANG",))
    filled = fill_request(shell, RunRequest(command="ls", session="s1", **request_fields))
    assert {name: getattr(filled, name) for name in expected} == expected
    assert filled.session == "s1" and filled.command == "ls"


@pytest.mark.parametrize(
    ("pinned", "asked", "refused"),
    [
        ("h1", "h2", True),  # the session's cwd and files are on h1
        ("h1", "h1", False),
        ("h1", None, False),  # the pin fills it in
        (None, "h2", False),  # the call pins the session
    ],
)
def test_a_session_runs_only_on_its_pinned_host(
    pinned: str | None, asked: str | None, refused: bool
) -> None:
    shell = ShellState(host=pinned, cwd="/w")
    request = RunRequest(command="ls", session="s2", host=asked)
    if not refused:
        assert fill_request(shell, request).host == (asked or pinned)
        return
    with pytest.raises(SessionPinned) as caught:
        fill_request(shell, request)
    assert isinstance(caught.value, CallRejected)  # nothing was sent
    assert (caught.value.pinned, caught.value.asked, caught.value.session) == ("h1", "h2", "s2")
    assert "session s2 is pinned to host h1" in caught.value.message
    assert "host h2" in caught.value.message


# --------------------------------------------------------------------------- change_of


@pytest.mark.parametrize(
    ("result", "change"),
    [
        (ran(cwd="/w", cwd_after="/w/sub"),
         ShellChange(host="h1", cwd="/w/sub", started_in="/w")),
        # A call that did not change directory changes no cwd; where it started is said
        # (a session with no cwd yet starts there: where it was opened).
        (ran(cwd="/root", cwd_after="/root"), ShellChange(host="h1", started_in="/root")),
        (ran(cwd="/w"), ShellChange(host="h1", started_in="/w")),  # no state (exec, a job)
        (ran(env_changes={"A": "1", "LD_PRELOAD": "/x.so", "BASH_FUNC_f%%": "() { :; }"},
             env_removed=("B", "BASH_ENV")),
         ShellChange(host="h1", env={"A": "1"}, unset_env=("B",))),
        (CallResult(call_id="c1", host="", error=SystemError_(kind="worker_lost", message="x")),
         ShellChange()),
    ],
)
def test_change_of(result: CallResult, change: ShellChange) -> None:
    assert change_of(result) == change


@pytest.mark.parametrize(
    ("name", "carried"),
    [("PATH", True), ("NODE_ENV", True), ("BASH_ENV", False), ("ENV", False),
     ("LD_LIBRARY_PATH", False), ("BASH_FUNC_x%%", False), ("PROMPT_COMMAND", False),
     ("BASHFLEET_REDIS_URL", False), ("", False), ("A=B", False)],
)
def test_carryable(name: str, carried: bool) -> None:
    assert carryable(name) is carried


# ------------------------------------------------------------------------ apply_change


def test_apply_pins_once_and_moves_only_on_the_pinned_host() -> None:
    shell = apply_change(ShellState(), ShellChange(host="h1", cwd="/a"))
    assert shell == ShellState(host="h1", cwd="/a")
    # A call that ran elsewhere (an explicit host) keeps the pin and the cwd, not its env.
    shell = apply_change(shell, ShellChange(host="h2", cwd="/b", env={"X": "1"}))
    assert shell == ShellState(host="h1", cwd="/a", env={"X": "1"})
    # A server's --host moves the pin.
    assert apply_change(shell, ShellChange(host="h2", force_host=True)).host == "h2"


def test_apply_unset_then_export_again() -> None:
    shell = ShellState(env={"A": "1", "B": "2"})
    shell = apply_change(shell, ShellChange(unset_env=("A", "LANG")))
    assert shell == ShellState(env={"B": "2"}, unset_env=("A", "LANG"))
    shell = apply_change(shell, ShellChange(env={"LANG": "C"}))
    assert shell == ShellState(env={"B": "2", "LANG": "C"}, unset_env=("A",))


_names = st.sampled_from(["A", "B", "C", "PATH", "LANG"])
_changes = st.builds(
    ShellChange,
    host=st.none() | st.just("h1"),
    cwd=st.none() | st.sampled_from(["/a", "/b", "/c"]),
    env=st.dictionaries(_names, st.sampled_from(["0", "1"]), max_size=3),
    unset_env=st.lists(_names, max_size=2, unique=True).map(tuple),
)


@settings(max_examples=300)
@given(st.lists(_changes, min_size=1, max_size=8))
def test_a_cd_is_never_lost_and_the_last_word_wins(changes: list[ShellChange]) -> None:
    """Whatever changes land, in order: the cwd is the last `cd`'s; each variable is as
    the last change that named it left it; no name is both set and unset."""
    shell = ShellState()
    for change in changes:
        shell = apply_change(shell, change)
    moves = [c.cwd for c in changes if c.cwd is not None]
    assert shell.cwd == (moves[-1] if moves else None)
    for name in ("A", "B", "C", "PATH", "LANG"):
        last = next((c for c in reversed(changes) if name in c.env or name in c.unset_env), None)
        if last is None:
            assert name not in shell.env and name not in shell.unset_env
        elif name in last.unset_env:
            assert name not in shell.env and name in shell.unset_env
        else:
            assert shell.env[name] == last.env[name] and name not in shell.unset_env


# ----------------------------------------------------------------------------- store


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(decode_responses=True)


def test_store_round_trip_and_ttl(client: fakeredis.FakeRedis) -> None:
    store = ShellStore(client)
    assert store.load("s1") == ShellState()
    assert client.keys("*") == []  # loading writes nothing
    shell = store.commit("s1", ShellChange(host="h1", cwd="/w", env={"A": "1"}))
    assert shell == store.load("s1") == ShellState(host="h1", cwd="/w", env={"A": "1"})
    assert client.keys("*") == [names.shell_key("s1")]
    assert 0 < store.ttl("s1") <= names.SESSION_TTL_S
    store.delete("s1")
    assert store.ttl("s1") == -2


def test_store_refuses_a_bad_id(client: fakeredis.FakeRedis) -> None:
    with pytest.raises(ValueError, match="invalid session id"):
        ShellStore(client).load("a b")


def test_a_damaged_shell_starts_afresh(client: fakeredis.FakeRedis) -> None:
    client.set(names.shell_key("s1"), "not json")
    assert ShellStore(client).load("s1") == ShellState()


def test_concurrent_commits_all_count(client: fakeredis.FakeRedis) -> None:
    """Eight writers at once, each its own variable and one of them a cd: all land."""
    store = ShellStore(client)
    barrier = threading.Barrier(8)

    def commit(n: int) -> None:
        barrier.wait()
        cwd = "/tmp" if n == 3 else None
        ShellStore(client).commit("s1", ShellChange(host="h1", cwd=cwd, env={f"V{n}": str(n)}))

    threads = [threading.Thread(target=commit, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    shell = store.load("s1")
    assert shell.cwd == "/tmp"
    assert shell.env == {f"V{n}": str(n) for n in range(8)}


@pytest.mark.parametrize(
    ("asked", "current", "cwd"),
    [
        (None, "/w", "/w"),
        ("", None, None),
        ("sub", None, "sub"),  # no session cwd yet: the worker joins it to the workspace
        ("sub", "/w", "/w/sub"),
        ("/abs", "/w", "/abs"),
        ("a/../../b", "/w/x", "/w/b"),
    ],
)
def test_session_cwd(asked: str | None, current: str | None, cwd: str | None) -> None:
    assert session_cwd(asked, current) == cwd


def test_a_session_starts_where_its_first_call_ran_until_a_cd_moves_it() -> None:
    first = apply_change(ShellState(), ShellChange(host="h1", started_in="/src/app"))
    assert (first.host, first.cwd) == ("h1", "/src/app")
    later = apply_change(first, ShellChange(host="h1", started_in="/tmp"))  # its own --cwd
    assert later.cwd == "/src/app"
    moved = apply_change(later, ShellChange(host="h1", cwd="/src/app/lib", started_in="/src"))
    assert moved.cwd == "/src/app/lib"


def test_a_sessions_first_workspace_wins_unless_it_ended() -> None:
    made = apply_change(ShellState(), ShellChange(host="h1", workspace="w" + "1" * 15))
    raced = apply_change(made, ShellChange(host="h1", workspace="w" + "2" * 15))
    assert raced.workspace == "w" + "1" * 15
    renewed = apply_change(raced, ShellChange(host="h1", workspace="w" + "3" * 15,
                                              force_workspace=True))
    assert renewed.workspace == "w" + "3" * 15


def test_a_session_call_runs_in_its_workspace_and_no_other() -> None:
    shell = ShellState(host="h1", workspace="w" + "1" * 15)
    filled = fill_request(shell, RunRequest(command="ls", session="s1"))
    assert (filled.host, filled.workspace) == ("h1", "w" + "1" * 15)
    with pytest.raises(CallRejected, match="runs in workspace"):
        fill_request(shell, RunRequest(command="ls", session="s1", workspace="w" + "2" * 15))


@pytest.mark.parametrize(
    ("error", "gone"),
    [
        # What was not found is data: a message that names the workspace is not enough.
        (SystemError_(kind="not_found", message="no such workspace on host a: w1",
                      missing="workspace"), True),
        (SystemError_(kind="not_found", message="no such workspace on host a: w1"), False),
        (SystemError_(kind="not_found", message="no such job: w1"), False),
        (SystemError_(kind="bad_cwd", message="w1", missing="workspace"), False),
        (None, False),
    ],
)
def test_a_gone_workspace_is_known_by_what_was_missing(
    error: SystemError_ | None, gone: bool
) -> None:
    result = CallResult(call_id="c", host="a", error=error)
    assert workspace_gone(result) is gone
