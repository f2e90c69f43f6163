"""Owners are credentials, not names anyone with the fleet key may claim, as pure logic:
owner keys derived from the fleet key, what a worker takes from one, and the locks that
keep one owner's records from another's eyes. Each refusal is first shown to be an
attack that works with the fleet key (or with no lock), so that it cannot pass for the
wrong reason."""

from __future__ import annotations

import base64
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bashfleet.client._core.identity import _owner_identity
from bashfleet.worker.fleet.verify import check_owner
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire import acl, auth, owner_keys
from bashfleet.worker.wire.owner_keys import Keyring, OwnerKey, SealingKeys

FLEET, OLD, ADMIN = "f" * 64, "o" * 64, "a" * 64
ALICE, BOB = OwnerKey.issue(FLEET, "alice"), OwnerKey.issue(FLEET, "bob")
RING = Keyring([FLEET, ADMIN], [FLEET])
TARGET = "bashfleet.h1.exec"


def _signed(key: str, owner: str, kid: str | None = None) -> dict[str, Any]:
    call = {"call_id": "c1", "command": "cat ~/.ssh/id_rsa", "owner": owner}
    return auth.sign(key, "bashfleet.exec", [call], time.time(), target=TARGET, kid=kid)


def _verify(envelope: dict[str, Any]) -> auth.Verified:
    return auth.verify(envelope, "bashfleet.exec", RING, time.time())


# ------------------------------------------------------------------------------ keys


def test_an_owner_key_round_trips_and_never_shows_its_secret() -> None:
    assert OwnerKey.parse(ALICE.text) == ALICE
    assert ALICE.secret not in repr(ALICE) and ALICE.secret not in str(ALICE)
    dotted = OwnerKey.issue(FLEET, "team.a@corp:ci")
    assert OwnerKey.parse(dotted.text).owner == "team.a@corp:ci"
    assert ALICE.secret != BOB.secret and ALICE.reader == BOB.reader
    assert OwnerKey.issue(OLD, "alice").secret != ALICE.secret


@pytest.mark.parametrize("text", ["", FLEET, "bfo1.x.y.alice", ALICE.text.replace(
    "bfo1", "bfo2"), f"bfo1.{ALICE.secret}.{ALICE.reader}.", ALICE.text + "::s"])
def test_what_is_not_an_owner_key_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not an owner key"):
        OwnerKey.parse(text)


def test_a_worker_derives_an_owner_key_from_the_id_it_names() -> None:
    assert RING[ALICE.key_id] == ALICE.secret
    assert ALICE.key_id in RING and ALICE.key_id.startswith("alice/")
    rotated = Keyring([FLEET, OLD], [FLEET, OLD])
    old_alice = OwnerKey.issue(OLD, "alice")
    assert rotated[old_alice.key_id] == old_alice.secret  # kept while OLD is accepted
    for forged in ("alice/" + "0" * 12, f"bob/{ALICE.key_id.split('/')[1]}",
                   "/" + ALICE.key_id.split("/")[1], old_alice.key_id):
        assert forged not in RING
    assert sorted(RING) == sorted(auth.keyring([FLEET, ADMIN]))  # lists its own keys only


# --------------------------------------------------------------- who a message acts as


def test_the_fleet_key_signs_as_any_owner_which_an_owner_key_cannot() -> None:
    # The attack, with the fleet key every client held: a message for bob, accepted.
    assert check_owner(_verify(_signed(FLEET, "bob"))) is None  # acts as whom it names
    assert _verify(_signed(FLEET, "bob")).args[0]["owner"] == "bob"
    # The same message with alice's key: verified (her key), refused (not her owner).
    forged = _verify(_signed(ALICE.secret, "bob", ALICE.key_id))
    with pytest.raises(auth.AuthError) as refused:
        check_owner(forged)
    assert refused.value.reason == "wrong_owner" and refused.value.kind == "unauthorized"
    assert check_owner(_verify(_signed(ALICE.secret, "alice", ALICE.key_id))) == "alice"
    session = "alice::session:mcp-1"  # a sub-owner: her MCP server's session
    assert check_owner(_verify(_signed(ALICE.secret, session, ALICE.key_id))) == "alice"
    for other in ("alice2", "alic", "bob::alice", ""):
        with pytest.raises(auth.AuthError):
            check_owner(_verify(_signed(ALICE.secret, other, ALICE.key_id)))


def test_an_owner_key_naming_another_owner_does_not_verify() -> None:
    # alice's secret, bob's key id: the worker derives bob's secret, the MAC fails.
    with pytest.raises(auth.AuthError) as refused:
        _verify(_signed(ALICE.secret, "bob", BOB.key_id))
    assert refused.value.reason == "bad_signature"


def test_a_client_with_an_owner_key_is_that_owner_only() -> None:
    identity = _owner_identity(ALICE, "alice")
    assert (identity.owner, identity.admin, identity.owner_key) == ("alice", False, True)
    assert identity.signing_kid == ALICE.key_id and identity.space == ALICE.space
    assert FLEET not in identity.record_keys().values()
    assert _owner_identity(ALICE, "alice::session:x").space == ALICE.space
    with pytest.raises(Exception, match="not 'alice'"):
        _owner_identity(ALICE, "bob")


def test_settings_take_an_owner_key_from_either_variable() -> None:
    assert Settings(owner_key=ALICE.text).client_owner_key() == ALICE
    assert Settings(signing_key=ALICE.text).client_owner_key() == ALICE
    assert Settings(signing_key=FLEET).client_owner_key() is None  # an operator's
    assert Settings(signing_key=ALICE.text).fleet_keys() == ()
    assert Settings(owner_key=ALICE.text).owner_name() == "alice"
    with pytest.raises(ValueError, match="not an owner key"):
        Settings(owner_key=FLEET).client_owner_key()


# ------------------------------------------------------------------------------ locks

SEALING = SealingKeys([FLEET, ADMIN], [FLEET])


def test_an_owners_record_opens_for_its_owner_the_workers_and_the_admin_only() -> None:
    locked = auth.lock(SEALING.for_owner("alice"), auth.JOB, "j1", '{"command": "secret"}')
    assert "secret" not in locked
    # Unlocked (as every record was before): any reader would have read it.
    assert "secret" in auth.lock([], auth.JOB, "j1", '{"command": "secret"}')
    for keys in ([ALICE.secret], [FLEET], [ADMIN], [ALICE.secret, ALICE.reader]):
        assert "secret" in auth.unlock(auth.keyring(keys), auth.JOB, "j1", locked)
    with pytest.raises(auth.AuthError) as refused:
        auth.unlock(auth.keyring([BOB.secret, BOB.reader]), auth.JOB, "j1", locked)
    assert refused.value.reason == "unknown_key"
    with pytest.raises(auth.AuthError):  # under another name or purpose
        auth.unlock(auth.keyring([FLEET]), auth.JOB, "j2", locked)
    with pytest.raises(auth.AuthError):
        auth.unlock(auth.keyring([FLEET]), auth.EVENT, "j1", locked)
    assert auth.lock_readers(locked) == [auth.key_id(k) for k in SEALING.for_owner("alice")]


def test_a_sub_owners_records_open_with_its_owners_key() -> None:
    locked = auth.lock(SEALING.for_owner("alice::session:x"), auth.EVENT, "e", "hi")
    assert auth.unlock(auth.keyring([ALICE.secret]), auth.EVENT, "e", locked) == "hi"


def test_an_owner_who_opens_a_record_cannot_forge_one_the_workers_believe() -> None:
    locked = auth.lock(SEALING.for_owner("alice"), auth.JOB, "j1", "true")
    heads, _, body = locked.partition("\n")
    raw = base64.b64decode(body)
    nonce = raw[:12]
    # alice knows the data key (she opens the record): she encrypts another value with
    # it, and keeps every reader's wrap and MAC as they were.
    data_key = bytes(a ^ b for a, b in zip(
        bytes.fromhex(heads.split(",")[-1].split(":")[2]),
        auth._pad(ALICE.secret, auth.JOB, "j1", nonce), strict=True))
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415

    forged_body = base64.b64encode(nonce + AESGCM(data_key).encrypt(
        nonce, b"false", f"{auth.JOB}\nj1".encode())).decode()
    forged = f"{heads}\n{forged_body}"
    # Without the per-reader MAC the forgery would open with the data key alone:
    assert AESGCM(data_key).decrypt(nonce, base64.b64decode(forged_body)[12:],
                                    f"{auth.JOB}\nj1".encode()) == b"false"
    for keys in ([FLEET], [ADMIN]):
        with pytest.raises(auth.AuthError) as refused:
            auth.unlock(auth.keyring(keys), auth.JOB, "j1", forged)
        assert refused.value.reason == "bad_signature"


def test_spaces_are_per_owner_and_computed_alike_on_both_sides() -> None:
    assert owner_keys.owner_space(FLEET, "alice") == ALICE.space != BOB.space
    assert owner_keys.owner_space(FLEET, "alice::session:x") == ALICE.space
    assert "alice" not in ALICE.space
    assert owner_keys.owner_space(None, "alice") == "alice"  # an unsigned fleet
    assert Settings(signing_key=FLEET).owner_space("bob") == BOB.space


def test_host_records_are_sealed_for_every_owners_reader_key() -> None:
    mark = auth.mark(SEALING.for_readers(), auth.HOST, "h1", "v")
    auth.check_mark(auth.keyring([BOB.secret, BOB.reader]), auth.HOST, "h1", "v", mark)
    with pytest.raises(auth.AuthError):  # a mark without the reader key: not for owners
        auth.check_mark(auth.keyring([BOB.secret, BOB.reader]), auth.HOST, "h1", "v",
                        auth.mark(SEALING, auth.HOST, "h1", "v"))


# -------------------------------------------------------------------------------- acl


def test_the_clients_user_reads_what_workers_write_and_never_writes_it() -> None:
    rules = acl.client_rules()
    for pattern in acl.WORKER_KEYS:
        assert f"%R~{pattern}" in rules and f"~{pattern}" not in rules
    assert "~bashfleet:jobs:*" not in " ".join(rules)  # a host's every job id
    assert not {"+keys", "+scan", "+psubscribe", "+publish", "+lrange", "+pubsub"} & set(rules)
    assert "(~bashfleet.* +lpush +llen)" in rules
    lines = acl.acl_lines("w" * 20, "c" * 20)
    assert lines[0] == "user default off" and "w" * 20 not in "".join(lines)


@given(st.binary(min_size=0, max_size=64).flatmap(
    lambda data: st.tuples(st.just(data), st.binary(min_size=len(data), max_size=len(data)))))
def test_a_wrap_is_the_key_xor_its_pad_byte_by_byte(pair: tuple[bytes, bytes]) -> None:
    data, pad = pair
    assert auth._xor(data, pad) == bytes(a ^ b for a, b in zip(data, pad, strict=True))
    assert auth._xor(auth._xor(data, pad), pad) == data


def test_a_wrap_of_the_wrong_length_does_not_open() -> None:
    with pytest.raises(ValueError, match="wrong length"):
        auth._xor(b"\x01" * 32, b"\x02" * 31)
    locked = auth.lock(SEALING.for_owner("alice"), auth.JOB, "j1", "true")
    head, _, body = locked.partition("\n")
    ring = auth.keyring([ALICE.secret])
    kid, _, wrap = next(part.split(":") for part in head.split(",")
                        if part.split(":")[0] in ring)
    assert auth.unlock(ring, auth.JOB, "j1", locked) == "true"  # the whole wrap opens
    # A wrap one byte short, its MAC made right (by one who holds the key): refused.
    short = f"{kid}:{auth._lock_mac(ring[kid], auth.JOB, 'j1', wrap[:-2], body)}:{wrap[:-2]}"
    with pytest.raises(auth.AuthError, match="does not decrypt"):
        auth.unlock(ring, auth.JOB, "j1", f"{short}\n{body}")
