"""How a client seals what it stores for its sessions, and checks what it reads back.

What a session stores (its shell: cwd, variables, pinned host; a dialect's state)
decides what its next calls run, so a Redis writer who could edit it would choose
them; what it holds (exported variables) is the owner's to read. It is locked with the
owner's key (`auth.lock`: every client of that owner opens it, no other owner's); a
record that does not verify is not used (the session starts afresh, with a warning),
whatever it says.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from bashfleet.worker.wire import auth, names

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)


def validate_session_id(session_id: str) -> str:
    """A session id, or ValueError: it names a Redis key, so the call ids' alphabet."""
    if not names.valid_id(session_id):
        raise ValueError(
            f"invalid session id {session_id!r}: use 1-64 letters, digits, '.', '_' or '-'"
        )
    return session_id


@dataclass(frozen=True)
class Seal:
    """Seals and opens one kind of session record (`purpose`: auth.SHELL, or
    auth.SESSION_STATE) with a client's key."""

    key: str | None
    """The owner's key (`Identity.shell_key`; None: an unsigned client, records in
    clear)."""
    purpose: str

    @property
    def what(self) -> str:
        """What the record is, in messages: `shell` or `state`."""
        return "shell" if self.purpose == auth.SHELL else "state"

    def encode(self, session_id: str, record: BaseModel) -> str:
        """What is stored for a session: locked (its cwd and variables are the owner's
        to read)."""
        return auth.lock([self.key] if self.key else [], self.purpose, session_id,
                         record.model_dump_json())

    def decode(self, session_id: str, raw: object, model: type[M]) -> M:
        """A stored record; a fresh one for none, or for one that cannot be read or does
        not verify."""
        if raw is None:
            return model()
        try:
            keys = auth.keyring([self.key] if self.key else [])
            text = auth.unlock(keys, self.purpose, session_id, str(raw))
        except auth.AuthError as exc:
            # Forged, or sealed by a client with another key: never used.
            log.warning("session %s: %s refused (%s); starting afresh", session_id,
                        self.what, exc.message)
            return model()
        try:
            return model.model_validate_json(text)
        except ValidationError as exc:
            # A record written by another version, or damaged: starting afresh loses the
            # session's memory, but refusing every call would lose the agent.
            log.warning("session %s: unreadable %s, starting afresh (%s)", session_id,
                        self.what, exc)
            return model()
