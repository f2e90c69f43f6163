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
    {"v": 1, "task": NAME, "args": [...],
     "auth": {"key": KEY_ID, "exp": UNIX_TIME, "nonce": HEX, "mac": HEX}}
The MAC covers the version, task name, arguments, key id, expiry and nonce, in a
canonical JSON encoding. Replay protection (each nonce accepted once until its expiry)
needs shared state: the worker records nonces in Redis (`registry`), not here.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from worker.wire.errors import ToolError

VERSION = 1
#: How long a signed message stays valid: long enough for a queue to drain after a
#: worker restart, short enough that a captured message is soon useless.
DEFAULT_TTL_S = 300.0
#: Tolerated clock difference between client and worker machines.
CLOCK_SKEW_S = 30.0


class AuthError(ToolError):
    """A message the worker must refuse (kind `unauthorized`); `reason` says why:
    unsigned, malformed, unknown_key, bad_signature, expired or replayed."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__("unauthorized", message)
        self.reason = reason


@dataclass(frozen=True)
class Verified:
    """A message whose signature, key and expiry checked out."""

    args: list[Any]
    nonce: str
    expires: float
    key_id: str = ""
    """Which key signed it (the worker answers with the same key)."""


def key_id(key: str) -> str:
    """A short public name for a key: which key signed a message, without revealing it."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def keyring(keys: Iterable[str]) -> dict[str, str]:
    """Accepted keys by id (the current one and any kept during a rotation)."""
    return {key_id(key): key for key in keys if key}


def _canonical(task: str, args: list[Any], kid: str, expires: float, nonce: str) -> bytes:
    body = {"v": VERSION, "task": task, "args": args, "key": kid, "exp": expires, "nonce": nonce}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _mac(key: str, message: bytes) -> str:
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def sign(
    key: str, task: str, args: list[Any], now: float, ttl_s: float = DEFAULT_TTL_S
) -> dict[str, Any]:
    """The signed envelope of a task's arguments."""
    kid, expires, nonce = key_id(key), round(now + ttl_s, 3), secrets.token_hex(16)
    mac = _mac(key, _canonical(task, args, kid, expires, nonce))
    return {
        "v": VERSION, "task": task, "args": args,
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
    auth, args = envelope.get("auth"), envelope.get("args")
    if not isinstance(auth, dict) or not isinstance(args, list):
        raise AuthError("malformed", "malformed signed message refused")
    kid, expires, nonce, mac = (auth.get(k) for k in ("key", "exp", "nonce", "mac"))
    if not (isinstance(kid, str) and isinstance(nonce, str) and isinstance(mac, str)
            and isinstance(expires, int | float)):
        raise AuthError("malformed", "malformed signature refused")
    key = keys.get(kid)
    if key is None:
        raise AuthError("unknown_key", f"message signed with an unknown key ({kid}) refused")
    expected = _mac(key, _canonical(task, args, kid, float(expires), nonce))
    if envelope.get("v") != VERSION or envelope.get("task") != task or not hmac.compare_digest(
        expected, mac
    ):
        raise AuthError("bad_signature", "message with a bad signature refused (tampered?)")
    if float(expires) + CLOCK_SKEW_S < now:
        raise AuthError("expired", f"expired message refused (expired at {expires})")
    return Verified(args=args, nonce=nonce, expires=float(expires), key_id=kid)


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
#: What a sealed value is for: a task's answer, a session's state, a session's host pin.
REPLY = "reply"
SESSION_STATE = "session-state"
SHELL = "shell"


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
