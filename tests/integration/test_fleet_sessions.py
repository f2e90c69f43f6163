"""Sessions that live in Redis, whoever calls; a running call that goes on as a job; a
cancelled call that says so, through real workers."""

from __future__ import annotations

import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from bashfleet.client import Fleet, records, shells
from bashfleet.client.dialects import ClaudeDialect, ToolText
from bashfleet.client.errors import CallRejected
from bashfleet.client.mcp_server import StaticBackend, ToolServer
from bashfleet.client.redis_server import RedisServer
from bashfleet.client.sessions import RedisSessionStore, ShellStore
from bashfleet.worker.wire import names
from bashfleet.worker.wire.models import CallResult

from .conftest import WorkerProcess, wait_for

Hosts = tuple[WorkerProcess, WorkerProcess]


def new_session() -> str:
    return f"py-{uuid.uuid4().hex[:10]}"


def test_a_session_is_shared_by_every_client(
    two_hosts: Hosts, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """Two clients (two processes or machines, as far as Redis can tell) share one shell:
    its host, its workspace, its cwd, its variables."""
    session = new_session()
    with Fleet(redis_server.url) as one, Fleet(redis_server.url) as other:
        first = one.run("mkdir sub; cd sub; pwd; export SHARED=yes; unset HOME",
                        session=session)
        assert first.exit_code == 0
        sub = first.stdout.strip()
        second = other.run('pwd; echo "$SHARED ${HOME-nohome}"', session=session)
        [workspace] = [view for view in other.workspaces() if view.session == session]
    assert second.stdout == f"{sub}\nyes nohome\n"
    assert second.host == first.host == workspace.host  # pinned by its first call
    # The session lives in its workspace: the directory made there is the session's cwd.
    assert Path(sub) == Path(workspace.path) / "sub"
    shell = ShellStore(redis_client, key=os.environ["BASHFLEET_SIGNING_KEY"]).load(session)
    assert (shell.host, shell.cwd, shell.env, shell.unset_env) == (
        first.host, sub, {"SHARED": "yes"}, ("HOME",)
    )
    assert 0 < redis_client.ttl(names.shell_key(session)) <= names.SESSION_TTL_S


def test_concurrent_calls_of_a_session_keep_every_change(
    two_hosts: Hosts, fleet: Fleet
) -> None:
    """A slower call that finished later used to overwrite a quick `cd`."""
    session = new_session()
    # Pin it (and its cwd: its workspace), and make the directory the `cd` goes to.
    pinned = fleet.run("mkdir there; pwd", session=session)
    target = Path(pinned.stdout.strip()) / "there"
    commands = [f"cd {target}"] + [f"sleep 0.{n}; export V{n}={n}" for n in range(1, 6)]
    with ThreadPoolExecutor(len(commands)) as pool:
        results = list(pool.map(lambda c: fleet.run(c, session=session), commands))
    assert all(r.exit_code == 0 for r in results)
    after = fleet.run("pwd; echo $V1$V2$V3$V4$V5", session=session)
    assert after.stdout == f"{target}\n12345\n"


def test_a_session_never_carries_what_makes_bash_run_code(
    two_hosts: Hosts, fleet: Fleet
) -> None:
    """Variables the worker refuses in `Call.env` are dropped, so they never break (or
    steer) the session's next call (the hook is in the session's workspace, where that
    call would run it)."""
    session = new_session()
    fleet.run("echo 'echo hooked' > hook.sh; "
              "export BASH_ENV=$PWD/hook.sh LD_PRELOAD=/nope.so PROMPT_COMMAND=x KEPT=1",
              session=session)
    after = fleet.run('echo "${BASH_ENV-none} ${LD_PRELOAD-none} $KEPT"', session=session)
    assert (after.exit_code, after.stdout) == (0, "none none 1\n")


def test_a_bad_session_id_is_refused(fleet: Fleet) -> None:
    with pytest.raises(CallRejected, match="invalid session id"):
        fleet.run("true", session="no spaces")


def _in_thread(
    fleet: Fleet, command: str, call_id: str
) -> tuple[threading.Thread, list[CallResult]]:
    """Run a call in a thread (as the CLI does); its thread and where its result lands."""
    results: list[CallResult] = []
    thread = threading.Thread(target=lambda: results.append(fleet.run(command, call_id=call_id)))
    thread.start()
    return thread, results


def _running(client: redis.Redis, call_id: str) -> bool:
    """True once the call runs and its process is recorded (it has run 50 ms)."""
    record = records.call_record(client, call_id)
    return record.get("state") == "running" and bool(record.get("pid"))


def test_a_running_call_goes_on_as_a_job(
    two_hosts: Hosts, fleet: Fleet, redis_client: redis.Redis
) -> None:
    """`Fleet.detach`: what a person's second Ctrl-C asks for."""
    call_id = f"cdetach{uuid.uuid4().hex[:8]}"
    thread, results = _in_thread(fleet, "echo before; sleep 0.3; echo after; sleep 30", call_id)
    wait_for(lambda: _running(redis_client, call_id), 20, "the call to run")
    assert fleet.detach(call_id) is True
    thread.join(20)
    [result] = results
    assert result.backgrounded and result.job is not None and not result.timed_out
    job = result.job
    wait_for(lambda: "after" in fleet.check(job.id, offset=0).output, 20, "the job's output")
    assert fleet.kill(job.id).running is False
    assert fleet.detach(call_id) is False  # not a running call any more


def test_a_cancelled_call_says_so(
    two_hosts: Hosts, fleet: Fleet, redis_client: redis.Redis
) -> None:
    call_id = f"ccancel{uuid.uuid4().hex[:8]}"
    thread, results = _in_thread(fleet, "echo begun; sleep 30", call_id)
    wait_for(lambda: _running(redis_client, call_id), 20, "the call to run")
    started = time.monotonic()
    assert fleet.cancel(call_id) is True
    thread.join(20)
    [result] = results
    assert result.cancelled and result.stdout == "begun\n"
    assert result.error is not None and result.error.kind == "cancelled"
    assert time.monotonic() - started < 10


# ------------------------------------------- an agent session over a fleet session


def _claude_server(fleet: Fleet, client: redis.Redis, session: str) -> ToolServer:
    """An MCP server's claude session on host alpha (its calls run in the fleet session
    of the same name, which keeps their cwd and variables); `client` decodes replies."""
    store = RedisSessionStore(client, key=os.environ["BASHFLEET_SIGNING_KEY"])
    return ToolServer(ClaudeDialect(), StaticBackend(fleet, store), session, host="alpha")


def test_an_agent_session_whose_state_was_lost_finds_its_workspace_again(
    two_hosts: Hosts, fleet: Fleet, redis_client: redis.Redis
) -> None:
    """The agent's own state (which names its workspace) lost, or refused as forged: the
    session's next call runs in the workspace its fleet session lives in, on its host,
    and finds what the earlier calls left there (it was SessionPinned, or CallRejected
    for a new workspace, on every call from then on)."""
    client = redis_client
    session = f"agent-{uuid.uuid4().hex[:8]}"
    server = _claude_server(fleet, client, session)
    assert not server.call("Bash", {"command": "echo kept > note.txt"}).is_error
    for _ in range(3):  # a host is picked anew for a session without state: any of two
        client.delete(names.session_state_key(session))
        again = server.call("Bash", {"command": "cat note.txt"})
        assert again == ToolText("kept"), again
    [workspace] = [view for view in fleet.workspaces() if view.session == session]
    assert workspace.host == "alpha"


def test_an_agent_sessions_ended_workspace_is_made_again(
    two_hosts: Hosts, fleet: Fleet, redis_client: redis.Redis
) -> None:
    """An MCP session's workspace ended (deleted here; expired unused in life): the next
    call runs in a new one and says so, and the calls after it run there (each was
    CallRejected: the fleet session had moved to a new workspace the agent's state did
    not name)."""
    client = redis_client
    session = f"agent-{uuid.uuid4().hex[:8]}"
    server = _claude_server(fleet, client, session)
    assert server.call("Bash", {"command": "export KEPT=1; echo first"}) == ToolText("first")
    [old] = [view for view in fleet.workspaces() if view.session == session]
    assert fleet.open_workspace(old.id).delete()
    moved = server.call("Bash", {"command": "echo $KEPT > here.txt; echo second"})
    assert not moved.is_error and moved.text.endswith("second"), moved
    assert "workspace had ended" in moved.text
    after = server.call("Bash", {"command": "cat here.txt"})
    assert after == ToolText("1"), after
    [new] = [view for view in fleet.workspaces() if view.session == session]
    assert new.id != old.id


# ------------------------------------------------------- a session's workspace, ended


def test_a_sessions_ended_workspace_is_replaced_for_a_call_with_its_own_id(
    two_hosts: Hosts, fleet: Fleet
) -> None:
    """A session whose workspace ended (deleted here, expired unused in life): its next
    call runs in a new one and says so, under the id its caller gave it (the CLI names
    every call, to cancel it on Ctrl-C): it was refused, "call id ... is already in use"
    (the first attempt, refused for the ended workspace, held the id)."""
    session = new_session()
    fleet.run("echo one > note.txt", session=session)
    [old] = [view for view in fleet.workspaces() if view.session == session]
    assert fleet.open_workspace(old.id).delete()
    call_id = f"cnamed{uuid.uuid4().hex[:10]}"
    again = fleet.run("ls; echo two", session=session, call_id=call_id)
    assert (again.call_id, again.exit_code, again.stdout) == (call_id, 0, "two\n")
    assert again.stderr.startswith(shells.NEW_WORKSPACE_NOTICE), again.stderr
    [new] = [view for view in fleet.workspaces() if view.session == session]
    assert new.id != old.id


def test_another_owners_call_in_a_session_is_refused_and_leaves_it_alone(
    two_hosts: Hosts, redis_server: RedisServer
) -> None:
    """A session lives in a workspace of its owner (an MCP session's: `session:<id>`); a
    client of another owner naming the session is refused, saying so, and the session
    keeps its workspace (its call used to be taken for one whose workspace had ended: it
    made one of its own and moved the session's shell there, so the owner's next call
    ran without its files, or an agent's was refused)."""
    session = new_session()
    with Fleet(redis_server.url, owner=f"tenant-{uuid.uuid4().hex[:6]}") as owner, \
            Fleet(redis_server.url, owner=f"intruder-{uuid.uuid4().hex[:6]}") as other:
        owner.run("echo mine > note.txt", session=session)
        for call_id in (None, f"cother{uuid.uuid4().hex[:10]}"):
            with pytest.raises(CallRejected, match="another owner"):
                other.run("cat note.txt", session=session, call_id=call_id)
        assert owner.run("cat note.txt", session=session).stdout == "mine\n"
        assert not [view for view in other.workspaces() if view.session == session]
