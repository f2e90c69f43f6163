"""The pure parts of moving snapshots through a registry: where a snapshot lives
(`snapshot_ref`, the setting), and which layer archives a pull refuses to unpack, read
from tar's own listing."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from bashfleet.worker.engine.snapshots.snapshot_registry import (
    RegistryError,
    check_members,
    parse_listing,
    snapshot_ref,
)
from bashfleet.worker.settings import Settings

PREFIX = "127.0.0.1:5000/bashfleet/snapshots"


# ------------------------------------------------------------------ snapshot_ref


def test_snapshot_ref_is_the_prefix_tagged_with_the_id(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, snapshot_registry=PREFIX)
    assert snapshot_ref(settings, "snap-1a2b") == f"{PREFIX}:snap-1a2b"
    assert snapshot_ref(settings, "A_b.c-9") == f"{PREFIX}:A_b.c-9"


def test_no_snapshot_registry_no_ref(tmp_path: Path) -> None:
    assert Settings(state_dir=tmp_path).snapshot_registry is None
    assert snapshot_ref(Settings(state_dir=tmp_path), "snap") is None


def test_a_repository_on_docker_hub_is_spelled_out(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, snapshot_registry="acme/snapshots")
    assert snapshot_ref(settings, "s1") == "docker.io/acme/snapshots:s1"


@pytest.mark.parametrize("snap_id", ["", "-flag", "a b", "a/b", "../x", "x:y", "é", "x" * 129,
                                     ".hidden", "trailing\n"])
def test_an_id_that_is_no_tag_is_refused(tmp_path: Path, snap_id: str) -> None:
    settings = Settings(state_dir=tmp_path, snapshot_registry=PREFIX)
    with pytest.raises(RegistryError) as caught:
        snapshot_ref(settings, snap_id)
    assert caught.value.kind == "invalid"


def test_a_prefix_that_makes_no_reference_is_refused(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, snapshot_registry="127.0.0.1:5000/Upper/Case")
    with pytest.raises(RegistryError) as caught:
        snapshot_ref(settings, "s1")
    assert caught.value.kind == "invalid"


@pytest.mark.parametrize("prefix", [f"{PREFIX}:tag", f"{PREFIX}@sha256:{'0' * 64}", " ",
                                    f" {PREFIX}"])
def test_the_setting_is_a_repository_without_tag_or_digest(prefix: str) -> None:
    with pytest.raises(ValidationError, match="snapshot_registry"):
        Settings(snapshot_registry=prefix)


def test_the_setting_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASHFLEET_SNAPSHOT_REGISTRY", PREFIX)
    assert Settings().snapshot_registry == PREFIX


# ------------------------------------------------------------------ member checks


def _line(kind: str, name: str, *, mode: str = "rw-r--r--", size: str = "0",
          target: str | None = None) -> str:
    """A line as `tar --list --verbose --numeric-owner --quoting-style=c` prints it."""
    how = {"l": " -> ", "h": " link to "}.get(kind, "")
    tail = f'{how}"{target}"' if target is not None else ""
    return f'{kind}{mode} 0/0 {size:>15} 2026-01-02 03:04 "{name}"{tail}'


#: A layer as GNU tar lists what `push` archives: every kind of member it may hold.
GOOD = [
    _line("d", "./", mode="rwxr-xr-x"),
    _line("d", "./root/", mode="rwx------"),
    _line("-", "./root/file", size="12"),
    _line("h", "./root/again", target="./root/file"),
    _line("l", "./root/abs", mode="rwxrwxrwx", target="/etc/passwd"),
    _line("l", "./root/rel", mode="rwxrwxrwx", target="../top.usr/x"),
    _line("c", "./root/whiteout", mode="---------", size="0,0"),
    _line("p", "./root/fifo"),
    _line("d", "./top.usr/"),
    _line("-", "./top.usr/x", mode="rwsr-xr-x"),
    _line("d", "./tmp/", mode="rwxrwxrwt"),
    _line("-", r"./tmp/odd \"name\"\nwith\\ \303\251 \377", size="1"),
]


def test_a_layer_as_push_makes_it_passes() -> None:
    check_members(GOOD, "s")


def test_a_listing_line_reads_back_exactly() -> None:
    member = parse_listing(GOOD[-1])
    assert member.kind == "-" and member.size == "1"
    assert member.name == "./tmp/odd \"name\"\nwith\\ é \udcff"
    link = parse_listing(GOOD[3])
    assert (link.kind, link.target) == ("h", "./root/file")
    assert parse_listing(GOOD[6]).size == "0,0"


REFUSED = {
    "absolute": [_line("-", "/etc/passwd")],
    "dot-dot": [_line("-", "../evil")],
    "dot-dot inside": [_line("d", "./a/"), _line("-", "./a/../../evil")],
    "dot component": [_line("d", "./a/"), _line("-", "./a/./b")],
    "empty component": [_line("d", "./a/"), _line("-", "./a//b")],
    "twice": [_line("-", "./f"), _line("-", "./f")],
    "directory then symlink": [_line("d", "./a/"), _line("l", "./a", target="/etc")],
    "under a symlink": [_line("l", "./a", target="/etc"), _line("-", "./a/passwd")],
    "under a file": [_line("-", "./a"), _line("-", "./a/b")],
    "parent never listed": [_line("-", "./nowhere/b")],
    "hard link to nothing": [_line("h", "./h", target="etc/passwd")],
    "hard link to a directory": [_line("d", "./d/"), _line("h", "./h", target="./d")],
    "hard link before its file": [_line("h", "./h", target="./f"), _line("-", "./f")],
    "symlink climbing out": [_line("d", "./a/"), _line("l", "./a/s", target="../../etc")],
    "symlink climbing out later": [_line("l", "./s", target="x/../../etc")],
    "block device": [_line("b", "./sda", size="8,0")],
    "character device": [_line("c", "./mem", size="1,1")],
    "contiguous file": [_line("C", "./c")],
    "layer itself a file": [_line("-", "./")],
    "file named as a directory": [_line("-", "./f/")],
    "unreadable line": ["tar: something else entirely"],
    "symlink without target": [_line("l", "./s")],
    "file with a target": [_line("-", "./f", target="/etc")],
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_hostile_or_foreign_member_is_refused(case: str) -> None:
    with pytest.raises(RegistryError) as caught:
        check_members([GOOD[0], *REFUSED[case]], "127.0.0.1:5000/s:x")
    assert caught.value.kind == "invalid"
    assert caught.value.message.startswith("127.0.0.1:5000/s:x: refused to unpack") or \
        "unreadable member" in caught.value.message


def test_a_relative_symlink_may_climb_as_far_as_the_layer() -> None:
    check_members([GOOD[0], _line("d", "./a/"), _line("d", "./a/b/"),
                   _line("l", "./a/b/s", target="../../c/./d/")], "s")
