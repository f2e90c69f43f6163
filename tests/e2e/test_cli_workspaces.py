"""`bashfleet workspace create|ls|info|renew|rm`, `run --workspace` and `bashfleet cp`,
as a person (or a script) uses them against a local fleet."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import Cli, local_fleet


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    state_dir = tmp_path_factory.mktemp("cli-ws-fleet")
    with local_fleet(state_dir, "--hosts", "solo", "--concurrency", "2", "--no-flower") as cli:
        yield cli


@pytest.fixture
def workspace(fleet: Cli) -> Iterator[str]:
    made = fleet("workspace", "create", "--ttl", "600", "--tag", "suite=cli")
    assert made.returncode == 0, made.stderr
    ws_id = made.stdout.strip()
    yield ws_id
    fleet("workspace", "rm", ws_id)


def test_create_prints_the_id_alone_and_ls_lists_it(fleet: Cli, workspace: str) -> None:
    assert workspace.startswith("w") and len(workspace) == 16
    listed = fleet("workspace", "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    views = {view["id"]: view for view in json.loads(listed.stdout)}
    assert views[workspace]["host"] == "solo"
    assert views[workspace]["tags"] == {"suite": "cli"}
    table = fleet("workspace", "ls")
    assert workspace in table.stdout and "EXPIRES" in table.stdout and "suite=cli" in table.stdout


def test_cp_a_directory_there_and_back_byte_for_byte(
    fleet: Cli, workspace: str, tmp_path: Path
) -> None:
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "blob.bin").write_bytes(bytes(range(256)) * 1000)
    (source / "sub" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (source / "sub" / "run.sh").chmod(0o755)
    assert fleet("cp", str(source), f"{workspace}:src").returncode == 0
    ran = fleet("run", "--workspace", workspace, "./src/sub/run.sh && md5sum < src/blob.bin")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("ran\n")
    made = fleet("run", "--workspace", workspace, "--cwd", "src", "echo built > out.txt")
    assert made.returncode == 0, made.stderr
    back = tmp_path / "back"
    copied = fleet("cp", f"{workspace}:src", str(back))
    assert copied.returncode == 0, copied.stderr
    assert (back / "blob.bin").read_bytes() == (source / "blob.bin").read_bytes()
    assert (back / "out.txt").read_text() == "built\n"
    assert os.access(back / "sub" / "run.sh", os.X_OK)


def test_cp_one_file_each_way(fleet: Cli, workspace: str, tmp_path: Path) -> None:
    local = tmp_path / "notes.txt"
    local.write_text("hello\n")
    # Into a directory (DST ends with /): made if missing, as write_file makes parents.
    assert fleet("cp", str(local), f"{workspace}:docs/").returncode == 0
    shown = fleet("run", "--workspace", workspace, "cat docs/notes.txt")
    assert shown.stdout == "hello\n"
    into = tmp_path / "into"
    into.mkdir()
    assert fleet("cp", f"{workspace}:docs/notes.txt", str(into)).returncode == 0
    assert (into / "notes.txt").read_text() == "hello\n"


@pytest.mark.parametrize(
    "case",
    [
        ("{ws}:missing.txt", "{tmp}/x", 1, "No such file or directory"),
        # Its keeper (pid 1 there) is the host's root: out of any call's reach.
        ("{ws}:/proc/1/environ", "{tmp}/x", 1, "Permission denied"),
        ("{tmp}/absent", "{ws}:x", 1, "no such file or directory"),
        ("{tmp}/a", "{tmp}/b", 2, "one side must be a workspace's path"),
        ("w000000000000000:x", "{tmp}/x", 125, "no such workspace"),
    ],
)
def test_cp_says_what_is_wrong(
    fleet: Cli, workspace: str, tmp_path: Path, case: tuple[str, str, int, str]
) -> None:
    src, dst, status, said = case
    out = fleet("cp", src.format(ws=workspace, tmp=tmp_path),
                dst.format(ws=workspace, tmp=tmp_path))
    assert out.returncode == status, out.stderr
    assert said in out.stderr


def test_rm_ends_the_workspaces_jobs_and_a_second_rm_says_it_is_gone(fleet: Cli) -> None:
    ws_id = fleet("workspace", "create").stdout.strip()
    started = fleet("run", "--workspace", ws_id, "--mode", "background", "sleep 300")
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.strip()
    info = fleet("workspace", "info", "--json", ws_id)
    assert json.loads(info.stdout)[0]["processes"] >= 1
    removed = fleet("workspace", "rm", ws_id)
    assert removed.returncode == 0 and "removed" in removed.stderr
    ended = fleet("check", "--json", job_id)
    assert json.loads(ended.stdout)["running"] is False
    assert ws_id not in fleet("workspace", "ls").stdout
    again = fleet("workspace", "rm", ws_id)
    assert again.returncode == 1 and "no such workspace" in again.stderr
    gone = fleet("run", "--workspace", ws_id, "true")
    assert gone.returncode == 125 and "no such workspace" in gone.stderr


def test_a_relative_cwd_is_the_sessions_subdirectory(fleet: Cli, workspace: str) -> None:
    session = f"cwd-{workspace}"
    first = fleet("run", "--session", session, "--workspace", workspace, "mkdir -p a/b; pwd")
    assert first.returncode == 0, first.stderr
    home = first.stdout.strip()
    assert fleet("run", "--session", session, "--cwd", "a", "pwd").stdout.strip() == f"{home}/a"
    assert fleet("run", "--session", session, "cd a/b").returncode == 0
    assert fleet("run", "--session", session, "--cwd", "..", "pwd").stdout.strip() == f"{home}/a"


def test_bad_create_options_are_usage_errors(fleet: Cli) -> None:
    for option in (["--limit", "foo=1"], ["--limit", "procs=many"], ["--mount", "/logs"]):
        out = fleet("workspace", "create", *option)
        assert out.returncode == 2, out.stderr
        assert out.stdout == ""


def test_a_workspaces_network_policy_from_the_cli(fleet: Cli) -> None:
    made = fleet("workspace", "create", "--ttl", "600", "--network", "none")
    assert made.returncode == 0, made.stderr
    ws_id = made.stdout.strip()
    try:
        interfaces = "awk -F: 'NR > 2 {print $1}' /proc/net/dev"  # its namespace's
        links = fleet("run", "--workspace", ws_id, interfaces)
        assert links.stdout.split() == ["lo"]
        changed = fleet("workspace", "network", ws_id, "allow=pypi.org,*.pythonhosted.org",
                        "--json")
        assert changed.returncode == 0, changed.stderr
        assert json.loads(changed.stdout)["network"] == {
            "mode": "allow", "allow": ["pypi.org", "*.pythonhosted.org"]}
        info = fleet("workspace", "info", ws_id)
        assert "allow=pypi.org,*.pythonhosted.org" in info.stdout
        assert sorted(fleet("run", "--workspace", ws_id, interfaces).stdout.split()) == [
            "eth0", "lo"]
        bad = fleet("workspace", "network", ws_id, "everything")
        assert bad.returncode != 0 and "unknown network policy" in bad.stderr
    finally:
        fleet("workspace", "rm", ws_id)
