"""Owners are credentials: the key an operator issues to an owner, and how workers
recognise it without a lookup.

An owner's key is derived from the fleet's key (`bashfleet owner add NAME` prints it):

    secret = HMAC-SHA256(fleet key, "bashfleet owner key\\n" + NAME)
    reader = HMAC-SHA256(fleet key, "bashfleet reader key")
    text   = "bfo1." + secret + "." + reader + "." + NAME

Derived, not stored: a worker holding the fleet key recomputes any owner's secret from
the name the message's key id carries (`<NAME>/<key id of the secret>`), so issuing a
key touches no Redis and no worker, and nothing an owner could read or write lists the
owners. What it costs: a key cannot be revoked alone (rotating the fleet key revokes
every owner key; see OPERATIONS.md), which a stored table would allow.

What each key opens:

- the secret signs the owner's messages (a worker takes the owner from the key and
  refuses a message naming another, `covers`), and opens what workers lock for that
  owner (`auth.lock`: its jobs, events, workspaces, snapshots, answers);
- the reader verifies what workers publish for everyone (host records): every owner
  holds it, and no owner can write those records (the clients' Redis user cannot).

An owner key also covers the owner's sub-owners, `NAME::anything` (an MCP server's
session, `NAME::session:<id>`), which are owners of their own to the fleet (another
session's tools cannot reach their jobs) but answer to the same key.

Keys in Redis that hold one owner's ids (its quotas, its job index) are named by the
owner's space (`space`), a MAC of the owner's secret: a client can name its own and
not another's, and no client may list keys (`bashfleet.worker.wire.acl`).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import lru_cache
from typing import NamedTuple

from bashfleet.worker.wire import auth

#: The prefix of an owner key's text (version 1).
PREFIX = "bfo1"
#: Between an owner and a sub-owner of its (`alice::session:mcp-1`).
SUB_OWNER = "::"
#: The owner pattern of `bashfleet owner add` (the settings' `owner`; no sub-owner).
OWNER_NAME_RE = r"^[A-Za-z0-9_.:@-]{1,64}$"


def _hmac(key: str, text: str) -> str:
    return hmac.new(key.encode(), text.encode(), hashlib.sha256).hexdigest()


@lru_cache(maxsize=4096)
def owner_secret(fleet_key: str, owner: str) -> str:
    """The secret of `owner`'s key under `fleet_key` (cached: a worker derives it for
    every message an owner signs)."""
    return _hmac(fleet_key, f"bashfleet owner key\n{owner}")


def reader_key(fleet_key: str) -> str:
    """The key that verifies what workers publish for every client (host records)."""
    return _hmac(fleet_key, "bashfleet reader key")


def root_owner(owner: str) -> str:
    """The owner whose key covers `owner` (itself, or the part before `::`)."""
    return owner.split(SUB_OWNER, 1)[0]


def covers(key_owner: str, owner: str) -> bool:
    """True when the key of `key_owner` may act as `owner` (itself or a sub-owner)."""
    return owner == key_owner or owner.startswith(key_owner + SUB_OWNER)


def space_of(secret: str) -> str:
    """The name of an owner's keys in Redis, from its secret (not from its name: no
    other owner can compute it)."""
    return "o" + _hmac(secret, "bashfleet owner space")[:32]


def owner_space(fleet_key: str | None, owner: str) -> str:
    """The space of `owner` (its root's: a sub-owner shares its owner's quotas and job
    index) under `fleet_key`; the owner's name itself on an unsigned fleet."""
    if not fleet_key:
        return owner
    return space_of(owner_secret(fleet_key, root_owner(owner)))


def signing_key_id(owner: str, secret: str) -> str:
    """The key id an owner's messages name: the owner, and which secret signed them."""
    return f"{owner}/{auth.key_id(secret)}"


def key_owner(kid: str) -> str | None:
    """The owner an owner key's id names; None for any other key (fleet, admin)."""
    owner, slash, short = kid.rpartition("/")
    return owner if slash and owner and short else None


class OwnerKey(NamedTuple):
    """An owner's key as a client holds it (a named tuple: see `Verified`)."""

    owner: str
    secret: str
    reader: str

    @classmethod
    def issue(cls, fleet_key: str, owner: str) -> OwnerKey:
        """The key of `owner` under `fleet_key` (what `bashfleet owner add` prints)."""
        return cls(owner, owner_secret(fleet_key, owner), reader_key(fleet_key))

    @classmethod
    def parse(cls, text: str) -> OwnerKey:
        """The key of an owner key's text; ValueError when it is not one."""
        prefix, secret, reader, owner = [*text.strip().split(".", 3), "", "", ""][:4]
        hexes = all(len(part) == 64 and all(c in "0123456789abcdef" for c in part)
                    for part in (secret, reader))
        if prefix != PREFIX or not hexes or not owner or SUB_OWNER in owner:
            raise ValueError("not an owner key (bashfleet owner add NAME prints one)")
        return cls(owner, secret, reader)

    @property
    def text(self) -> str:
        """The key as printed and configured (BASHFLEET_OWNER_KEY)."""
        return f"{PREFIX}.{self.secret}.{self.reader}.{self.owner}"

    @property
    def key_id(self) -> str:
        """The key id its messages name."""
        return signing_key_id(self.owner, self.secret)

    @property
    def space(self) -> str:
        """Its owner's space (`space_of`)."""
        return space_of(self.secret)

    def __repr__(self) -> str:  # never the secret in a log line or a traceback
        return f"OwnerKey(owner={self.owner!r})"


def is_owner_key(text: str | None) -> bool:
    """True when `text` is written as an owner key (it may still be malformed)."""
    return bool(text) and str(text).strip().startswith(PREFIX + ".")


class Keyring(Mapping[str, str]):
    """The keys a worker accepts, by id: its own (fleet keys, admin key), and every
    owner's, derived on lookup from an owner key id (`<owner>/<id>`) with each fleet key
    it accepts. Iterating lists its own keys only."""

    def __init__(self, own: Iterable[str], fleet: Iterable[str]) -> None:
        self._own = auth.keyring(own)
        self._fleet = tuple(key for key in fleet if key)

    def __getitem__(self, kid: str) -> str:
        found = self._own.get(kid)
        if found is not None:
            return found
        owner = key_owner(kid)
        if owner is not None:
            for fleet_key in self._fleet:
                secret = owner_secret(fleet_key, owner)
                if signing_key_id(owner, secret) == kid:
                    return secret
        raise KeyError(kid)

    def __iter__(self) -> Iterator[str]:
        return iter(self._own)

    def __len__(self) -> int:
        return len(self._own)


class SealingKeys(tuple[str, ...]):
    """The keys a worker seals and locks what it publishes with (its fleet keys and the
    admin key: the tuple), and the fleet keys it derives owners' keys from."""

    fleet: tuple[str, ...]

    def __new__(cls, keys: Iterable[str], fleet: Iterable[str] = ()) -> SealingKeys:
        made = super().__new__(cls, tuple(keys))
        made.fleet = tuple(key for key in fleet if key)
        return made

    def for_owner(self, owner: str) -> tuple[str, ...]:
        """What one owner's records are sealed and locked with: these keys and the
        owner's secret (its root's) under each fleet key."""
        root = root_owner(owner)
        return (*self, *(owner_secret(key, root) for key in self.fleet))

    def for_readers(self) -> tuple[str, ...]:
        """What records for every client are sealed with: these keys and the reader key."""
        return (*self, *(reader_key(key) for key in self.fleet))


def for_owner(keys: Sequence[str], owner: str) -> tuple[str, ...]:
    """`keys.for_owner(owner)` for a worker's SealingKeys; plain keys as they are."""
    return keys.for_owner(owner) if isinstance(keys, SealingKeys) else tuple(keys)


def for_readers(keys: Sequence[str]) -> tuple[str, ...]:
    """`keys.for_readers()` for a worker's SealingKeys; plain keys as they are."""
    return keys.for_readers() if isinstance(keys, SealingKeys) else tuple(keys)
