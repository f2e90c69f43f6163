"""The one place that connects to Redis: Redis clients (plain, TLS, Sentinel), the URL
forms and their safe text, and the two ways of changing Redis state atomically (a Lua
script, a WATCH transaction).

Like arq's `connections.py`: every process (a worker's supervisor and consumers, a
client, the MCP server, Flower) builds its Redis client here, with the same timeouts.
It imports no Celery nor kombu: a client (`import bashfleet.client`) loads this module and must
not load them (`tests/unit/test_boundaries.py`). The Celery apps, built from the same
URL forms, are `bashfleet.worker.fleet.celery_apps`.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast
from urllib.parse import parse_qs, quote, unquote, urlsplit

from bashfleet.worker.fleet import resp
from bashfleet.worker.wire import lua

if TYPE_CHECKING:
    import redis
    import redis.asyncio as aioredis

    Redis = redis.Redis
    AsyncRedis = aioredis.Redis

T = TypeVar("T")


def __getattr__(name: str) -> Any:
    """`Redis` and `AsyncRedis` (redis-py's client classes), loaded when first asked for:
    a process that talks through the light client (`use_light_client`) never loads
    redis-py, whose import alone outlasts a CLI's call."""
    if name == "Redis":
        import redis  # noqa: PLC0415

        return redis.Redis
    if name == "AsyncRedis":
        import redis.asyncio  # noqa: PLC0415

        return redis.asyncio.Redis
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------- the light client

_light = False


def use_light_client() -> None:
    """From now, `redis_client` of a `redis://` or `unix://` URL is the light client
    (`bashfleet.worker.fleet.resp`): for a short-lived process (the CLI) whose start
    redis-py's import would double. TLS and Sentinel URLs keep redis-py."""
    global _light  # noqa: PLW0603 - one switch a process sets once, before its clients
    _light = True


def _loaded(*names: str) -> list[Any]:
    """redis-py's exception classes by name, when redis-py is loaded (else none: a
    process that never loaded it can raise none of them)."""
    module = sys.modules.get("redis.exceptions")
    return [getattr(module, name) for name in names] if module is not None else []


def connection_errors(*more: type[BaseException]) -> tuple[type[BaseException], ...]:
    """What a Redis that cannot be reached raises, whichever client talks to it: the
    light client's ConnectionError and TimeoutError (the built-in ones), and redis-py's;
    and `more`, for an `except` that catches those too."""
    return (ConnectionError, TimeoutError, *_loaded("ConnectionError", "TimeoutError"), *more)


def redis_errors(*more: type[BaseException]) -> tuple[type[BaseException], ...]:
    """Any error of a Redis command, whichever client sent it; and `more`."""
    return (ConnectionError, TimeoutError, resp.ResponseError, *_loaded("RedisError"), *more)


def watch_errors() -> tuple[type[BaseException], ...]:
    """What a WATCH transaction raises when another client changed a watched key (only
    redis-py runs those)."""
    return tuple(_loaded("WatchError"))


def no_permission_errors() -> tuple[type[BaseException], ...]:
    """What a command the server's ACL refuses to this user raises."""
    return (resp.NoPermissionError, *_loaded("NoPermissionError"))


def no_primary_errors() -> tuple[type[BaseException], ...]:
    """What a Sentinel that knows no primary (or replica) by the URL's name raises."""
    module = sys.modules.get("redis.sentinel")
    if module is None:
        return ()
    return (module.MasterNotFoundError, module.SlaveNotFoundError)


def _no_script_errors() -> tuple[type[BaseException], ...]:
    return (resp.NoScriptError, *_loaded("NoScriptError"))


#: Seconds to connect to Redis before giving up (a client then says FleetUnavailable).
CONNECT_TIMEOUT_S = 2.0
#: Longest wait for one Redis reply: a heartbeat or a call blocked longer is an outage.
SOCKET_TIMEOUT_S = 10.0
#: Idle connections are checked (PING) before reuse after this long.
HEALTH_CHECK_INTERVAL_S = 30
#: Connections one client's pool may open at once. redis-py 8 caps a pool at 100 unless
#: told, and fails the command past it ("Too many connections"): a worker of 256 slots
#: claims and finishes that many calls at once, and an AsyncFleet sends as many calls as
#: it is given. As many as Redis serves by default (`maxclients`): Redis says when there
#: are too many, as it did before the cap.
POOL_MAX_CONNECTIONS = 10_000


def redis_client(url: str, *, binary: bool = False) -> Redis:
    """A Redis client for the registry, replies and sessions (text replies; `binary`:
    bytes, for file transfers' chunks).

    `redis://`, `rediss://` (TLS), or `sentinel://` (`SentinelTarget`): a client of the
    current primary, found again through the sentinels after a failover. After
    `use_light_client`, a `redis://` or `unix://` URL's client is the light one."""
    if _light and urlsplit(url).scheme in resp.SCHEMES:
        return cast("Redis", resp.LightRedis(
            url, decode_responses=not binary, connect_timeout=CONNECT_TIMEOUT_S,
            timeout=SOCKET_TIMEOUT_S, fallback=lambda: _redis_py_client(url, binary=binary)))
    return _redis_py_client(url, binary=binary)


def _redis_py_client(url: str, *, binary: bool) -> Redis:
    import redis  # noqa: PLC0415 - see `__getattr__`
    import redis.retry  # noqa: PLC0415
    import redis.sentinel  # noqa: PLC0415

    from bashfleet.worker.fleet.replicated import ReplicatedRedis  # noqa: PLC0415

    target = sentinel_target(url)
    if target is not None:
        sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(target.sentinels), sentinel_kwargs=_sentinel_kwargs(target)
        )
        primary = sentinel.master_for(  # type: ignore[no-untyped-call]
            target.master, redis_class=ReplicatedRedis,
            **{**_primary_kwargs(target), "decode_responses": not binary,
               "retry": _no_retry(redis.retry.Retry)},
        )
        return cast("Redis", primary)
    return redis.Redis.from_url(
        url, decode_responses=not binary, socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=SOCKET_TIMEOUT_S, health_check_interval=HEALTH_CHECK_INTERVAL_S,
        max_connections=POOL_MAX_CONNECTIONS, retry=_no_retry(redis.retry.Retry),
    )


def _no_retry(retry_class: Callable[..., Any]) -> Any:
    """redis-py's `Retry` of no retries, said rather than left to its defaults (which
    differ between its constructors): a command whose answer was lost is not sent again
    by the library. A script sent twice (SEND, CLAIM) could queue or claim a call twice;
    the caller sees the error and decides."""
    from redis.backoff import NoBackoff  # noqa: PLC0415 - see `__getattr__`

    return retry_class(NoBackoff(), 0)


# ---------------------------------------------------------------------------- Sentinel


class SentinelTarget(NamedTuple):
    """A Redis behind Redis Sentinel, as a `sentinel://` URL names it:

        sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...][/DB]?master=NAME[&sentinel_password=P]

    HOST:PORT are the sentinels (26379 when no port is given); `master` the name they
    monitor; USER / PASSWORD log in to the Redis they point at (the primary), and
    `sentinel_password` to the sentinels themselves, when they ask for one. Every
    process (workers, clients, Flower) asks the sentinels where the primary is, and
    again after a failover.
    """

    sentinels: tuple[tuple[str, int], ...]
    """(host, port) of each sentinel."""
    master: str
    """The name of the monitored primary."""
    username: str | None = None
    """ACL user on the primary (None: the default user)."""
    password: str | None = None
    """Password on the primary."""
    db: int = 0
    """Database number."""
    sentinel_password: str | None = None
    """Password of the sentinels (None: they ask for none)."""

    def kombu_url(self) -> str:
        """What kombu's Sentinel transport reads: one `sentinel://` URL per sentinel,
        joined by `;` (the master name goes in the transport options)."""
        auth = ""
        if self.password is not None:
            auth = f"{quote(self.username or '', safe='')}:{quote(self.password, safe='')}@"
        return ";".join(f"sentinel://{auth}{_host_text(h)}:{p}/{self.db}"
                        for h, p in self.sentinels)

    def transport_options(self) -> dict[str, object]:
        """kombu's (and Flower's) Sentinel options."""
        options: dict[str, object] = {"master_name": self.master}
        if self.sentinel_password is not None:
            options["sentinel_kwargs"] = {"password": self.sentinel_password}
        return options


def _host_text(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _parse_sentinel(address: str) -> tuple[str, int]:
    if address.startswith("["):  # [IPv6]:port
        host, _, rest = address[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = address.rpartition(":") if ":" in address else (address, "", "")
    if not host:
        raise ValueError(f"sentinel URL: no host in {address!r}")
    try:
        return host, int(port) if port else 26379
    except ValueError:
        raise ValueError(f"sentinel URL: invalid port in {address!r}") from None


def sentinel_target(url: str) -> SentinelTarget | None:
    """The Sentinel setup a `sentinel://` URL names; None for any other URL.

    ValueError (saying what is wrong, never the password) for a malformed one.
    """
    if not url.startswith("sentinel://"):
        return None
    # The address list by hand: `[::1]:26380` after another address is no netloc
    # `urlsplit` takes (Debian's 3.11.2 refuses it: "Invalid IPv6 URL").
    rest = url[len("sentinel://"):]
    cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0),
              default=len(rest))
    netloc = rest[:cut]
    parts = urlsplit("sentinel://h" + rest[cut:])
    userinfo, at, hostlist = netloc.rpartition("@")
    if not at:
        userinfo, hostlist = "", netloc
    user, colon, password = userinfo.partition(":")
    query = parse_qs(parts.query)
    masters = query.get("master") or query.get("master_name")
    if not masters:
        raise ValueError("sentinel URL: name the monitored primary with ?master=NAME")
    addresses = [a for a in hostlist.split(",") if a]
    if not addresses:
        raise ValueError("sentinel URL: name at least one sentinel as HOST:PORT")
    db_text = parts.path.strip("/") or "0"
    if not db_text.isdigit():
        raise ValueError(f"sentinel URL: invalid database number {db_text!r}")
    secret = query.get("sentinel_password")
    return SentinelTarget(
        sentinels=tuple(_parse_sentinel(a) for a in addresses), master=masters[0],
        username=unquote(user) or None, password=unquote(password) if colon else None,
        db=int(db_text), sentinel_password=secret[0] if secret else None,
    )


def safe_url(url: str) -> str:
    """The URL with its passwords hidden: what messages and logs may show."""
    target = sentinel_target(url) if url.startswith("sentinel://") else None
    if target is None:
        return _masked(url)
    auth = f"{target.username or ''}:**@" if target.password is not None else ""
    hosts = ",".join(f"{_host_text(h)}:{p}" for h, p in target.sentinels)
    extra = "&sentinel_password=**" if target.sentinel_password is not None else ""
    return f"sentinel://{auth}{hosts}/{target.db}?master={target.master}{extra}"


def _masked(url: str) -> str:
    """A `redis://`, `rediss://` or `unix://` URL with its password shown as `**` and its
    query left out (it may carry one: `?password=`), as kombu's `maybe_sanitize_url`
    shows it (but an IPv6 host keeps its brackets)."""
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        hostport = f"{user}{':**' if colon else ''}@{hostport}"
    return f"{parts.scheme}://{hostport}{parts.path or '/'}"


#: How long a write that must survive a failover waits for a replica to acknowledge it.
REPLICA_ACK_TIMEOUT_MS = 200


def _sentinel_kwargs(target: SentinelTarget) -> dict[str, Any]:
    """Connection settings of the sentinels themselves (timeouts, their password)."""
    kwargs: dict[str, Any] = {
        "socket_connect_timeout": CONNECT_TIMEOUT_S, "socket_timeout": CONNECT_TIMEOUT_S,
    }
    if target.sentinel_password is not None:
        kwargs["password"] = target.sentinel_password
    return kwargs


def _primary_kwargs(target: SentinelTarget) -> dict[str, Any]:
    """Connection settings of the primary the sentinels point at."""
    return {
        "username": target.username, "password": target.password, "db": target.db,
        "socket_connect_timeout": CONNECT_TIMEOUT_S, "socket_timeout": SOCKET_TIMEOUT_S,
        "health_check_interval": HEALTH_CHECK_INTERVAL_S, "decode_responses": True,
        "max_connections": POOL_MAX_CONNECTIONS,
    }


def async_redis_client(url: str, *, binary: bool = False) -> AsyncRedis:
    """`redis_client` for asyncio (`bashfleet.client.aio.AsyncFleet`): the same URL forms and
    timeouts, text replies (`binary`: bytes). Bound to the event loop that first uses
    it."""
    import redis.asyncio as aioredis  # noqa: PLC0415 - see `__getattr__`
    import redis.asyncio.retry as aioretry  # noqa: PLC0415
    import redis.asyncio.sentinel as aiosentinel  # noqa: PLC0415

    target = sentinel_target(url)
    if target is not None:
        sentinel = aiosentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(target.sentinels), sentinel_kwargs=_sentinel_kwargs(target)
        )
        return cast("AsyncRedis", sentinel.master_for(
            target.master, **{**_primary_kwargs(target), "decode_responses": not binary,
                              "retry": _no_retry(aioretry.Retry)}))
    return aioredis.Redis.from_url(
        url, decode_responses=not binary, socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=SOCKET_TIMEOUT_S, health_check_interval=HEALTH_CHECK_INTERVAL_S,
        max_connections=POOL_MAX_CONNECTIONS, retry=_no_retry(aioretry.Retry),
    )


class Script:
    """A Lua script of `bashfleet.worker.wire.lua` run with EVALSHA (loaded on first use,
    and again after a restart).

    Redis runs a script atomically, so a read-check-write needs one round trip and no
    WATCH retry loop: what the hot path of every call (submit, claim, finish) uses.
    """

    def __init__(self, source: str) -> None:
        self.source = lua.PRELUDE + source
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()  # noqa: S324 - Redis' id

    def __call__(self, client: Redis, keys: list[str], args: list[object]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)  # type: ignore[arg-type]
        except _no_script_errors():
            # Not loaded yet (or Redis restarted): EVAL runs it and caches it.
            return client.eval(self.source, len(keys), *keys, *args)  # type: ignore[arg-type]

    def run_durable(self, client: Redis, keys: list[str], args: list[object]) -> Any:
        """`self(...)`, then, on a primary with replicas (`ReplicatedRedis`), wait until
        one acknowledged the script's writes (WAIT, on the same connection: one pipeline,
        one round trip). A replica slower than REPLICA_ACK_TIMEOUT_MS is not waited for
        longer: the write stands, unacknowledged."""
        if not _waits_for_replica(client):
            return self(client, keys, args)
        with client.pipeline(transaction=False) as pipe:
            pipe.eval(self.source, len(keys), *keys, *args)  # type: ignore[arg-type]
            pipe.execute_command("WAIT", 1, REPLICA_ACK_TIMEOUT_MS)  # type: ignore[no-untyped-call]
            result, _acknowledged = pipe.execute()
        return result

    def send(self, client: Redis, keys: list[str], args: list[object]) -> SentScript:
        """Send the script now and read its answer later (`SentScript.answer`): its round
        trip overlaps what the caller does meanwhile. On a primary with replicas it runs
        durably at once instead (`run_durable`: the acknowledgement is waited for)."""
        return SentScript(self, client, keys, args)

    async def run_async(self, client: AsyncRedis, keys: list[str], args: list[object]) -> Any:
        """`self(...)` on an asyncio client."""
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)  # type: ignore[arg-type]
        except _no_script_errors():
            return await client.eval(self.source, len(keys), *keys, *args)  # type: ignore[arg-type]


def _waits_for_replica(client: Redis) -> bool:
    """Whether a script's writes on `client` wait for a replica's acknowledgement: a
    primary behind Sentinel (`ReplicatedRedis`) that has replicas now."""
    from bashfleet.worker.fleet.replicated import ReplicatedRedis  # noqa: PLC0415

    return isinstance(client, ReplicatedRedis) and client.connected_replicas() > 0


class SentScript:
    """A script sent on a connection of its own, its answer not read yet.

    The connection stays out of the pool until `answer` read the reply (or dropped the
    connection on an error), so nothing else can read this reply; `answer` returns the
    same value, or raises the same error, every time it is asked.
    """

    def __init__(self, script: Script, client: Redis, keys: list[str],
                 args: list[object]) -> None:
        self._script, self._client, self._keys, self._args = script, client, keys, args
        self._value: Any = None
        self._error: BaseException | None = None
        self._connection: Any = None
        pool = getattr(client, "connection_pool", None)
        if pool is None or _waits_for_replica(client):
            # The CLI's light client has no pool of its own to borrow from.
            self._value = script.run_durable(client, keys, args)
            return
        connection = pool.get_connection()
        try:
            connection.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except BaseException:
            connection.disconnect()
            pool.release(connection)
            raise
        self._connection = connection

    def answer(self) -> Any:
        """The script's return value (read once; EVAL'd again when Redis did not hold
        the script); the Redis error it met, raised again at every ask."""
        connection, self._connection = self._connection, None
        if connection is not None:
            self._read(connection)
        if self._error is not None:
            raise self._error
        return self._value

    def _read(self, connection: Any) -> None:
        pool = self._client.connection_pool
        try:
            self._value = self._client.parse_response(  # type: ignore[no-untyped-call]
                connection, "EVALSHA")
        except _no_script_errors():
            pool.release(connection)
            connection = None
            try:
                self._value = self._script(self._client, self._keys, self._args)
            except redis_errors() as exc:
                self._error = exc
        except BaseException as exc:
            # A reply half read (or never read) leaves the connection unusable.
            connection.disconnect()
            if not isinstance(exc, redis_errors()):
                raise
            self._error = exc
        finally:
            if connection is not None:
                pool.release(connection)


def transaction(client: Redis, keys: list[str], body: Callable[[Any], T]) -> T:
    """Run `body(pipe)` under WATCH on `keys`, retrying when another client raced us.

    `body` reads with the pipe in immediate mode, then calls `pipe.multi()` and queues
    its writes; its return value is returned once the transaction committed.
    """
    while True:
        with client.pipeline() as pipe:
            try:
                pipe.watch(*keys)  # type: ignore[no-untyped-call]
                value = body(pipe)
                pipe.execute()
                return value
            except watch_errors():
                continue


def hash_fields(values: Mapping[str, object]) -> dict[Any, Any]:
    """Hash values as text; None is stored as "" (and read back as None).

    Typed `Any`: redis-py's `hset(mapping=)` takes an invariant Mapping of its own
    key and value unions, which no `dict[str, str]` is.
    """
    return {k: "" if v is None else str(v) for k, v in values.items()}


def flat_fields(values: Mapping[str, object]) -> list[object]:
    """Hash fields as the flat name, value list a script passes to HSET."""
    return [item for pair in hash_fields(values).items() for item in pair]
