"""Whose a call is, where a cancel or a detach asks (a call id is no bearer token): the
client's tag of its own calls (`Identity.call_tag`, `owns_call`) and the owner the worker
sealed when it claimed the call (`registry.call_owner`), on fakeredis. The call's record
is its client's to write, so a name there alone proves nothing."""

from __future__ import annotations

from collections.abc import Iterator

import fakeredis
import pytest
import redis

from bashfleet.client._core.identity import Identity
from bashfleet.worker.fleet import registry
from bashfleet.worker.wire import auth, names
from bashfleet.worker.wire.owner_keys import OwnerKey

FLEET = "fleet-key-for-tests"
ALICE, BOB = OwnerKey.issue(FLEET, "alice"), OwnerKey.issue(FLEET, "bob")


def _owner_client(key: OwnerKey, owner: str | None = None) -> Identity:
    return Identity(owner=owner or key.owner, signing_key=key.secret, admin=False,
                    shell_key=key.secret, signing_kid=key.key_id, owner_key=True)


def _fleet_client(owner: str) -> Identity:
    return Identity(owner=owner, signing_key=FLEET, admin=False, shell_key=FLEET)


@pytest.mark.parametrize(("sender", "asker", "owns"), [
    (_owner_client(ALICE), _owner_client(ALICE), True),              # its own call
    (_owner_client(ALICE), _owner_client(BOB), False),               # another owner's
    (_owner_client(ALICE, "alice::s1"), _owner_client(ALICE, "alice::s2"), False),  # session
    (_owner_client(ALICE), _fleet_client("bob"), True),              # the operator: all
    (_fleet_client("x"), _owner_client(BOB), False),
])
def test_a_client_acts_on_the_calls_its_owner_sent(
    sender: Identity, asker: Identity, owns: bool
) -> None:
    record = {"state": "queued", "owner_tag": sender.call_tag("c1")}
    assert asker.owns_call("c1", record) is owns


def test_a_tag_is_bound_to_its_call_and_none_is_nobodys() -> None:
    alice = _owner_client(ALICE)
    assert alice.owns_call("c1", {"owner_tag": alice.call_tag("c1")})
    assert not alice.owns_call("c2", {"owner_tag": alice.call_tag("c1")})
    assert not alice.owns_call("c1", {"state": "queued"})  # no tag (its record was lost)


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = fakeredis.FakeRedis(decode_responses=True)
    yield client
    client.close()


def test_the_owner_a_worker_sealed_is_believed_a_rewritten_one_is_not(r: redis.Redis) -> None:
    keys = auth.keyring([FLEET])
    assert registry.claim_call(r, "c1", "h1", "t1", 42, owner="alice", keys=[FLEET]) == "ok"
    assert registry.call_owner(r, "c1", keys) == "alice"
    # The clients' Redis user writes call records: bob renames the owner.
    r.hset(names.call_key("c1"), "owner", "bob")
    assert registry.call_owner(r, "c1", keys) is None  # unknown to all: never bob's
    r.hset(names.call_key("c1"), "owner", "alice")
    assert registry.call_owner(r, "c1", keys) == "alice"
    assert registry.call_owner(r, "no-such", keys) is None
    # An unsigned fleet (no keys) has nothing to seal with: the record says.
    assert registry.claim_call(r, "c2", "h1", "t1", 42, owner="carol") == "ok"
    assert registry.call_owner(r, "c2", {}) == "carol"
