"""The light Redis client (`bashfleet.worker.fleet.resp`) against a real Redis: every
answer it gives is the one redis-py gives for the same command, through its pipelines,
scripts, subscription and the redis-py fallback; logins (password, ACL user) and a Redis
that is not there."""

from __future__ import annotations

import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from bashfleet.client.redis_server import RedisServer, find_redis_server
from bashfleet.worker.fleet import connect, resp
from bashfleet.worker.wire import acl

from .conftest import wait_for


def light(url: str, *, binary: bool = False) -> resp.LightRedis:
    """The light client, as `connect.redis_client` makes it in a light process."""
    return resp.LightRedis(url, decode_responses=not binary, connect_timeout=2.0,
                           timeout=5.0, fallback=lambda: redis.Redis.from_url(
                               url, decode_responses=not binary))


@pytest.fixture
def pair(redis_server: RedisServer) -> Iterator[tuple[resp.LightRedis, redis.Redis]]:
    """The light client and redis-py, of the same Redis."""
    ours, theirs = light(redis_server.url), redis.Redis.from_url(redis_server.url,
                                                                 decode_responses=True)
    yield ours, theirs
    ours.close()
    theirs.close()


def test_every_command_answers_as_redis_py(pair: tuple[resp.LightRedis, redis.Redis]) -> None:
    ours, theirs = pair
    key = f"test:resp:{secrets.token_hex(4)}"
    theirs.hset(f"{key}:h", mapping={"a": "1", "b": "é"})
    theirs.rpush(f"{key}:l", "x", "y")
    theirs.zadd(f"{key}:z", {"m1": 1, "m2": 2})
    theirs.sadd(f"{key}:s", "s1")
    theirs.set(f"{key}:k", "v")
    reads: list[tuple[str, tuple[Any, ...]]] = [
        ("get", (f"{key}:k",)), ("get", (f"{key}:none",)),
        ("mget", ([f"{key}:k", f"{key}:none"],)),
        ("hgetall", (f"{key}:h",)), ("hgetall", (f"{key}:none",)),
        ("hmget", (f"{key}:h", ["a", "zz", "b"])), ("hget", (f"{key}:h", "b")),
        ("llen", (f"{key}:l",)), ("lrange", (f"{key}:l", 0, -1)),
        ("zrange", (f"{key}:z", 0, -1)), ("zcard", (f"{key}:z",)),
        ("zrangebyscore", (f"{key}:z", 2, "+inf")),
        ("scard", (f"{key}:s",)), ("smembers", (f"{key}:s",)),
        ("sismember", (f"{key}:s", "s1")),
        ("exists", (f"{key}:k",)), ("exists", (f"{key}:none",)),
    ]
    for name, args in reads:
        assert getattr(ours, name)(*args) == getattr(theirs, name)(*args), name
    with ours.pipeline(transaction=False) as pipe:
        for name, args in reads:
            getattr(pipe, name)(*args)
        answers = pipe.execute()
    with theirs.pipeline(transaction=False) as pipe:
        for name, args in reads:
            getattr(pipe, name)(*args)
        assert answers == pipe.execute()
    # Writes: each answers as redis-py's, and did what it says.
    assert ours.lpush(f"{key}:l", "w") == 3
    assert theirs.lindex(f"{key}:l", 0) == "w"
    assert ours.set(f"{key}:k2", "v2") is True
    assert ours.expire(f"{key}:k2", 60) is True
    assert 0 < theirs.ttl(f"{key}:k2") <= 60
    assert ours.zrem(f"{key}:z", "m1") == 1
    assert ours.delete(f"{key}:k", f"{key}:k2", f"{key}:none") == 2
    assert theirs.exists(f"{key}:k", f"{key}:k2") == 0
    theirs.delete(f"{key}:h", f"{key}:l", f"{key}:z", f"{key}:s")


def test_bytes_when_asked(redis_server: RedisServer) -> None:
    client = light(redis_server.url, binary=True)
    key = f"test:resp:{secrets.token_hex(4)}"
    data = bytes(range(256)) * 3
    assert client.set(key, data) is True
    assert client.get(key) == data
    client.delete(key)
    client.close()


def test_scripts_load_on_first_use(pair: tuple[resp.LightRedis, redis.Redis]) -> None:
    ours, theirs = pair
    key = f"test:resp:{secrets.token_hex(4)}"
    script = connect.Script(f"return redis.call('INCRBY', KEYS[1], ARGV[1]) -- {key}")
    assert theirs.script_exists(script.sha) == [False]
    client = cast(redis.Redis, ours)  # what `connect.redis_client` hands out
    assert script(client, [key], [5]) == 5  # NOSCRIPT, then EVAL
    assert theirs.script_exists(script.sha) == [True]
    assert script(client, [key], [2]) == 7  # EVALSHA
    with pytest.raises(resp.ResponseError, match="ERR"):
        ours.evalsha(script.sha, 1, key, "not a number")
    theirs.delete(key)


def test_what_it_does_not_speak_goes_to_redis_py(
    pair: tuple[resp.LightRedis, redis.Redis],
) -> None:
    ours, theirs = pair
    key = f"test:resp:{secrets.token_hex(4)}"
    assert ours.set(key, "v", ex=30) is True  # a keyword option
    assert 0 < theirs.ttl(key) <= 30
    assert ours.incr(key + ":n") == 1  # a command it does not know
    assert ours._fallback is not None
    # A pipeline with one command it cannot lay out runs whole in redis-py.
    with ours.pipeline(transaction=False) as pipe:
        pipe.get(key)
        pipe.set(key, "w", ex=30)
        pipe.get(key)
        assert pipe.execute() == ["v", True, "w"]
    # A WATCH transaction is redis-py's.
    def body(pipe: Any) -> Any:
        seen = pipe.get(key)
        pipe.multi()
        pipe.set(key, "t")
        return seen

    assert connect.transaction(cast(redis.Redis, ours), [key], body) == "w"
    assert theirs.get(key) == "t"
    theirs.delete(key, key + ":n")


def test_subscription(pair: tuple[resp.LightRedis, redis.Redis]) -> None:
    ours, theirs = pair
    channel = f"test:resp:{secrets.token_hex(4)}"
    pubsub = ours.pubsub()
    pubsub.subscribe(channel)
    first = wait_for(lambda: pubsub.get_message(timeout=0.2), 10, "the subscription")
    assert first is not None
    assert (first["type"], first["channel"], first["data"]) == ("subscribe", channel, 1)
    assert pubsub.get_message(timeout=0.05) is None  # nothing published: none
    wait_for(lambda: theirs.publish(channel, "hello é") == 1, 10, "a subscriber")
    message = wait_for(lambda: pubsub.get_message(timeout=0.2), 10, "the message")
    assert message is not None
    assert (message["type"], message["channel"], message["data"]) == (
        "message", channel, "hello é")
    pubsub.close()
    wait_for(lambda: theirs.publish(channel, "gone") == 0, 10, "the subscriber gone")


def test_a_connection_is_reused(
    pair: tuple[resp.LightRedis, redis.Redis],
) -> None:
    ours, theirs = pair
    name = f"resp-{secrets.token_hex(3)}"
    ours.execute_command("CLIENT", "SETNAME", name)
    for _ in range(5):
        ours.get("test:resp:none")
    clients = [line for line in theirs.client_list() if line["name"] == name]
    assert len(clients) == 1  # one connection, back in the pool after each command


def test_logins(tmp_path: Path) -> None:
    """The default user's password, an ACL user, and a wrong password: refused as a
    ConnectionError that names no password."""
    password, client_password = secrets.token_hex(12), secrets.token_hex(12)
    with RedisServer(tmp_path / "acl", password=password,
                     client_password=client_password) as server:
        assert server.client_url is not None
        for url in (server.url, server.client_url):
            client = light(url)
            assert client.ping() is True
            client.close()
        wrong = server.client_url.replace(client_password, "wrong" + client_password[5:])
        with pytest.raises(ConnectionError) as refused:
            light(wrong).get("x")
        assert client_password not in str(refused.value)
        assert "wrong" not in str(refused.value)
        assert acl.CLIENT_USER in server.client_url


def test_a_redis_that_is_not_there_fails_at_once() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = light(f"redis://:pw@127.0.0.1:{port}/0")
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=f"connecting to 127.0.0.1:{port}"):
        client.get("x")
    assert time.monotonic() - started < 2.0


def test_a_unix_socket(tmp_path: Path) -> None:
    """A `unix://` URL (with a password), spoken to as a TCP one is."""
    path, password = tmp_path / "redis.sock", secrets.token_hex(12)
    server = subprocess.Popen(
        [find_redis_server(), "--port", "0", "--unixsocket", str(path), "--requirepass",
         password, "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(path.exists, 20, "the server's socket")
        client = light(f"unix://:{password}@{path}?db=2")
        wait_for(lambda: _answers(client), 20, "the server")
        assert client.set("k", "v") is True
        assert client.get("k") == "v"
        assert redis.Redis.from_url(f"unix://:{password}@{path}?db=2").get("k") == b"v"
        client.close()
    finally:
        server.terminate()
        server.wait(20)


def _answers(client: resp.LightRedis) -> bool:
    try:
        return bool(client.ping())
    except resp.ResponseError:  # LOADING: not ready yet
        return False
