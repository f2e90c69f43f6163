"""The pure pieces of a workspace's sleep: when a keeper sleeps, what its holder is told
(its command line), what a woken keeper is given (the service's spec), and how the
holder binary is named and built."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bashfleet.worker.engine import holder, isolate
from bashfleet.worker.engine.isolate import kernel
from bashfleet.worker.engine.isolate.keeper import (
    Lease,
    holder_argv,
    service_spec,
    should_sleep,
)
from bashfleet.worker.settings import Settings


@pytest.mark.parametrize(("idle_s", "now", "last_active", "expected"), [
    (0.0, 100.0, 0.0, False),    # 0: never sleeps
    (1.0, 100.0, 99.5, False),   # idle for less than its time
    (1.0, 100.0, 99.0, True),    # exactly its time
    (1.0, 100.0, 50.0, True),    # long idle
    (5.0, 100.0, 96.0, False),
])
def test_should_sleep(idle_s: float, now: float, last_active: float, expected: bool) -> None:
    assert should_sleep(idle_s, now, last_active) is expected


def test_holder_argv_with_a_lease() -> None:
    lease = Lease(dir_fd=7, name="w123.json", ttl_s=3600.0, look_s=30.0, grace_s=300.0)
    argv = holder_argv(3, 1000, spec_fd=5, userns_fd=6, lease=lease, ready_fd=8,
                       service_fd=9, spawner_fd=10)
    # holder.c's usage: LISTEN UID SPEC USERNS LEASE_DIR NAME TTL LOOK GRACE READY SERVICE
    # SPAWNER
    assert argv == ["bashfleet-holder", "3", "1000", "5", "6", "7", "w123.json", "3600.0",
                    "30.0", "300.0", "8", "9", "10"]
    assert len(argv) == 13  # holder.c refuses any other count


def test_holder_argv_without_a_lease_or_user_namespace() -> None:
    argv = holder_argv(3, 0, spec_fd=5, userns_fd=-1, lease=None, ready_fd=-1, service_fd=4)
    assert argv == ["bashfleet-holder", "3", "0", "5", "-1", "-1", "-", "0", "0", "0", "-1",
                    "4", "-1"]


_BASE: dict[str, Any] = {"worker_uid": 0, "open_files": 1024, "seccomp": "default",
                         "network": False}


@pytest.mark.parametrize(("spec", "who", "expected"), [
    # a root worker's workspace with host ids of its own: calls enter its user namespace
    ({**_BASE, "ids": {"uid": 100000}}, kernel.Identity(0, 0, (), 12),
     {"who": [0, 0, []], "userns": True, "run_user": False}),
    # a root worker on a single-tenant host: calls take the run user's ids
    ({**_BASE, "uid": 1001, "gid": 1001}, kernel.Identity(1001, 1001, (27,)),
     {"who": [1001, 1001, [27]], "userns": False, "run_user": True}),
    # a worker that is not root: its own uid, in a namespace of its own
    ({**_BASE, "worker_uid": 1000}, kernel.Identity(1000, 1000, (), 9),
     {"who": [1000, 1000, []], "userns": True, "run_user": False, "worker_uid": 1000}),
    # where the kernel gave no user namespace: calls share the keeper's
    ({**_BASE, "worker_uid": 1000}, None,
     {"who": None, "userns": False, "run_user": False, "worker_uid": 1000}),
])
def test_service_spec(spec: dict[str, Any], who: kernel.Identity | None,
                      expected: dict[str, Any]) -> None:
    got = service_spec(spec, who, 1.5)
    assert got == {"worker_uid": 0, "open_files": 1024, "seccomp": "default",
                   "network": False, "idle_s": 1.5, **expected}


def test_service_spec_is_plain_json() -> None:
    """It travels in a memfd as JSON: no descriptor or object in it."""
    got = service_spec({**_BASE, "ids": {}}, kernel.Identity(0, 0, (), 12), 1.0)
    assert json.loads(json.dumps(got)) == got
    assert 12 not in [value for value in got.values() if isinstance(value, int)
                      and not isinstance(value, bool)]


def test_binary_name_follows_the_source_and_kind() -> None:
    one, other = holder.binary_name(b"int main(){}"), holder.binary_name(b"int main(){;}")
    assert one != other
    assert one == holder.binary_name(b"int main(){}")
    assert one.startswith("holder-") and len(one) == len("holder-") + 16
    spawner = holder.binary_name(b"int main(){}", "spawner")
    assert spawner == "spawner-" + one.removeprefix("holder-")


def test_build_argv_is_static() -> None:
    assert holder.build_argv("cc", ["/src/holder.c"], "/out/h") == [
        "cc", "-static", "-O2", "-o", "/out/h", "/src/holder.c"]


def test_the_spawner_is_built_without_a_c_library() -> None:
    argv = holder.spawn_build_argv("cc", ["/src/spawn.c"], "/out/s")
    assert argv[0] == "cc" and argv[-3:] == ["-o", "/out/s", "/src/spawn.c"]
    for flag in ("-static", "-nostdlib", "-ffreestanding", "-fno-stack-protector"):
        assert flag in argv


def test_the_spawner_links_no_c_library(tmp_path: Path) -> None:
    """Built from the package's source, it has its own entry and no symbol left to a
    library (a call into one would not link); it answers the probe. Without a compiler
    it is not built, and the reason says so."""
    path, why = holder.build_spawner_into(tmp_path)
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        assert (path, why) == (None, "no C compiler (cc) to build the spawner with")
        return
    assert path is not None, why
    done = subprocess.run([isolate.SPAWN_NAME, "--probe"], executable=path,
                          capture_output=True, timeout=30, check=False)
    assert (done.returncode, done.stdout) == (0, holder.SPAWN_PROBE_ANSWER)
    header = Path(path).read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[16:18], "little") == 2  # ET_EXEC
    assert b"GLIBC" not in Path(path).read_bytes()


def test_a_configured_holder_that_is_not_executable_is_said(tmp_path: Path) -> None:
    missing = Settings(state_dir=tmp_path / "state", holder=tmp_path / "none")
    assert holder.find(missing) == (None, f"holder {tmp_path / 'none'} is not an executable "
                                          "file")
    given = tmp_path / "holder"
    given.write_bytes(b"\x7fELF")
    given.chmod(0o755)
    assert holder.find(missing.model_copy(update={"holder": given})) == (str(given), None)


def test_without_a_compiler_the_reason_is_said(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.delenv("BASHFLEET_HOLDER", raising=False)  # the suite's own, built once
    assert holder.find(Settings(state_dir=tmp_path / "state")) == (
        None, "no C compiler (cc) to build the holder with")


def test_a_prebuilt_spawner_starts_calls_only_when_it_answers_the_probe(tmp_path: Path) -> None:
    """A program that is not the spawner (a holder given as one, say) is not used: the
    keepers fork their calls (it would take the spawner's arguments for its own)."""
    old = tmp_path / "old"
    old.write_text("#!/bin/sh\nexit 2\n")
    new = tmp_path / "new"
    new.write_text('#!/bin/sh\n[ "$1" = --probe ] && printf "bashfleet-spawn 2\\n"\n')
    # One of before `--ready` (its keepers would start their next calls with it).
    before = tmp_path / "before"
    before.write_text('#!/bin/sh\n[ "$1" = --probe ] && printf "bashfleet-spawn 1\\n"\n')
    for path in (old, new, before):
        path.chmod(0o755)
    state = tmp_path / "state"
    assert holder.spawner(Settings(state_dir=state, spawner=old)) is None
    assert holder.spawner(Settings(state_dir=state, spawner=before)) is None
    assert holder.find_spawner(Settings(state_dir=state, spawner=old)) == (
        None, f"spawner {old} is not one (it does not answer `bashfleet-spawn --probe`)")
    assert holder.spawner(Settings(state_dir=state, spawner=new)) == str(new)
    assert holder.spawner(Settings(state_dir=state, spawner=tmp_path / "none")) is None


def test_without_a_compiler_there_is_no_spawner(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.delenv("BASHFLEET_SPAWNER", raising=False)  # the suite's own, built once
    assert holder.build_spawner_into(tmp_path / "bin") == (
        None, "no C compiler (cc) to build the spawner with")
    assert holder.spawner(Settings(state_dir=tmp_path / "state")) is None
