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
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, TypeVar

import redis
from pydantic import ValidationError

from client.dialects.base import SessionState
from worker.wire import auth, names
from worker.wire.names import session_state_key

__all__ = [
    "SESSION_STATE_TTL_S",
    "RedisSessionStore",
    "merge_states",
    "session_state_key",
    "validate_session_id",
]

log = logging.getLogger(__name__)

#: Life of a session's state after its last save (refreshed by every save).
SESSION_STATE_TTL_S = names.SESSION_TTL_S

K = TypeVar("K")
V = TypeVar("V")


def validate_session_id(session_id: str) -> str:
    """A session id, or ValueError: it names a Redis key, so the call ids' alphabet."""
    if not names.valid_id(session_id):
        raise ValueError(
            f"invalid session id {session_id!r}: use 1-64 letters, digits, '.', '_' or '-'"
        )
    return session_id


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
    """The dialects' `SessionStore` on Redis: one JSON string per session, with a TTL,
    sealed with the client's signing key.

    A session's state decides what its next calls run (their cwd, their environment):
    a Redis writer who could edit it would choose them. So it is sealed
    (`auth.seal`): a state that does not verify is not used (the session starts
    afresh, with a warning), whatever it says.
    """

    def __init__(
        self, client: redis.Redis, ttl_s: int = SESSION_STATE_TTL_S, *, key: str | None = None
    ) -> None:
        """`client` must decode responses (`decode_responses=True`); `key`: the signing
        key the states are sealed with (None: an unsigned client, states unsealed)."""
        self._redis = client
        self._ttl_s = ttl_s
        self._key = key
        self._keys = auth.keyring([key] if key else [])

    def load(self, session_id: str) -> SessionState:
        """The session's state; a fresh one for an unknown or expired id."""
        key = session_state_key(validate_session_id(session_id))
        return self._parse(session_id, self._redis.get(key))

    def save(self, session_id: str, state: SessionState) -> None:
        """Store the state and (re)start its TTL."""
        key = session_state_key(validate_session_id(session_id))
        self._redis.set(key, self._sealed(session_id, state), ex=self._ttl_s)

    def commit(self, session_id: str, base: SessionState, mine: SessionState) -> SessionState:
        """Save what a call changed (`base` -> `mine`) onto the stored state; the result.

        WATCH/MULTI: another process saving the same session in between makes the
        merge start over on its state instead of overwriting it.
        """
        key = session_state_key(validate_session_id(session_id))
        while True:
            with self._redis.pipeline() as pipe:
                try:
                    pipe.watch(key)  # type: ignore[no-untyped-call]
                    theirs = self._parse(session_id, pipe.get(key))
                    merged = merge_states(base, mine, theirs)
                    pipe.multi()
                    pipe.set(key, self._sealed(session_id, merged), ex=self._ttl_s)
                    pipe.execute()
                    return merged
                except redis.WatchError:
                    continue

    def delete(self, session_id: str) -> None:
        """Forget a session."""
        self._redis.delete(session_state_key(validate_session_id(session_id)))

    def ttl(self, session_id: str) -> int:
        """Seconds the session's state has left (-2: none stored)."""
        return int(self._redis.ttl(session_state_key(validate_session_id(session_id))))

    def _sealed(self, session_id: str, state: SessionState) -> str:
        return auth.seal(self._key, auth.SESSION_STATE, session_id, state.model_dump_json())

    def _parse(self, session_id: str, raw: object) -> SessionState:
        if raw is None:
            return SessionState()
        try:
            text = auth.unseal(self._keys, auth.SESSION_STATE, session_id, str(raw))
        except auth.AuthError as exc:
            # Forged, or sealed by a client with another key: never used.
            log.warning("session %s: state refused (%s); starting afresh", session_id,
                        exc.message)
            return SessionState()
        try:
            return SessionState.model_validate_json(text)
        except ValidationError as exc:
            # A record written by another version, or damaged: starting afresh loses the
            # session's memory, but refusing every call would lose the agent.
            log.warning("session %s: unreadable state, starting afresh (%s)", session_id, exc)
            return SessionState()
