"""Signed calls: an HMAC-SHA256 over the whole message, with an expiry and a nonce.

Anyone who can write to the broker could otherwise run commands on every build
machine. A client signs each task's arguments with a shared key; the worker verifies
before doing anything and refuses unsigned, tampered, expired and replayed messages.

Why HMAC and not Celery's message signing (the `auth` serializer): Celery's signs with
X.509 keys through `cryptography`, checks no expiry and keeps no replay state, and a
bad signature surfaces as a consumer-level error rather than an answer the caller
gets. An HMAC envelope is a few lines we can test fully, gives every refusal a clear
reason in the call's result, and rotates by key id.

Envelope, as sent (JSON):
    {"v": 2, "task": NAME, "target": QUEUE, "args": [...],
     "auth": {"key": KEY_ID, "exp": UNIX_TIME, "nonce": HEX, "mac": HEX}}
The MAC covers the version, task name, target, arguments, key id, expiry and nonce, in
a canonical JSON encoding. The target is the queue the message was sent to
(`bashfleet.<host>.exec`, `bashfleet.<host>.ctl`, `bashfleet.any.exec`,
`bashfleet.pool.<label>.exec`): a worker refuses a message taken from another queue or
meant for another host (`check_target`), so a message captured for host s1 never runs on
s2. Replay protection (each nonce accepted once until its expiry) needs state: each
host remembers the nonces it accepted on its own disk (`bashfleet.worker.fleet.nonces`) and in
Redis (`registry`), not here.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from bashfleet.worker.wire.errors import ToolError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

#: Version 2: the target queue is signed (version 1 named none: refused).
VERSION = 2
#: How long a signed message stays valid: long enough for a queue to drain after a
#: worker restart, short enough that a captured message is soon useless.
DEFAULT_TTL_S = 300.0
#: Tolerated clock difference between client and worker machines.
CLOCK_SKEW_S = 30.0


class AuthError(ToolError):
    """A message the worker must refuse (kind `unauthorized`); `reason` says why:
    unsigned, malformed, bad_version, unknown_key, bad_signature, expired, replayed,
    wrong_target or wrong_owner (an owner key signing for another owner)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__("unauthorized", message)
        self.reason = reason


class Verified(NamedTuple):
    """A message whose signature, key and expiry checked out. A named tuple, as every
    record of the wire a client's CLI loads: `dataclasses` loads `inspect`, which costs
    a plain call more than its round trip."""

    args: list[Any]
    nonce: str
    expires: float
    key_id: str = ""
    """Which key signed it (the worker answers with the same key)."""
    target: str = ""
    """The queue it was sent to, as its sender signed it."""


def key_id(key: str) -> str:
    """A short public name for a key: which key signed a message, without revealing it."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def keyring(keys: Iterable[str]) -> dict[str, str]:
    """Accepted keys by id (the current one and any kept during a rotation)."""
    return {key_id(key): key for key in keys if key}


def _canonical(body: dict[str, Any]) -> bytes:
    """What a message's MAC covers: version, task, target, args, key id, expiry, nonce."""
    return json.dumps(
        {"v": VERSION, **body}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode()


def _mac(key: str, message: bytes) -> str:
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def sign(
    key: str, task: str, args: list[Any], now: float, ttl_s: float = DEFAULT_TTL_S, *,
    target: str, kid: str | None = None,
) -> dict[str, Any]:
    """The signed envelope of a task's arguments, for the queue `target` it is sent to.
    `kid`: the key id the envelope names (default `key_id(key)`; an owner key names its
    owner: `bashfleet.worker.wire.owner_keys`)."""
    kid, expires, nonce = kid or key_id(key), round(now + ttl_s, 3), secrets.token_hex(16)
    mac = _mac(key, _canonical({"task": task, "target": target, "args": args, "key": kid,
                                "exp": expires, "nonce": nonce}))
    return {
        "v": VERSION, "task": task, "target": target, "args": args,
        "auth": {"key": kid, "exp": expires, "nonce": nonce, "mac": mac},
    }


def is_envelope(value: object) -> bool:
    """True when `value` looks like a signed envelope (it may still be forged)."""
    return isinstance(value, dict) and "auth" in value and "args" in value


def verify(
    envelope: object, task: str, keys: Mapping[str, str], now: float
) -> Verified:
    """Check a message for `task`; AuthError (with its kind) when it must be refused."""
    if not isinstance(envelope, dict) or not is_envelope(envelope):
        raise AuthError("unsigned", "unsigned message refused: this worker requires signed calls")
    auth, args, target = envelope.get("auth"), envelope.get("args"), envelope.get("target")
    if not isinstance(auth, dict) or not isinstance(args, list):
        raise AuthError("malformed", "malformed signed message refused")
    if envelope.get("v") != VERSION or not isinstance(target, str):
        raise AuthError("bad_version", f"message of signing version {envelope.get('v')!r} "
                        f"refused: this worker takes version {VERSION}, which names its "
                        "target queue (upgrade the client)")
    kid, expires, nonce, mac = (auth.get(k) for k in ("key", "exp", "nonce", "mac"))
    if not (isinstance(kid, str) and isinstance(nonce, str) and isinstance(mac, str)
            and isinstance(expires, int | float)):
        raise AuthError("malformed", "malformed signature refused")
    key = keys.get(kid)
    if key is None:
        raise AuthError("unknown_key", f"message signed with an unknown key ({kid}) refused")
    expected = _mac(key, _canonical({"task": task, "target": target, "args": args, "key": kid,
                                     "exp": float(expires), "nonce": nonce}))
    if envelope.get("task") != task or not hmac.compare_digest(expected, mac):
        raise AuthError("bad_signature", "message with a bad signature refused (tampered?)")
    if float(expires) + CLOCK_SKEW_S < now:
        raise AuthError("expired", f"expired message refused (expired at {expires})")
    return Verified(args=args, nonce=nonce, expires=float(expires), key_id=kid, target=target)


def check_target(target: str, queue: str | None, own_queues: Collection[str]) -> None:
    """AuthError (`wrong_target`) unless a message was signed for the very queue it was
    taken from, and that queue is one this consumer serves: a message captured on one
    host's queue and pushed onto another's (or onto the control queue) is refused."""
    if queue is None or target != queue or queue not in own_queues:
        raise AuthError(
            "wrong_target",
            f"message signed for {target or 'no queue'!r} refused on "
            f"{queue or 'an unknown queue'!r}: it was meant for another host or queue",
        )


# --------------------------------------------------------------------------- sealing
#
# What the worker answers, and what a client keeps in Redis between its calls (session
# state, a session's host pin), is sealed: `<key id>:<mac>` on a first line, then the
# value. The MAC covers the purpose, the name it is stored under (a task id, a session
# id) and the value, so a sealed value cannot be replayed under another name or for
# another purpose. A Redis writer without the key can delete or garble a sealed value,
# never forge one: a reader refuses what does not verify.

#: The key id of a value sealed without a key (a fleet run `--insecure-unsigned`).
UNSEALED = "-"
#: What a sealed value is for: a task's answer, a session's state, a session's host pin;
#: what a worker publishes: a job's record and state, where its last check stopped, a
#: job event, a host's record and the readiness of its consumers.
REPLY = "reply"
SESSION_STATE = "session-state"
SHELL = "shell"
JOB = "job"
JOB_OFFSETS = "job-offsets"
EVENT = "event"
HOST = "host"
HOST_READY = "host-ready"
#: Who a call belongs to, as the worker that claimed it recorded it in the call's record
#: (which its client writes too: a cancel goes by the worker's seal, not by the name).
CALL_OWNER = "call-owner"


def _seal_mac(key: str, purpose: str, name: str, value: str) -> str:
    return _mac(key, f"{purpose}\n{name}\n".encode() + value.encode("utf-8", "surrogatepass"))


def seal(key: str | None, purpose: str, name: str, value: str) -> str:
    """`value` with its seal: `<key id>:<mac>`, a newline, the value (`-:-` keyless)."""
    if key is None:
        return f"{UNSEALED}:{UNSEALED}\n{value}"
    return f"{key_id(key)}:{_seal_mac(key, purpose, name, value)}\n{value}"


def unseal(keys: Mapping[str, str], purpose: str, name: str, sealed: str) -> str:
    """The value of a sealed text; AuthError when it does not verify with one of `keys`
    (by id). With no keys at all (an unsigned client) the seal is not checked."""
    head, newline, value = sealed.partition("\n")
    kid, colon, mac = head.partition(":")
    if not newline or not colon:
        raise AuthError("malformed", f"unsealed {purpose} refused (no seal)")
    if not keys:
        return value
    key = keys.get(kid)
    if key is None:
        raise AuthError(
            "unknown_key", f"{purpose} sealed with a key this client does not hold ({kid})"
        )
    if not hmac.compare_digest(_seal_mac(key, purpose, name, value), mac):
        raise AuthError("bad_signature", f"{purpose} with a bad seal refused (forged?)")
    return value


# ----------------------------------------------------------------------------- marks
#
# What a worker publishes for every client to read (a job's hash, a host's record, a job
# event) carries a mark: the seals of one value by each key the worker holds,
# `<key id>:<mac>[,<key id>:<mac>...]`. Every key, so that a client still on the old key
# during a rotation, or an admin client, verifies with the key it has. The value is not
# repeated in the mark: a hash keeps its fields readable, the mark in a field beside.


def mark(keys: Sequence[str], purpose: str, name: str, value: str) -> str:
    """The seals of `value` (for `purpose`, under `name`) by each of `keys`; `-:-` with
    no key (a worker run `--insecure-unsigned`)."""
    seals = [f"{key_id(key)}:{_seal_mac(key, purpose, name, value)}" for key in keys if key]
    return ",".join(seals) or f"{UNSEALED}:{UNSEALED}"


def check_mark(
    keys: Mapping[str, str], purpose: str, name: str, value: str, marked: str
) -> None:
    """AuthError unless one seal of `marked` verifies `value` with a key of `keys` (by
    id). With no keys at all (an unsigned client) the mark is not checked."""
    if not keys:
        return
    seals = [part.partition(":") for part in marked.split(",") if part]
    known = [(keys[kid], mac) for kid, colon, mac in seals if colon and kid in keys]
    if not seals:
        raise AuthError("malformed", f"{purpose} without a seal refused (not a worker's?)")
    if not known:
        ids = ", ".join(kid for kid, _, _ in seals)
        raise AuthError(
            "unknown_key", f"{purpose} sealed with keys this client does not hold ({ids})"
        )
    if not any(hmac.compare_digest(_seal_mac(key, purpose, name, value), mac)
               for key, mac in known):
        raise AuthError("bad_signature", f"{purpose} with a bad seal refused (forged?)")


# ----------------------------------------------------------------------------- locks
#
# What one owner may read and no other (a job's record, its events, a workspace's view,
# a snapshot's record, an answer) is locked rather than sealed: encrypted (AES-256-GCM)
# under a fresh data key, which is wrapped for each key that may read it (the worker's
# keys, the admin key, the owner's key), each wrap with a MAC of its own key over the
# whole. Every client shares one Redis user (`bashfleet.worker.wire.acl`), so Redis cannot keep
# one owner's records from another's eyes: the lock does. A reader verifies the MAC of
# a key it holds before it unwraps, so an owner who can open a record (and so knows its
# data key) still cannot forge one that the workers or the admin would believe.
#
# Format: `<key id>:<mac>:<wrap>[,...]`, a newline, base64 of nonce + ciphertext; `-:-`
# and the value in clear for a worker run `--insecure-unsigned`.

_DATA_KEY_BYTES = 32
_NONCE_BYTES = 12


def _aead(data_key: bytes) -> AESGCM:
    """AES-GCM under `data_key`. `cryptography` loads on first use: a process that opens
    no locked value (a CLI's call whose answer is sealed, not locked) never loads it."""
    return aesgcm_class()(data_key)


def aesgcm_class() -> type[AESGCM]:
    """`cryptography`'s AESGCM. Taken from its Rust bindings, where its public module
    (`cryptography.hazmat.primitives.ciphers.aead`) takes it from too: that module's
    package loads every cipher and mode first, which doubles what a CLI's call spends
    loading AES-GCM. From the public module where the bindings do not hold it."""
    try:
        from cryptography.hazmat.bindings._rust import openssl  # noqa: PLC0415

        found = getattr(getattr(openssl, "aead", None), "AESGCM", None)
    except ImportError:
        found = None
    if isinstance(found, type):
        return found
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415

    return AESGCM


def _pad(key: str, purpose: str, name: str, nonce: bytes) -> bytes:
    """What a data key is XORed with for `key` (a PRF of a nonce used once)."""
    return hmac.new(key.encode(), f"wrap\n{purpose}\n{name}\n".encode() + nonce,
                    hashlib.sha256).digest()


def _xor(data: bytes, pad: bytes) -> bytes:
    """`data` XOR `pad`, of one length (ValueError otherwise): as one integer each, not
    byte by byte (~1 us rather than ~5, on every answer's lock and unlock)."""
    if len(data) != len(pad):
        raise ValueError("a wrapped key of the wrong length")
    return (int.from_bytes(data) ^ int.from_bytes(pad)).to_bytes(len(data))


def _lock_mac(key: str, purpose: str, name: str, wrap: str, body: str) -> str:
    return _mac(key, f"lock\n{purpose}\n{name}\n{wrap}\n{body}".encode())


def lock(keys: Sequence[str], purpose: str, name: str, value: str) -> str:
    """`value` encrypted for each of `keys` (for `purpose`, under `name`); `-:-` and the
    value in clear with no key."""
    chosen = list(dict.fromkeys(key for key in keys if key))
    if not chosen:
        return f"{UNSEALED}:{UNSEALED}\n{value}"
    data_key, nonce = os.urandom(_DATA_KEY_BYTES), os.urandom(_NONCE_BYTES)
    sealed = _aead(data_key).encrypt(nonce, value.encode("utf-8", "surrogatepass"),
                                      f"{purpose}\n{name}".encode())
    body = base64.b64encode(nonce + sealed).decode()
    heads = []
    for key in chosen:
        wrap = _xor(data_key, _pad(key, purpose, name, nonce)).hex()
        heads.append(f"{key_id(key)}:{_lock_mac(key, purpose, name, wrap, body)}:{wrap}")
    return ",".join(heads) + "\n" + body


def is_locked(text: str) -> bool:
    """True when `text` is written as a locked value (not a sealed one, nor clear)."""
    head = text.partition("\n")[0]
    return head.split(",")[0].count(":") == 2


def open_answer(keys: Mapping[str, str], purpose: str, name: str, text: str) -> str:
    """An answer a worker locked (`lock`) or, when it refused a message it could not
    tell the sender of, only sealed (`seal`: a refusal holds nothing secret)."""
    return unlock(keys, purpose, name, text) if is_locked(text) else unseal(
        keys, purpose, name, text)


def lock_readers(locked: str) -> list[str]:
    """The ids of the keys a locked text was made for (none for a clear one)."""
    head = locked.partition("\n")[0]
    return [part.split(":")[0] for part in head.split(",") if part.count(":") == 2]


def unlock(keys: Mapping[str, str], purpose: str, name: str, locked: str) -> str:
    """The value of a locked text; AuthError when no key of `keys` may open it
    (`unknown_key`: another owner's) or it does not verify. With no keys at all (an
    unsigned client) only a clear one opens."""
    head, newline, body = locked.partition("\n")
    if not newline:
        raise AuthError("malformed", f"unlocked {purpose} refused (no lock)")
    if head == f"{UNSEALED}:{UNSEALED}":
        if keys:
            raise AuthError("unknown_key", f"{purpose} in clear refused: this client "
                            "verifies what it reads")
        return body
    parts = [part.split(":") for part in head.split(",")]
    mine = [(keys[p[0]], p[1], p[2]) for p in parts if len(p) == 3 and p[0] in keys]
    if not mine:
        raise AuthError("unknown_key", f"{purpose} locked for keys this client does not hold")
    for key, mac, wrap in mine:
        if hmac.compare_digest(_lock_mac(key, purpose, name, wrap, body), mac):
            return _open(key, purpose, name, wrap, body)
    raise AuthError("bad_signature", f"{purpose} with a bad lock refused (forged?)")


def _open(key: str, purpose: str, name: str, wrap: str, body: str) -> str:
    try:
        raw = base64.b64decode(body, validate=True)
        nonce, sealed = raw[:_NONCE_BYTES], raw[_NONCE_BYTES:]
        data_key = _xor(bytes.fromhex(wrap), _pad(key, purpose, name, nonce))
        plain = _aead(data_key).decrypt(nonce, sealed, f"{purpose}\n{name}".encode())
    except Exception:
        raise AuthError("bad_signature", f"{purpose} that does not decrypt refused") from None
    return plain.decode("utf-8", "surrogatepass")
