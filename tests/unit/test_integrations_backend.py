"""What the framework adapters share (`bashfleet.client.integrations._backend`): how a framework's
command with stdin or a long command line becomes one call, exit statuses, file errors,
`user=`, lease renewals, and the options a workspace is made with. The staged commands
are run by a local bash here, as the workspace's bash would run them."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from privilege import needs_root

from bashfleet.client.errors import CallRejected, UnknownWorkspace, error_for
from bashfleet.client.integrations._backend import (
    INLINE_COMMAND_BYTES,
    MAX_RENEW_INTERVAL_S,
    FleetPool,
    Staged,
    WorkspaceOptions,
    as_user,
    cannot_become,
    capturing,
    exit_status,
    file_error,
    made_root,
    renew_interval,
    shell_line,
    stage,
)
from bashfleet.worker.wire.models import MAX_COMMAND_BYTES, ImageInfo, WorkspaceLimits


def run_locally(staged: Staged) -> subprocess.CompletedProcess[bytes]:
    """Run a staged command as a workspace's call would: its files written, then
    `bash -c COMMAND`."""
    for path, data in staged.files:
        Path(path).write_bytes(data)
    return subprocess.run(["bash", "-c", staged.command], capture_output=True, check=False,
                          stdin=subprocess.DEVNULL, timeout=30)


def test_a_plain_command_is_sent_as_it_is() -> None:
    assert stage("echo hi", None) == Staged("echo hi")


@pytest.mark.parametrize(("stdin", "expected"), [
    (b"", b""),
    (b"hello\nworld\n", b"hello\nworld\n"),
    (b"$HOME `whoami` 'q' \"d\" \\b\n", b"$HOME `whoami` 'q' \"d\" \\b\n"),
    (b"\xc3\x28\x00\xff", b"\xc3\x28\x00\xff"),
])
def test_stdin_reaches_the_command_and_its_file_is_gone(stdin: bytes, expected: bytes) -> None:
    staged = stage("cat", stdin)
    [(path, data)] = staged.files
    assert path.startswith("/tmp/.bashfleet-stdin-") and data == stdin
    done = run_locally(staged)
    assert (done.returncode, done.stdout) == (0, expected)
    assert not os.path.exists(path)


@settings(max_examples=25, deadline=None)
@given(st.binary(max_size=4096), st.integers(min_value=0, max_value=255))
def test_stdin_and_exit_status_round_trip(stdin: bytes, status: int) -> None:
    done = run_locally(stage(f"cat; exit {status}", stdin))
    assert (done.stdout, done.returncode) == (stdin, status)


def test_a_command_ending_in_a_comment_still_reads_its_stdin() -> None:
    done = run_locally(stage("cat # a comment", b"x"))
    assert (done.returncode, done.stdout) == (0, b"x")


def test_a_long_command_line_is_sourced_from_a_script_it_removes() -> None:
    chunk = "x" * (64 * 1024)
    command = shell_line(["printf", "%s", *([chunk] * 16)])
    assert len(command) > MAX_COMMAND_BYTES
    staged = stage(command, b"")
    assert len(staged.command.encode()) < INLINE_COMMAND_BYTES
    [(stdin_path, _), (script_path, _)] = staged.files
    done = run_locally(staged)
    assert (done.returncode, done.stdout) == (0, (chunk * 16).encode())
    assert not os.path.exists(stdin_path) and not os.path.exists(script_path)


def test_a_sourced_script_keeps_the_calls_exit_status() -> None:
    done = run_locally(stage("true; exit 7", None, inline_bytes=4))
    assert done.returncode == 7


def test_shell_line_quotes_each_word() -> None:
    assert shell_line(["sh", "-c", "echo $HOME; echo 'x'"]) == \
        "sh -c 'echo $HOME; echo '\"'\"'x'\"'\"''"
    with pytest.raises(ValueError, match="empty"):
        shell_line([])


@pytest.mark.parametrize(("exit_code", "signal", "status"), [
    (0, None, 0), (70, None, 70), (None, 15, 143), (None, 9, 137), (None, None, 1),
])
def test_exit_status(exit_code: int | None, signal: int | None, status: int) -> None:
    assert exit_status(exit_code, signal) == status


@pytest.mark.parametrize(("message", "kind", "code"), [
    ("workspace w1: No such file or directory: /w/nonexistent", FileNotFoundError,
     errno.ENOENT),
    ("Is a directory: /etc", IsADirectoryError, errno.EISDIR),
    ("write: line 1: /tmp/dd: Is a directory", IsADirectoryError, errno.EISDIR),
    ("Permission denied: /w/ro.txt", PermissionError, errno.EACCES),
    ("write: line 1: /usr/x: Read-only file system", PermissionError, errno.EROFS),
    ("mkdir: /w/f/x: Not a directory", NotADirectoryError, errno.ENOTDIR),
])
def test_file_errors_are_the_oserrors_frameworks_expect(message: str, kind: type[OSError],
                                                      code: int) -> None:
    error = file_error(CallRejected(message), "the/file")
    assert type(error) is kind and error.errno == code
    assert "the/file" in str(error)


@pytest.mark.parametrize(("problem", "kind"), [
    ("missing", FileNotFoundError), ("directory", IsADirectoryError),
    ("not_directory", NotADirectoryError), ("denied", PermissionError),
])
def test_typed_file_errors_keep_their_kind(problem: str, kind: type[OSError]) -> None:
    error = file_error(error_for("not_found", "whatever the words", problem), "the/file")
    assert type(error) is kind and error.filename == "the/file"


@pytest.mark.parametrize("message", ["no such workspace: w1 (deleted, expired unused, or "
                                     "another owner's)", "the fleet client was closed"])
def test_other_failures_are_no_file_errors(message: str) -> None:
    assert file_error(UnknownWorkspace(message), "f") is None


@needs_root("switching users needs root")
@pytest.mark.parametrize(("user", "expected"), [
    ("nobody", b"65534\n"), ("65534", b"65534\n"), ("65534:65534", b"65534\n"),
])
def test_a_root_call_runs_a_command_as_another_user(user: str, expected: bytes) -> None:
    done = run_locally(Staged(as_user("id -u; printf '%s\\n' \"$X\"", user)))
    assert done.stdout == expected + b"\n", done.stderr


def test_a_user_that_cannot_be_had_is_told_why() -> None:
    assert cannot_become("root", "1000") == (
        "this workspace's calls run as '1000', not root, so a command cannot run as 'root': "
        "make the workspace with user 'root' (the framework's config: `user: root`) to run "
        "commands as other users")


def test_a_captured_commands_output_is_its_own_bytes(tmp_path: Path) -> None:
    out, err, stale = tmp_path / "out", tmp_path / "err", tmp_path / "old"
    stale.write_bytes(b"read already")
    command = capturing("printf '\\033[1ma\\r\\n'; printf 'e\\001' >&2; exit 3",
                        str(out), str(err), [str(stale)])
    done = run_locally(Staged(command))
    assert (done.returncode, done.stdout, done.stderr) == (3, b"", b"")
    assert (out.read_bytes(), err.read_bytes()) == (b"\x1b[1ma\r\n", b"e\x01")
    assert not stale.exists()


@pytest.mark.parametrize(("ttl_s", "every_s"), [
    (3600.0, MAX_RENEW_INTERVAL_S), (600.0, 200.0), (3.0, 1.0), (0.5, 1.0),
])
def test_a_lease_is_renewed_twice_within_its_ttl(ttl_s: float, every_s: float) -> None:
    assert renew_interval(ttl_s) == every_s


def test_workspace_options_become_the_fleets_arguments() -> None:
    options = WorkspaceOptions(label="linux", ttl_s=600, network=False,
                               limits=WorkspaceLimits(memory_mb=512), mounts={"/logs": "logs"},
                               tags={"run": "r1"})
    assert options.create_kwargs(tags={"framework": "x", "run": "default"}) == {
        "host": None, "label": "linux", "path": None, "ttl_s": 600, "isolation": None,
        "network": False, "limits": WorkspaceLimits(memory_mb=512),
        "mounts": {"/logs": "logs"}, "tags": {"framework": "x", "run": "r1"},
        "image": None, "build": None, "user": None,
    }
    assert hash(options) == hash(options.model_copy())
    assert options.fleet_kwargs() == {"redis_url": None, "owner": None}
    overridden = options.create_kwargs(mounts={"/tests": "tests"}, network=True)
    assert overridden["mounts"] == {"/tests": "tests"} and overridden["network"] is True
    with pytest.raises(ValueError, match="extra"):
        WorkspaceOptions.model_validate({"hots": "typo"})
    with pytest.raises(ValueError, match="a host or a label, not both"):
        WorkspaceOptions(host="a", label="b")
    with pytest.raises(ValueError, match="an image or a build directory, not both"):
        WorkspaceOptions(image="a:1", build="./ctx")
    imaged = WorkspaceOptions(image="reg.example/a:1", user="root").create_kwargs()
    assert (imaged["image"], imaged["build"], imaged["user"]) == ("reg.example/a:1", None,
                                                                  "root")


def test_a_workspace_from_a_snapshot_takes_its_files_paths_and_base_from_it() -> None:
    options = WorkspaceOptions(label="linux", ttl_s=600, image="reg.example/a:1", user="root",
                               path="/srv/x", mounts={"/logs": "logs"}, tags={"run": "r1"})
    assert options.from_snapshot_kwargs("s0a1b2", tags={"framework": "x"}) == {
        "host": None, "label": "linux", "ttl_s": 600, "isolation": None, "network": None,
        "limits": None, "tags": {"framework": "x", "run": "r1"},
        "snapshot": "s0a1b2",
    }


def test_the_fleet_client_is_shared_per_loop_and_owner_and_closed_by_its_last_user() -> None:
    async def scenario() -> None:
        pool = FleetPool("redis://127.0.0.1:1/0")  # never reached: nothing is sent
        first, second = pool.acquire("team-a"), pool.acquire("team-a")
        other = pool.acquire("team-b")
        assert first is second and first is not other
        await pool.release("team-a")
        assert pool.acquire("team-a") is first  # still held once
        await pool.release("team-a")
        await pool.release("team-a")
        assert pool.acquire("team-a") is not first  # closed by its last user: a new one
        for owner in ("team-a", "team-b"):
            await pool.release(owner)
        await pool.release("nobody")  # never held: nothing to do

    asyncio.run(scenario())


class FakeFleet:
    """What `made_root` asks of a fleet: a workspace, the images of its host."""

    def __init__(self, image_user: str) -> None:
        self.asked: list[dict[str, Any]] = []
        self.deleted = False
        self._user = image_user

    async def workspace(self, **kwargs: Any) -> Any:
        self.asked.append(kwargs)
        view = SimpleNamespace(image="reg.example/a:1@sha256:bb")
        return SimpleNamespace(view=view, host="h1", delete=self._delete)

    async def images(self, *, host: str) -> list[ImageInfo]:
        return [ImageInfo(ref="other", digest="sha256:aa", user="7"),
                ImageInfo(ref="reg.example/a:1", digest="sha256:bb", user=self._user)]

    async def _delete(self) -> None:
        self.deleted = True


@pytest.mark.parametrize(("kwargs", "image_user", "asked_user", "default"), [
    ({"image": "reg.example/a:1", "user": None}, "1000", "root", "1000"),
    ({"image": "reg.example/a:1", "user": None}, "", "root", None),
    ({"image": "reg.example/a:1", "user": None}, "0:0", "root", None),
    ({"build": "./ctx", "user": None}, "app", "root", "app"),
    ({"image": "reg.example/a:1", "user": "1000"}, "1000", "1000", None),
    ({"image": None, "user": None}, "1000", None, None),
])
def test_an_images_workspace_is_made_root_with_its_user_as_the_default(
        kwargs: dict[str, Any], image_user: str, asked_user: str | None,
        default: str | None) -> None:
    fleet = FakeFleet(image_user)
    _, found = asyncio.run(made_root(cast(Any, fleet), kwargs))
    assert [asked["user"] for asked in fleet.asked] == [asked_user]
    assert found == default and not fleet.deleted
