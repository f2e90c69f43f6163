"""Agent sessions kept in Redis: what a dialect carries between the calls of one session.

    store = RedisSessionStore(redis.Redis.from_url(url, decode_responses=True))
    state = store.load("agent-7")          # a fresh SessionState for an unknown id
    dialect.call("bash", {"command": "cd src"}, runner, state)
    store.save("agent-7", state)           # refreshes the key's TTL

A session is one JSON string (the `SessionState` model: cwd, env, pinned host, jobs,
pids, read offsets) under `bashfleet:session-state:<id>`, which expires SESSION_TTL_S
(24 h) after its last save. State lives in Redis only, so an MCP server (or any client)
that restarts with the same session id picks up where the last one stopped.

Two callers that save the same session at once would lose one of the updates;
`commit` merges instead: it reapplies what one call changed onto the state stored now
(`merge_states`), in a WATCH/MULTI transaction.

A session's *shell* (cwd, exported and unset variables, pinned host: `bashfleet.client.shells`)
is stored apart, under `bashfleet:shell:<id>` (`ShellStore`), because every caller of a
session shares it, not only the dialect's MCP server: `bashfleet run --session S`, the
Python API's `session=`, native's `session` argument. Each call's change is laid onto
the stored shell in a WATCH/MULTI transaction, so concurrent calls never lose a `cd`.

Every read and write of session data goes through a `Seal` (`bashfleet.client._core.seal`): what
a session stores decides what its next calls run (their cwd, their environment), so a
Redis writer who could edit it would choose them. It is sealed with the client's
signing key (`auth.seal`); a record that does not verify is not used (the session
starts afresh, with a warning), whatever it says.

`ShellStore` is the blocking one (generated from `client/_async/shells.py`, which the
asyncio client uses natively).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import redis

from bashfleet.client._core.seal import Seal, validate_session_id
from bashfleet.client._sync.shells import ShellStore
from bashfleet.client.dialects.base import SessionState
from bashfleet.worker.wire import auth, names
from bashfleet.worker.wire.names import session_state_key, shell_key

__all__ = [
    "SESSION_STATE_TTL_S",
    "RedisSessionStore",
    "ShellStore",
    "merge_states",
    "session_state_key",
    "shell_key",
    "validate_session_id",
]

#: Life of a session's state after its last save (refreshed by every save).
SESSION_STATE_TTL_S = names.SESSION_TTL_S

K = TypeVar("K")
V = TypeVar("V")


def _merge_dict(base: Mapping[K, V], mine: Mapping[K, V], theirs: Mapping[K, V]) -> dict[K, V]:
    """Three-way merge of one mapping: keys this call added, changed or removed win."""
    merged = dict(theirs)
    for key in base.keys() | mine.keys():
        if key not in mine:
            if key in base:
                merged.pop(key, None)  # this call removed it
        elif base.get(key) != mine[key]:
            merged[key] = mine[key]
    return merged


def merge_states(base: SessionState, mine: SessionState, theirs: SessionState) -> SessionState:
    """`theirs` (the state stored now) with what one call changed from `base` to `mine`.

    Field by field, and key by key for the mappings (env, jobs, pids, offsets): a
    value this call changed wins; a value it left alone keeps whatever a concurrent
    call stored meanwhile. So a BashOutput that ran while a long Bash call was still
    running keeps its read offset, and the Bash call still records its exports.
    """
    fields: dict[str, Any] = {}
    for name in SessionState.model_fields:
        old, new, now = getattr(base, name), getattr(mine, name), getattr(theirs, name)
        if isinstance(new, dict):
            fields[name] = _merge_dict(old, new, now)
        else:
            fields[name] = new if new != old else now
    return SessionState.model_validate(fields)


class RedisSessionStore:
    """The dialects' `SessionStore` on Redis: one sealed JSON string per session, with a
    TTL."""

    def __init__(
        self, client: redis.Redis, ttl_s: int = SESSION_STATE_TTL_S, *, key: str | None = None,
        space: str = "",
    ) -> None:
        """`client` must decode responses (`decode_responses=True`); `key`: the owner's
        key the records are locked with (`Identity.shell_key`; None: an unsigned client,
        records in clear); `space`: the owner's space their keys are named in."""
        self._redis = client
        self._ttl_s = ttl_s
        self._seal = Seal(key, auth.SESSION_STATE)
        self._space = space if key else ""

    @property
    def shells(self) -> ShellStore:
        """The sessions' shells, on the same Redis, locked with the same key."""
        return ShellStore(self._redis, self._ttl_s, key=self._seal.key, space=self._space)

    def _key(self, session_id: str) -> str:
        return session_state_key(validate_session_id(session_id), self._space)

    def load(self, session_id: str) -> SessionState:
        """The session's state; a fresh one for an unknown or expired id."""
        key = self._key(session_id)
        return self._parse(session_id, self._redis.get(key))

    def save(self, session_id: str, state: SessionState) -> None:
        """Store the state and (re)start its TTL."""
        key = self._key(session_id)
        self._redis.set(key, self._seal.encode(session_id, state), ex=self._ttl_s)

    def commit(self, session_id: str, base: SessionState, mine: SessionState) -> SessionState:
        """Save what a call changed (`base` -> `mine`) onto the stored state; the result.

        WATCH/MULTI: another process saving the same session in between makes the
        merge start over on its state instead of overwriting it.
        """
        key = self._key(session_id)
        while True:
            with self._redis.pipeline() as pipe:
                try:
                    pipe.watch(key)  # type: ignore[no-untyped-call]
                    theirs = self._parse(session_id, pipe.get(key))
                    merged = merge_states(base, mine, theirs)
                    pipe.multi()
                    pipe.set(key, self._seal.encode(session_id, merged), ex=self._ttl_s)
                    pipe.execute()
                    return merged
                except redis.WatchError:
                    continue

    def delete(self, session_id: str) -> None:
        """Forget a session."""
        self._redis.delete(self._key(session_id))

    def ttl(self, session_id: str) -> int:
        """Seconds the session's state has left (-2: none stored)."""
        return int(self._redis.ttl(self._key(session_id)))

    def _parse(self, session_id: str, raw: object) -> SessionState:
        return self._seal.decode(session_id, raw, SessionState)
