"""Who a client is to the fleet and where the fleet is: the Redis URL, the owner of its
calls, the keys it signs with and seals sessions with.

Configuration lookups only (the client's settings, `bashfleet up`'s state file): no Redis.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from bashfleet.client._core.constants import FAILOVER_GRACE_S
from bashfleet.client._core.settings import ClientSettings, client_settings, local_text
from bashfleet.client.errors import CallRejected, FleetUnavailable
from bashfleet.worker.wire import auth, owner_keys
from bashfleet.worker.wire.names import OWNER_PATTERN
from bashfleet.worker.wire.owner_keys import OwnerKey

if TYPE_CHECKING:
    from pydantic import ValidationError

#: The URL schemes of a fleet's Redis: plain, TLS, a socket, behind Sentinel.
URL_SCHEMES = ("redis://", "rediss://", "unix://", "sentinel://")
#: What a client says when it finds no fleet to talk to.
NO_FLEET = (
    "no fleet configured: pass redis_url=, set BASHFLEET_REDIS_URL, "
    "or start a local fleet with `bashfleet up`"
)


def resolve_url(redis_url: str | None = None, settings: ClientSettings | None = None
                ) -> str | None:
    """The fleet's Redis URL: the argument, else BASHFLEET_REDIS_URL, else the local fleet
    (`bashfleet up`'s, read again at each call: a fleet brought down and up again is
    found at its new address)."""
    if redis_url:
        return redis_url
    settings = settings or client_settings()
    if settings.redis_url:
        return settings.redis_url
    try:
        return local_text(settings, "redis_url")
    except ValueError as exc:  # a state directory that is not this user's alone
        raise FleetUnavailable(f"the local fleet's state is not trusted: {exc}") from None


#: What a setting's pattern allows, in words (a regular expression is not for everyone).
_ALLOWED = {
    "owner": "1 to 64 letters, digits or _ . : @ -, e.g. user:alice or team-ci",
}


def settings_problem(exc: ValidationError) -> str:
    """A BASHFLEET_* variable's bad value as one line: the variable, what it holds, what
    is allowed (pydantic's own text is a paragraph per error, with a link)."""
    lines = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        allowed = _ALLOWED.get(field) or error["msg"]
        pattern = (error.get("ctx") or {}).get("pattern")
        if pattern and field in _ALLOWED:
            allowed += f" (the pattern {pattern})"
        lines.append(f"BASHFLEET_{field.upper()}={error['input']!r} is not allowed: {allowed}")
    return "; ".join(lines)


def require_url(redis_url: str | None, settings: ClientSettings | None = None) -> str:
    """`resolve_url`, FleetUnavailable when there is no fleet; ValueError when its scheme
    is none a fleet's Redis can have (redis-py's own message leaves out `sentinel://`)."""
    url = resolve_url(redis_url, settings)
    if not url:
        raise FleetUnavailable(NO_FLEET)
    if not url.startswith(URL_SCHEMES):
        scheme = url.split("://", 1)[0] + "://" if "://" in url else repr(url.split("@")[-1])
        raise ValueError(f"the fleet's Redis URL cannot start with {scheme}: use "
                         f"{', '.join(URL_SCHEMES[:-1])} or {URL_SCHEMES[-1]}")
    return url


def _key(url: str, name: Literal["signing_key", "admin_key"],
         settings: ClientSettings | None) -> str | None:
    settings = settings or client_settings()
    configured: str | None = getattr(settings, name)
    if configured is not None:
        return configured
    return local_text(settings, name, url=url)


def resolve_signing_key(url: str, settings: ClientSettings | None = None) -> str | None:
    """The key calls are signed with: BASHFLEET_SIGNING_KEY, else the local fleet's own
    (when `url` is that fleet's Redis), else None (unsigned)."""
    return _key(url, "signing_key", settings)


def resolve_admin_key(url: str, settings: ClientSettings | None = None) -> str | None:
    """The admin key: BASHFLEET_ADMIN_KEY, else the local fleet's own (when `url` is that
    fleet's Redis: whoever runs `bashfleet up` administers it), else None."""
    return _key(url, "admin_key", settings)


def outage_grace_s(url: str) -> float:
    """How long the calls in flight wait through a Redis outage: a Sentinel failover's
    FAILOVER_GRACE_S behind `sentinel://`, none for a single Redis."""
    return FAILOVER_GRACE_S if url.startswith("sentinel://") else 0.0


class Identity(NamedTuple):
    """Who a client is to the fleet: the owner of its calls and the key it signs with (a
    named tuple: see `bashfleet.worker.wire.auth.Verified`)."""

    owner: str
    signing_key: str | None
    admin: bool
    """True when `signing_key` is the admin key."""
    shell_key: str | None
    """What locks its sessions' shells and dialect states: an owner key's secret (every
    client of the owner, a person's CLI or an agent's MCP server, opens them, no other
    owner's), or the fleet key (every operator's client opens them)."""
    signing_kid: str | None = None
    """The key id its messages name: an owner key's (`<owner>/<id>`, which tells workers
    whose it is); None for a fleet or admin key (its own id)."""
    verifying_keys: tuple[str, ...] = ()
    """What opens the records workers publish for it (`record_keys`)."""
    space: str = ""
    """Its owner's space: what names the owner's quotas and job index in Redis."""
    shell_space: str = ""
    """What names its sessions' shells and states in Redis: an owner key's space (an
    owner's sessions are its own: another owner's of the same name are apart); none for
    a fleet key's client (an operator's, whose sessions every such client shares)."""
    owner_key: bool = False
    """True when it holds an owner key (it acts as that owner and its sub-owners only)."""

    def signed(self, task: str, args: list[Any], target: str) -> list[Any]:
        """A task's arguments, wrapped in a signed envelope for the queue `target` they
        are sent to (a worker refuses it taken from any other queue), when there is a
        key."""
        if self.signing_key is None:
            return args
        return [auth.sign(self.signing_key, task, args, time.time(), target=target,
                          kid=self.signing_kid)]

    def call_tag(self, call_id: str) -> str:
        """What a call's record carries to show it is this owner's: a MAC of the call id
        and the owner under the key it signs with ("" for an unsigned client)."""
        if self.signing_key is None:
            return ""
        text = f"bashfleet call owner\n{call_id}\n{self.owner}"
        return hmac.new(self.signing_key.encode(), text.encode(), hashlib.sha256).hexdigest()

    def owns_call(self, call_id: str, record: Mapping[str, str]) -> bool:
        """Whether this client may act on a call (cancel, detach) by its record: a call
        its owner sent (the record's tag is this owner's), or any call for a client of
        the fleet or admin key (the operator's, which acts on all). An id is no bearer
        token: another owner's call is told apart from no call by nothing."""
        if not self.owner_key:
            return True
        return hmac.compare_digest(record.get("owner_tag", ""), self.call_tag(call_id))

    def reply_keys(self) -> dict[str, str]:
        """The keys (by id) a worker may seal this client's answers with."""
        return auth.keyring([self.signing_key or ""])

    def record_keys(self) -> dict[str, str]:
        """The keys (by id) that verify and open what workers publish (host and job
        records, job events, workspace views, snapshots): the fleet's key (every owner's
        records), the admin key of an admin client; an owner key's secret (that owner's
        records only) and reader key (host records). Empty for an unsigned client (an
        `--insecure-unsigned` fleet, whose records carry no seal)."""
        return auth.keyring(self.verifying_keys)



def _configured_owner_key(settings: ClientSettings) -> OwnerKey | None:
    try:
        return settings.client_owner_key()
    except ValueError as exc:
        raise CallRejected(f"BASHFLEET_OWNER_KEY: {exc}") from None


def record_keys_at(url: str, admin: bool) -> dict[str, str]:
    """The record keys (`Identity.record_keys`) of a client of the fleet at `url`: how a
    listener that follows a local fleet to its new address verifies the new fleet's
    events. FleetUnavailable when the local fleet's state is not trusted."""
    try:
        return resolve_identity(url, None, admin).record_keys()
    except ValueError as exc:  # a state directory that is not this user's alone
        raise FleetUnavailable(f"the local fleet's state is not trusted: {exc}") from None


def resolve_identity(url: str, owner: str | None, admin: bool) -> Identity:
    """A client's identity (`Fleet`'s `owner` and `admin` arguments); CallRejected for an
    owner that is not a valid name, or that its owner key does not cover.

    An owner key (BASHFLEET_OWNER_KEY, or one given as BASHFLEET_SIGNING_KEY) makes the
    client that owner (or a sub-owner of it, `owner=NAME::...`), never an admin, and
    never reaches for the local fleet's keys. Otherwise it signs with the fleet key (or
    the admin key, `admin`), as any owner it names: an operator's client."""
    if owner is not None and not re.fullmatch(OWNER_PATTERN, owner):
        raise CallRejected(f"invalid owner {owner!r}: 1-128 letters, digits, _.:@-")
    settings = client_settings()
    key = _configured_owner_key(settings)
    if key is not None:
        return _owner_identity(key, owner or settings.owner or key.owner)
    admin_key = resolve_admin_key(url, settings) if admin else None
    fleet_key = resolve_signing_key(url, settings)
    chosen = owner or settings.owner_name()
    return Identity(
        owner=chosen,
        signing_key=admin_key or fleet_key,
        admin=admin_key is not None,
        shell_key=fleet_key,
        verifying_keys=tuple(k for k in (fleet_key, admin_key) if k),
        space=owner_keys.owner_space(fleet_key, chosen),
    )


def _owner_identity(key: OwnerKey, owner: str) -> Identity:
    if not owner_keys.covers(key.owner, owner):
        raise CallRejected(
            f"owner {owner!r} is not {key.owner!r}'s: an owner key acts as its own owner "
            f"(and sub-owners {key.owner}{owner_keys.SUB_OWNER}...) only")
    return Identity(
        owner=owner, signing_key=key.secret, admin=False, shell_key=key.secret,
        signing_kid=key.key_id, verifying_keys=(key.secret, key.reader), space=key.space,
        shell_space=key.space, owner_key=True,
    )
