"""The light Redis client's wire (`bashfleet.worker.fleet.resp`): what it sends, how it
reads replies (whole or cut anywhere), and how a redis-py style call is laid out."""

from __future__ import annotations

from typing import Any

import pytest

from bashfleet.worker.fleet import resp


@pytest.mark.parametrize(("args", "wire"), [
    (["PING"], b"*1\r\n$4\r\nPING\r\n"),
    (["GET", "k"], b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"),
    (["SET", "k", "é"], b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n\xc3\xa9\r\n"),
    (["LRANGE", "q", 0, -1], b"*4\r\n$6\r\nLRANGE\r\n$1\r\nq\r\n$1\r\n0\r\n$2\r\n-1\r\n"),
    (["EVALSHA", b"\x00\r\n", 1.5], b"*3\r\n$7\r\nEVALSHA\r\n$3\r\n\x00\r\n\r\n$3\r\n1.5\r\n"),
    (["SET", "k", ""], b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"),
])
def test_encode(args: list[object], wire: bytes) -> None:
    assert resp.encode(args) == wire


@pytest.mark.parametrize("value", [True, None, [1], {"a": 1}])
def test_encode_refuses_what_is_not_a_redis_value(value: object) -> None:
    with pytest.raises(TypeError):
        resp.encode(["SET", "k", value])


@pytest.mark.parametrize(("wire", "value"), [
    (b"+OK\r\n", b"OK"),
    (b":42\r\n", 42),
    (b":-1\r\n", -1),
    (b"$5\r\nhello\r\n", b"hello"),
    (b"$0\r\n\r\n", b""),
    (b"$-1\r\n", None),
    (b"*-1\r\n", None),
    (b"$4\r\na\r\nb\r\n", b"a\r\nb"),  # a bulk string holds CR LF as data
    (b"*3\r\n$1\r\na\r\n:1\r\n*1\r\n$-1\r\n", [b"a", 1, [None]]),
    (b"*0\r\n", []),
])
def test_parse_whole_replies(wire: bytes, value: Any) -> None:
    assert resp.parse(wire + b"+next\r\n") == (value, len(wire))


@pytest.mark.parametrize(("wire", "kind"), [
    (b"-ERR unknown command\r\n", resp.ResponseError),
    (b"-NOSCRIPT No matching script\r\n", resp.NoScriptError),
    (b"-NOPERM this user has no permissions\r\n", resp.NoPermissionError),
    (b"-WRONGPASS invalid username-password pair\r\n", resp.ResponseError),
])
def test_an_error_reply_is_returned_as_its_error(wire: bytes, kind: type[Exception]) -> None:
    value, end = resp.parse(wire)
    assert type(value) is kind
    assert str(value) == wire[1:-2].decode()
    assert end == len(wire)


@pytest.mark.parametrize("wire", [
    b"+OK\r\n", b"$5\r\nhello\r\n", b"*3\r\n$1\r\na\r\n:1\r\n*1\r\n$-1\r\n",
    b"-ERR x\r\n", b"$4\r\na\r\nb\r\n",
])
def test_a_reply_cut_anywhere_is_incomplete_until_whole(wire: bytes) -> None:
    for cut in range(len(wire)):
        with pytest.raises(resp.Incomplete):
            resp.parse(wire[:cut])
    assert resp.parse(wire)[1] == len(wire)


def test_an_unknown_reply_type_is_a_broken_connection() -> None:
    with pytest.raises(ConnectionError):
        resp.parse(b"%1\r\n")


@pytest.mark.parametrize(("name", "args", "kwargs", "flat"), [
    ("get", ("k",), {}, ["GET", "k"]),
    ("hmget", ("h", ["a", "b"]), {}, ["HMGET", "h", "a", "b"]),
    ("hmget", ("h", "a", "b"), {}, ["HMGET", "h", "a", "b"]),
    ("mget", (["a", "b"],), {}, ["MGET", "a", "b"]),
    ("delete", ("a", "b"), {}, ["DEL", "a", "b"]),
    ("evalsha", ("sha", 1, "k", "v"), {}, ["EVALSHA", "sha", 1, "k", "v"]),
    ("lrange", ("q", 0, -1), {}, ["LRANGE", "q", 0, -1]),
    # What it does not lay out goes to redis-py: keyword options, lists elsewhere,
    # commands it does not know.
    ("set", ("k", "v"), {"ex": 5}, None),
    ("set", ("k", "v", 5), {}, None),  # redis-py's `ex`, positionally
    ("zrange", ("z", 0, -1, True), {}, None),  # `desc`
    ("zrangebyscore", ("z", 0, "+inf", 0, 10), {}, None),  # `start`, `num`
    ("set", ("k", "v"), {}, ["SET", "k", "v"]),
    ("lpush", ("q", ["a"]), {}, None),
    ("xadd", ("s", {"a": 1}), {}, None),
])
def test_command_args(name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                      flat: list[object] | None) -> None:
    assert resp.command_args(name, args, kwargs) == flat


@pytest.mark.parametrize(("url", "where", "user", "password", "db"), [
    ("redis://127.0.0.1:6390/0", "127.0.0.1:6390", None, None, 0),
    ("redis://:pw@localhost:7000/3", "localhost:7000", None, "pw", 3),
    ("redis://bf-client:p%40ss@[::1]:6379", "::1:6379", "bf-client", "p@ss", 0),
    ("redis://h", "h:6379", None, None, 0),
    ("unix:///run/redis.sock?db=2", "/run/redis.sock", None, None, 2),
    ("unix://:pw@/tmp/r.sock", "/tmp/r.sock", None, "pw", 0),
    ("unix:///tmp/r.sock?db=1&password=p%26w&username=u", "/tmp/r.sock", "u", "p&w", 1),
    ("redis://127.0.0.1:6390?password=pw&db=4", "127.0.0.1:6390", None, "pw", 4),
])
def test_target(url: str, where: str, user: str | None, password: str | None,
                db: int) -> None:
    target = resp.Target(url)
    assert (target.where(), target.username, target.password, target.db) == (
        where, user, password, db)


@pytest.mark.parametrize("url", ["rediss://h:6379", "sentinel://h:26379?master=m"])
def test_tls_and_sentinel_are_not_its_own(url: str) -> None:
    with pytest.raises(ValueError, match="not a redis:// or unix:// URL"):
        resp.Target(url)


@pytest.mark.parametrize(("value", "text"), [
    (b"a", "a"), ([b"a", [b"b", None, 1]], ["a", ["b", None, 1]]), (None, None), (3, 3),
])
def test_decoded(value: Any, text: Any) -> None:
    assert resp.decoded(value) == text
