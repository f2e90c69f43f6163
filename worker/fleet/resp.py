"""A small synchronous Redis client: the commands a CLI's call sends, spoken in RESP2 over
one socket each, with the standard library alone.

redis-py takes longer to import than a `bashfleet run` takes to send its call and hear
its answer (it loads asyncio, its cluster client and its metrics whatever is used). A
CLI process (`connect.use_light_client`) talks to a `redis://` or `unix://` Redis
through this client instead: the commands below, pipelines of them, EVALSHA and a
subscription. Anything else it is asked for (a WATCH transaction, a command not listed
here) goes to a redis-py client of the same URL, made on first need, so every caller
gets the answer redis-py would give. TLS and Sentinel URLs never come here
(`connect.redis_client` keeps redis-py for them).

Errors: a connection that fails or times out is an OSError (`ConnectionError`,
`TimeoutError`), as the client's guards already treat it; an error the server answers
is a `ResponseError` (`NoScriptError` for NOSCRIPT; a refused login is a
`ConnectionError`, as redis-py says it).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

#: The URL schemes this client speaks (TLS and Sentinel stay with redis-py).
SCHEMES = ("redis", "unix")


class ResponseError(Exception):
    """An error the server answered (`-ERR ...`)."""


class NoScriptError(ResponseError):
    """EVALSHA of a script the server does not hold (it restarted, or never ran it)."""


class NoPermissionError(ResponseError):
    """A command the server's ACL does not allow this user (NOPERM)."""


class Incomplete(Exception):  # noqa: N818 - a parser's state, not an error anyone sees
    """The buffer ends before the reply does: read more."""


# ------------------------------------------------------------------------- the wire


def encode(args: Sequence[object]) -> bytes:
    """One command as RESP2 (an array of bulk strings); ints and floats as their text."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, bool):  # redis-py refuses these; so does this client
            raise TypeError("a bool is not a Redis value: send 0/1 or a string")
        elif isinstance(arg, int | float):
            data = repr(arg).encode()
        else:
            raise TypeError(f"{type(arg).__name__} is not a Redis value")
        out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(out)


def parse(buffer: bytes | bytearray, start: int = 0) -> tuple[Any, int]:  # noqa: PLR0911
    """The reply at `start` of `buffer` and where it ends. Incomplete when the buffer ends
    first. Bulk strings are bytes; an error reply is a ResponseError (returned, not
    raised: it belongs to its command, and a pipeline's later replies still follow)."""
    end = buffer.find(b"\r\n", start)
    if end < 0:
        raise Incomplete
    kind, line, after = buffer[start:start + 1], bytes(buffer[start + 1:end]), end + 2
    if kind == b"+":
        return line, after
    if kind == b"-":
        text = line.decode("utf-8", "replace")
        error = {"NOSCRIPT": NoScriptError, "NOPERM": NoPermissionError}.get(
            text.split(" ", 1)[0], ResponseError)
        return error(text), after
    if kind == b":":
        return int(line), after
    if kind == b"$":
        size = int(line)
        if size < 0:
            return None, after
        if len(buffer) < after + size + 2:
            raise Incomplete
        return bytes(buffer[after:after + size]), after + size + 2
    if kind == b"*":
        count = int(line)
        if count < 0:
            return None, after
        items = []
        for _ in range(count):
            item, after = parse(buffer, after)
            items.append(item)
        return items, after
    raise ConnectionError(f"Protocol error: unexpected reply type {kind!r}")


def decoded(value: Any) -> Any:
    """Bytes as text, through lists (decode_responses, as redis-py's)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list):
        return [decoded(item) for item in value]
    return value


def _pairs(value: Any) -> dict[Any, Any]:
    return dict(zip(value[::2], value[1::2], strict=True)) if value else {}


def _ok(value: Any) -> Any:
    return value in (b"OK", "OK") if isinstance(value, bytes | str) else value


#: How each command's reply is shaped (what redis-py returns); the others as they come.
SHAPES: dict[str, Callable[[Any], Any]] = {
    "HGETALL": _pairs, "EXISTS": int, "DEL": int, "SET": _ok,
    "PING": lambda value: value in (b"PONG", "PONG"),
    "EXPIRE": bool, "HSET": int, "SISMEMBER": bool, "SMEMBERS": set,
}

#: The commands this client sends itself (the others go to redis-py), by redis-py's
#: method name.
COMMANDS: dict[str, str] = {
    "get": "GET", "mget": "MGET", "set": "SET", "delete": "DEL", "exists": "EXISTS",
    "expire": "EXPIRE", "hget": "HGET", "hgetall": "HGETALL", "hmget": "HMGET",
    "hset": "HSET", "hdel": "HDEL", "lpush": "LPUSH", "rpush": "RPUSH", "llen": "LLEN",
    "lrange": "LRANGE", "zrange": "ZRANGE", "zrangebyscore": "ZRANGEBYSCORE",
    "zrem": "ZREM", "zcard": "ZCARD",
    "scard": "SCARD", "sadd": "SADD", "srem": "SREM", "smembers": "SMEMBERS",
    "sismember": "SISMEMBER", "publish": "PUBLISH", "ping": "PING", "evalsha": "EVALSHA",
    "eval": "EVAL",
}

#: Positional arguments of the methods whose further ones redis-py reads as options
#: (`set(k, v, 5)` is `ex=5`, `zrange(k, 0, -1, True)` is `desc=True`): past these,
#: the call is redis-py's. The others take any number (keys, members, fields).
ARITY: dict[str, int] = {
    "get": 1, "set": 2, "expire": 2, "hget": 2, "hgetall": 1, "hset": 3, "llen": 1,
    "lrange": 3, "zrange": 3, "zrangebyscore": 3, "zcard": 1, "scard": 1, "smembers": 1,
    "sismember": 2, "publish": 2, "ping": 0,
}


def command_args(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[object] | None:
    """The RESP arguments of a redis-py style call `name(*args, **kwargs)`; None when this
    client does not lay it out (keyword options, a command it does not know)."""
    command = COMMANDS.get(name)
    if command is None or kwargs:
        return None
    if name == "hmget" and len(args) == 2 and isinstance(args[1], list | tuple):
        return [command, args[0], *args[1]]  # hmget(key, [fields]), as the client calls it
    if name == "mget" and len(args) == 1 and isinstance(args[0], list | tuple):
        return [command, *args[0]]  # mget([keys])
    if len(args) > ARITY.get(name, len(args)):
        return None
    flat: list[object] = [command]
    for arg in args:
        if isinstance(arg, list | tuple):
            return None  # another form of a list argument: redis-py knows it
        flat.append(arg)
    return flat


# ------------------------------------------------------------------------ a connection


class Target:
    """Where a `redis://` or `unix://` URL points and how to log in."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in SCHEMES:
            raise ValueError(f"not a redis:// or unix:// URL: {parts.scheme}://")
        query = {name: values[0] for name, values in parse_qs(parts.query).items()}
        # The forms redis-py reads: in the netloc, or as `?username=` / `?password=`.
        self.username = unquote(parts.username) if parts.username else query.get("username")
        self.password = (unquote(parts.password) if parts.password is not None
                         else query.get("password"))
        self.path: str | None = None
        self.host, self.port = "localhost", 6379
        if parts.scheme == "unix":
            self.path = unquote(parts.path)
            db = query.get("db", "0")
        else:
            self.host = parts.hostname or "localhost"
            self.port = parts.port or 6379
            db = (parts.path or "/").lstrip("/") or query.get("db", "0")
        self.db = int(db or 0)

    def where(self) -> str:
        return self.path if self.path is not None else f"{self.host}:{self.port}"


def _tcp(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to the first address of `host` that takes one.

    An ASCII host name is looked up as bytes: a str is encoded with the IDNA codec
    first, whose import (stringprep, unicodedata) a CLI's call would pay for nothing."""
    name: str | bytes = host.encode("ascii") if host.isascii() else host
    error: OSError | None = None
    for family, kind, proto, _, address in socket.getaddrinfo(name, port,
                                                              type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        sock.settimeout(timeout)
        try:
            sock.connect(address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        return sock
    raise error or OSError(f"no address for {host}")


class Connection:
    """One socket to Redis, logged in and on its database."""

    def __init__(self, target: Target, connect_timeout: float, timeout: float) -> None:
        self.target = target
        self.timeout = timeout
        self._buffer = bytearray()
        try:
            if target.path is not None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(connect_timeout)
                self.sock.connect(target.path)
            else:
                self.sock = _tcp(target.host, target.port, connect_timeout)
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            # Said as redis-py says it: what a person reads in "Redis at URL is unreachable".
            raise ConnectionError(
                f"Error {exc.errno} connecting to {target.where()}. "
                f"{exc.strerror or exc}.") from None
        self.sock.settimeout(timeout)
        try:
            self._login()
        except BaseException:
            self.close()
            raise

    def _login(self) -> None:
        setup: list[list[object]] = []
        if self.target.password is not None:
            setup.append(["AUTH", *([self.target.username] if self.target.username else []),
                          self.target.password])
        if self.target.db:
            setup.append(["SELECT", self.target.db])
        if not setup:
            return
        for reply in self.round_trip(setup):
            if isinstance(reply, ResponseError):
                # A refused login is a connection the server will not serve (redis-py's
                # AuthenticationError is a ConnectionError too).
                raise ConnectionError(str(reply))

    def send(self, commands: Sequence[Sequence[object]]) -> None:
        data = b"".join(encode(command) for command in commands)
        try:
            self.sock.sendall(data)
        except TimeoutError:
            raise TimeoutError(f"Timeout writing to {self.target.where()}") from None
        except OSError as exc:
            raise ConnectionError(f"Error writing to {self.target.where()}: {exc}") from None

    def read(self, timeout: float | None = None) -> Any:
        """The next reply; None when `timeout` (when given) passed first."""
        while True:
            try:
                value, end = parse(self._buffer)
            except Incomplete:
                pass
            else:
                del self._buffer[:end]
                return value
            if timeout is not None:
                self.sock.settimeout(timeout)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                if timeout is not None:
                    return None
                raise TimeoutError(f"Timeout reading from {self.target.where()}") from None
            except OSError as exc:
                raise ConnectionError(
                    f"Error reading from {self.target.where()}: {exc}") from None
            finally:
                if timeout is not None:
                    self.sock.settimeout(self.timeout)
            if not data:
                raise ConnectionError(f"Connection closed by server ({self.target.where()}).")
            self._buffer += data

    def round_trip(self, commands: Sequence[Sequence[object]]) -> list[Any]:
        """Send the commands at once and read their replies, in order."""
        self.send(commands)
        return [self.read() for _ in commands]

    def close(self) -> None:
        with suppress(OSError):
            self.sock.close()


# --------------------------------------------------------------------------- the client


class LightRedis:
    """A thread-safe client of one Redis (a pool of connections), shaped as the part of
    `redis.Redis` the fleet client calls; the rest through redis-py (`fallback`)."""

    def __init__(self, url: str, *, decode_responses: bool = True, connect_timeout: float,
                 timeout: float, fallback: Callable[[], Any]) -> None:
        self.target = Target(url)
        self.decode_responses = decode_responses
        self._connect_timeout = connect_timeout
        self._timeout = timeout
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self._make_fallback = fallback
        self._fallback: Any = None

    # --------------------------------------------------------------- connections

    def connection(self) -> Connection:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return Connection(self.target, self._connect_timeout, self._timeout)

    @contextmanager
    def _borrowed(self) -> Iterator[Connection]:
        conn = self.connection()
        try:
            yield conn
        except BaseException:
            conn.close()  # mid-reply or broken: never reused
            raise
        with self._lock:
            self._idle.append(conn)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        if self._fallback is not None:
            self._fallback.close()

    # ------------------------------------------------------------------ commands

    def _value(self, command: str, reply: Any) -> Any:
        if isinstance(reply, ResponseError):
            raise reply
        shape = SHAPES.get(command)
        value = decoded(reply) if self.decode_responses else reply
        return shape(value) if shape is not None else value

    def execute_command(self, *args: Any) -> Any:
        with self._borrowed() as conn:
            (reply,) = conn.round_trip([args])
        return self._value(str(args[0]).upper(), reply)

    def fallback(self) -> Any:
        """The redis-py client of the same URL (made on first need)."""
        with self._lock:
            if self._fallback is None:
                self._fallback = self._make_fallback()
            return self._fallback

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in COMMANDS:
            return getattr(self.fallback(), name)

        def method(*args: Any, **kwargs: Any) -> Any:
            flat = command_args(name, args, kwargs)
            if flat is None:
                return getattr(self.fallback(), name)(*args, **kwargs)
            return self.execute_command(*flat)

        return method

    def pipeline(self, transaction: bool = True) -> Any:
        """Commands sent together (no MULTI); a transaction is redis-py's."""
        if transaction:
            return self.fallback().pipeline(transaction=True)
        return Pipeline(self)

    def pubsub(self) -> PubSub:
        return PubSub(self)


class Pipeline:
    """Commands queued and sent in one write, their replies read in order; one this client
    cannot lay out sends the whole pipeline through redis-py instead."""

    def __init__(self, client: LightRedis) -> None:
        self._client = client
        self._calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self._calls.clear()

    def __getattr__(self, name: str) -> Callable[..., Pipeline]:
        if name.startswith("_"):
            raise AttributeError(name)

        def queue(*args: Any, **kwargs: Any) -> Pipeline:
            self._calls.append((name, args, kwargs))
            return self

        return queue

    def execute(self) -> list[Any]:
        calls, self._calls = self._calls, []
        commands = [command_args(name, args, kwargs) for name, args, kwargs in calls]
        if not all(commands):
            with self._client.fallback().pipeline(transaction=False) as pipe:
                for name, args, kwargs in calls:
                    getattr(pipe, name)(*args, **kwargs)
                return list(pipe.execute())
        flat = [command for command in commands if command is not None]
        if not flat:
            return []
        with self._client._borrowed() as conn:
            replies = conn.round_trip(flat)
        return [self._client._value(str(command[0]), reply)
                for command, reply in zip(flat, replies, strict=True)]


class PubSub:
    """A subscription on a connection of its own: `subscribe`, `get_message`, `close`."""

    def __init__(self, client: LightRedis) -> None:
        self._client = client
        self._conn: Connection | None = None

    def subscribe(self, *channels: str) -> None:
        if self._conn is None:
            self._conn = self._client.connection()
        self._conn.send([["SUBSCRIBE", *channels]])

    def get_message(self, timeout: float = 0.0) -> dict[str, Any] | None:
        """The next message or subscription notice; None when none came within `timeout`."""
        if self._conn is None:
            return None
        reply = self._conn.read(timeout=max(timeout, 0.0001))
        if reply is None:
            return None
        if isinstance(reply, ResponseError):
            raise reply
        kind, channel, data = (decoded(reply[0]), decoded(reply[1]), reply[2])
        if self._client.decode_responses:
            data = decoded(data)
        return {"type": kind, "pattern": None, "channel": channel, "data": data}

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
