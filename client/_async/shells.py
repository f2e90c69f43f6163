"""Sessions' shells on Redis: one sealed JSON string per session, with a TTL.

A session's shell (cwd, exported and unset variables, pinned host: `bashfleet.client.shells`) is
shared by every caller of the session, whichever client makes the call. Each call's
change is laid onto the stored shell in a WATCH/MULTI transaction, so concurrent calls
never lose a `cd`. Records are locked with the owner's key, in its space
(`bashfleet.client._core.seal`): another owner can neither find, read nor forge them.

Written for asyncio; `client/_sync/shells.py` is generated from it by
`scripts/unasync.py` (what `bashfleet.client.sessions.ShellStore` is).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bashfleet.client._async.concurrency import multi, watch
from bashfleet.client._core.seal import Seal, validate_session_id
from bashfleet.client.shells import ShellChange, ShellState, apply_change
from bashfleet.worker.fleet.connect import watch_errors
from bashfleet.worker.wire import auth, names
from bashfleet.worker.wire.names import shell_key

if TYPE_CHECKING:
    from bashfleet.worker.fleet.connect import AsyncRedis


class AsyncShellStore:
    """Sessions' shells on Redis: one sealed JSON string per session, with a TTL."""

    def __init__(
        self, client: AsyncRedis, ttl_s: int = names.SESSION_TTL_S, *, key: str | None = None,
        space: str = "",
    ) -> None:
        """`client` must decode responses (`decode_responses=True`); `key`: the owner's
        key the shells are locked with (None: an unsigned client, shells in clear);
        `space`: the owner's space their keys are named in (`Identity.space`)."""
        self._redis = client
        self._ttl_s = ttl_s
        self._seal = Seal(key, auth.SHELL)
        self._space = space if key else ""

    def _key(self, session_id: str) -> str:
        return shell_key(validate_session_id(session_id), self._space)

    async def load(self, session_id: str) -> ShellState:
        """The session's shell; a fresh one for an unknown or expired id."""
        key = self._key(session_id)
        return self._seal.decode(session_id, await self._redis.get(key), ShellState)

    async def commit(self, session_id: str, change: ShellChange) -> ShellState:
        """Lay one call's change onto the stored shell (and restart its TTL); the result.

        WATCH/MULTI: a change committed by another caller in between makes this one
        start over on that newer shell, so neither is lost.
        """
        key = self._key(session_id)
        while True:
            async with self._redis.pipeline() as pipe:
                try:
                    await watch(pipe, key)
                    now = self._seal.decode(session_id, await pipe.get(key), ShellState)
                    shell = apply_change(now, change)
                    multi(pipe)
                    pipe.set(key, self._seal.encode(session_id, shell), ex=self._ttl_s)
                    await pipe.execute()
                    return shell
                except watch_errors():
                    continue

    async def delete(self, session_id: str) -> None:
        """Forget a session's shell."""
        await self._redis.delete(self._key(session_id))

    async def ttl(self, session_id: str) -> int:
        """Seconds the session's shell has left (-2: none stored)."""
        return int(await self._redis.ttl(self._key(session_id)))
