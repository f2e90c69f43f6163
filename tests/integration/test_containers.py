"""Workspaces as rootless containers: each known attack on them replayed as the attacker
ran it, on a root worker whose run user has subordinate ids (what bootstrap.sh sets up),
with a positive control that shows the attack could have worked.

Every attack here needs a host that gives workspaces ids of their own; the tests fail
(not skip) where the host does not, since that is what they are about.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from privilege import needs_root

from bashfleet.worker.engine import id_slots, sandbox, workspaces
from bashfleet.worker.wire.models import WorkspaceSpec

from .engine_helpers import (
    Engine,
    Janitor,
    _engine_fixture,  # noqa: F401 - the `engine` fixture
    _janitor_fixture,  # noqa: F401 - the `janitor` fixture
    engine_with,
    give_to_run_user,
    readable_install,
)

pytestmark = needs_root("a root worker's workspaces")

NOBODY = 65534


def as_nobody(*argv: str) -> tuple[int, bytes]:
    """Run argv as another local account (nobody): (exit status, output)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child execs or exits
        try:
            os.close(read_end)
            os.dup2(write_end, 1)
            os.dup2(write_end, 2)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.execvp(argv[0], list(argv))  # noqa: S606 - argv, no shell
        except OSError as exc:
            os.write(1, f"{exc}".encode())
        finally:
            os._exit(127)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), b"".join(chunks)


@pytest.fixture(name="multi")
def _multi_fixture(engine: Engine) -> Engine:
    assert sandbox.host_ids(engine.settings) is not None, (
        "this host gives workspaces no ids of their own: run scripts/bootstrap.sh as root")
    return engine


@pytest.fixture(name="host_dir")
def _host_dir_fixture() -> Iterator[Path]:
    """A directory at the host's top level, outside /tmp (a workspace's /tmp is its
    own: an attack on a path there would be vacuous), removed at the end."""
    path = Path(f"/opt/bashfleet-test-{uuid.uuid4().hex[:10]}")
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_calls_are_root_inside_and_an_id_of_their_workspace_outside(multi: Engine) -> None:
    one = workspaces.create(WorkspaceSpec(owner="a"), multi.settings)
    two = workspaces.create(WorkspaceSpec(owner="b"), multi.settings)
    try:
        maps = []
        for record in (one, two):
            result = multi.run("id -u; cat /proc/self/uid_map", workspace=record.id, cwd=None,
                               owner=record.owner)
            uid, line = result.stdout.splitlines()
            inside, outside, count = map(int, line.split())
            assert (uid, inside, count) == ("0", 0, id_slots.SLOT_SIZE)
            assert record.ids == (outside, id_slots.SLOT_SIZE)
            maps.append(range(outside, outside + count))
        run_uid = sandbox.run_user(multi.settings)
        assert run_uid is not None
        for taken in maps:
            assert 0 not in taken and os.geteuid() not in taken and run_uid.uid not in taken
        assert not set(maps[0]) & set(maps[1])  # never another workspace's
    finally:
        workspaces.delete(one.id, multi.settings)
        workspaces.delete(two.id, multi.settings)


def test_finding_1_a_set_user_id_copy_of_bash_is_no_way_in(multi: Engine) -> None:
    record = workspaces.create(WorkspaceSpec(), multi.settings)
    try:
        made = multi.run("cp /bin/bash ./sh && chmod 6755 ./sh && ls -l ./sh",
                         workspace=record.id, cwd=None)
        assert made.stdout.startswith("-rwsr-sr-x"), made  # the attack's first half worked
        planted = Path(record.path) / "sh"
        info = planted.stat()
        assert info.st_mode & stat.S_ISUID
        # On the host it is the workspace's id, never the run user's nor the worker's.
        run_user = sandbox.run_user(multi.settings)
        assert run_user is not None and info.st_uid not in (0, run_user.uid)
        assert record.ids is not None and info.st_uid == record.ids[0]
        # Another local account cannot even reach it: the workspace root is 0700.
        code, output = as_nobody(str(planted), "-p", "-c", "id -u")
        assert code != 0 and b"Permission denied" in output, output
        code, output = as_nobody("ls", str(multi.settings.workspace_root_dir()))
        assert code != 0 and b"Permission denied" in output, output
    finally:
        workspaces.delete(record.id, multi.settings)


def test_finding_2_no_local_account_lists_or_reads_a_workspace(multi: Engine) -> None:
    record = workspaces.create(WorkspaceSpec(), multi.settings)
    try:
        kept = multi.run("echo tenant-secret > notes.txt; seq 1 5", workspace=record.id,
                         cwd=None)
        assert kept.error is None and (Path(record.path) / "notes.txt").exists()
        for path in (record.path, f"{record.path}/notes.txt", record.out_dir):
            code, output = as_nobody("cat", path)
            assert code != 0 and b"tenant-secret" not in output
        # The host's own mount table does not name the workspace: its mounts are in a
        # namespace of their own.
        assert record.path not in Path("/proc/self/mountinfo").read_text()
        assert record.path not in Path("/proc/1/mountinfo").read_text()
    finally:
        workspaces.delete(record.id, multi.settings)


KEYS = (
    "import ctypes, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "USER_KEYRING = -4\n"
    "if sys.argv[1] == 'add':\n"
    "    key = libc.syscall(248, b'user', b'bf-secret', b's3cr3t-value', 12, USER_KEYRING)\n"
    "    print('added' if key > 0 else 'add failed')\n"
    "else:\n"
    "    key = libc.syscall(250, 10, USER_KEYRING, b'user', b'bf-secret', 0)\n"
    "    buf = ctypes.create_string_buffer(64)\n"
    "    n = libc.syscall(250, 11, key, buf, 64) if key > 0 else -1\n"
    "    print(buf.raw[:n].decode() if n > 0 else 'no key')\n"
)


def test_finding_3_one_tenants_keyring_is_not_anothers(tmp_path: Path, janitor: Janitor) -> None:
    # The system call filter refuses add_key and keyctl: lifted here, since what is tested
    # is the keyring a call would reach were they allowed.
    with engine_with(tmp_path, janitor, seccomp="unconfined") as multi:
        _one_tenants_keyring_is_not_anothers(multi)


def _one_tenants_keyring_is_not_anothers(multi: Engine) -> None:
    owner_a = workspaces.create(WorkspaceSpec(owner="a", isolation="strict"), multi.settings)
    owner_b = workspaces.create(WorkspaceSpec(owner="b", isolation="strict"), multi.settings)
    try:
        script = Path(owner_a.path) / "keys.py"
        script.write_text(KEYS)
        shutil.copy(script, Path(owner_b.path) / "keys.py")
        added = multi.run("python3 keys.py add", workspace=owner_a.id, cwd=None, owner="a")
        assert added.stdout == "added\n", added
        # Positive control: A's next call finds its own secret in its user keyring.
        again = multi.run("python3 keys.py read", workspace=owner_a.id, cwd=None, owner="a")
        assert again.stdout == "s3cr3t-value\n", again
        stolen = multi.run("python3 keys.py read", workspace=owner_b.id, cwd=None, owner="b")
        assert stolen.stdout == "no key\n", stolen
    finally:
        workspaces.delete(owner_a.id, multi.settings)
        workspaces.delete(owner_b.id, multi.settings)


def test_finding_4_a_login_sessions_agent_sockets_are_out_of_reach(multi: Engine) -> None:
    runtime = Path(f"/run/user/{4000 + os.getpid() % 1000}")
    runtime.mkdir(parents=True, exist_ok=True)
    agent = runtime / "agent.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(agent))
        os.chmod(agent, 0o777)  # noqa: S103 - any account may connect: the attack
        os.chmod(runtime, 0o755)  # noqa: S103 - as a login session makes it
        server.listen(1)
        # Positive control: any process of the host connects to it.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.connect(str(agent))
        result = multi.run(
            f"ls /run/user; python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); "
            f"s.connect(\"{agent}\"); print(\"connected\")'")
        assert "connected" not in result.stdout
        assert "No such file" in result.stderr, result
    finally:
        server.close()
        shutil.rmtree(runtime, ignore_errors=True)


def test_finding_5_a_planted_link_never_sends_a_mount_elsewhere(
    tmp_path: Path, janitor: Janitor, host_dir: Path
) -> None:
    with engine_with(tmp_path, janitor) as engine:
        project = engine.tmp / "app"
        project.mkdir()
        give_to_run_user(project)  # a project is the run user's (OPERATIONS.md)
        victim = host_dir / "victim"
        victim.mkdir(mode=0o700)
        before = victim.stat()
        # What the call did: a link in the project to a directory it wants.
        (project / "out").symlink_to(victim)
        with pytest.raises(workspaces.WorkspaceError) as refused:
            workspaces.create(WorkspaceSpec(path=str(project), mounts={"/out": "out"}),
                              engine.settings)
        assert "link" in str(refused.value)
        after = victim.stat()
        assert (after.st_uid, after.st_gid, after.st_mode) == (
            before.st_uid, before.st_gid, before.st_mode)
        # Positive control: a real directory there is mounted.
        (project / "out").unlink()
        (project / "out").mkdir()
        give_to_run_user(project / "out")
        record = workspaces.create(WorkspaceSpec(path=str(project), mounts={"/out": "out"}),
                                   engine.settings)
        try:
            wrote = engine.run("echo hi > /out/f && cat /out/f", workspace=record.id, cwd=None)
            assert wrote.stdout == "hi\n", wrote.stderr
            assert (project / "out" / "f").read_text() == "hi\n"
        finally:
            workspaces.delete(record.id, engine.settings)


def test_finding_6_a_cwd_under_a_directory_its_user_cannot_enter_is_refused(
    multi: Engine, host_dir: Path
) -> None:
    secret = host_dir / "x" / "config"
    secret.mkdir(parents=True)
    (host_dir / "x").chmod(0o700)
    (secret / "token").write_text("host-secret\n")
    assert (secret / "token").read_text() == "host-secret\n"  # root on the host reads it
    result = multi.run("cat token", cwd=str(secret))
    assert "host-secret" not in result.stdout
    assert result.error is not None and result.error.kind == "bad_cwd", result
    # A 0700 directory of the host's under /var (shown as the workspace root's) is masked.
    private = Path(f"/var/lib/bashfleet-test-{uuid.uuid4().hex[:8]}")
    private.mkdir(mode=0o700)
    try:
        (private / "key").write_text("var-secret\n")
        read = multi.run(f"cat {private}/key")
        assert "var-secret" not in read.stdout
    finally:
        shutil.rmtree(private, ignore_errors=True)


def test_a_secret_file_under_var_tmp_does_not_stop_calls(tmp_path: Path,
                                                         janitor: Janitor) -> None:
    secret = Path(f"/var/tmp/bashfleet-test-secret-{uuid.uuid4().hex[:8]}")
    secret.write_text("x")
    try:
        with engine_with(tmp_path, janitor, secret_files=(str(secret),)) as engine:
            result = engine.run(f"echo ran; cat {secret} 2>&1 | head -c 40")
            assert result.error is None and result.stdout.startswith("ran\n"), result
    finally:
        secret.unlink()


def test_a_directory_made_or_removed_at_the_top_level_is_seen_at_once(multi: Engine) -> None:
    top = Path(f"/bashfleet-test-{uuid.uuid4().hex[:8]}")
    top.mkdir()
    try:
        (top / "f").write_text("here\n")
        seen = multi.run(f"cat {top}/f")
        assert seen.stdout == "here\n", seen
    finally:
        shutil.rmtree(top)
    gone = multi.run(f"test -e {top} || echo gone")
    assert gone.error is None and gone.stdout == "gone\n", gone


def _tree_digest(*roots: str) -> str:
    digest = hashlib.sha256()
    for root in roots:
        for folder, subdirs, files in os.walk(root):
            subdirs.sort()
            for name in sorted(files):
                path = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    info = os.lstat(path)
                    digest.update(f"{path}:{info.st_size}:{info.st_mtime_ns}".encode())
    return digest.hexdigest()


def test_root_inside_writes_its_own_layer_and_the_hosts_dirs_as_any_account_would(
        multi: Engine) -> None:
    """A host-root workspace's root makes what it likes at its own `/` (its layer), its
    HOME and its directory (`pip install --user`, a venv); the host's directories are the
    host's, read-only, their files nobody's inside: `apt-get install` and writes to
    /usr/local are an image workspace's to make (tests/integration/test_image_workspaces)."""
    watched = ("/usr/local", "/usr/bin", "/etc/apt", "/var/lib/dpkg")
    before = _tree_digest(*watched)
    record = workspaces.create(WorkspaceSpec(), multi.settings)
    try:
        made = multi.run("mkdir /dst && echo data > /dst/f && cat /dst/f && "
                         "stat -c %u:%g /usr/bin/env /etc/hosts", workspace=record.id, cwd=None)
        assert made.stdout == f"data\n{NOBODY}:{NOBODY}\n{NOBODY}:{NOBODY}\n", made
        refused = multi.run(
            "for f in /etc/hosts /usr/local/bin/bf-tool /var/lib/dpkg/bf-x; do "
            "(echo x >> $f) 2>/dev/null && echo wrote $f; done; "
            "apt-get install -y -q --no-install-recommends hello >/dev/null 2>&1 "
            "|| echo no-apt", workspace=record.id, cwd=None, timeout_s=120)
        assert refused.stdout == "no-apt\n", refused
        # A real `pip install --user` (a package made here: no index needed) and a venv.
        package = Path(record.path) / "bfpkg"
        (package / "bfmod").mkdir(parents=True)
        (package / "bfmod" / "__init__.py").write_text(
            "VALUE = 42\ndef main():\n    print('bf-cli', VALUE)\n")
        (package / "setup.py").write_text(
            "from setuptools import setup\nsetup(name='bfmod', version='1.0', "
            "packages=['bfmod'], entry_points={'console_scripts': ['bf-cli=bfmod:main']})\n")
        assert record.ids is not None
        for path in (package, package / "bfmod", *package.rglob("*.py")):
            os.chown(path, record.ids[0], record.ids[0])  # the workspace root's, as uploaded
        piped = multi.run(
            "python3 -m pip install -q --user --no-index --no-build-isolation "
            "--break-system-packages --root-user-action=ignore ./bfpkg >/tmp/pip.log 2>&1 "
            "|| cat /tmp/pip.log >&2; cd / && python3 -c 'import bfmod; print(bfmod.VALUE)' "
            "&& ~/.local/bin/bf-cli && python3 -m venv --without-pip /tmp/v "
            "&& /tmp/v/bin/python -c 'import sys; print(sys.prefix)'",
            workspace=record.id, cwd=None, timeout_s=120)
        assert piped.stdout.splitlines() == ["42", "bf-cli 42", "/tmp/v"], piped.stderr
    finally:
        workspaces.delete(record.id, multi.settings)
    assert not Path("/dst").exists() and not Path("/usr/local/bin/bf-tool").exists()
    assert _tree_digest(*watched) == before


# Ids of their own: the paths are new in each process that collects them (pytest-xdist's
# workers must agree on the tests' names).
@pytest.mark.parametrize("where", [
    f"/var/cache/bf-deep-{uuid.uuid4().hex[:8]}/a/b/c/d/e",  # deeper than a scan would go
    f"/usr/local/share/bf-deep-{uuid.uuid4().hex[:8]}",
    f"/etc/bf-deep-{uuid.uuid4().hex[:8]}",
], ids=["var-cache-deep", "usr-local-share", "etc"])
def test_a_root_only_host_file_made_after_the_worker_started_is_not_the_tenants(
        multi: Engine, where: str) -> None:
    """Host root's files are no workspace root's: a 0600 file, and a 0644 one in a 0700
    directory, made after the workspace started, anywhere in the system's directories,
    read by the host's root and by no unprivileged account, are not read by a tenant's
    root either; a world-readable one beside them is (the probe can read)."""
    record = workspaces.create(WorkspaceSpec(), multi.settings)
    folder = Path(where)
    # The outermost directory this test makes: all it removes after.
    made = next(p for p in [*reversed(folder.parents), folder] if not p.exists())
    try:
        folder.mkdir(parents=True)
        (folder / "master.key").write_text("root-only\n")
        (folder / "master.key").chmod(0o600)
        (folder / "open.txt").write_text("world\n")
        (folder / "open.txt").chmod(0o644)
        shut = folder / "shut"
        shut.mkdir(mode=0o700)
        (shut / "config").write_text("in-a-0700-dir\n")
        (shut / "config").chmod(0o644)
        assert as_nobody("cat", str(folder / "master.key"))[0] != 0
        assert as_nobody("cat", str(folder / "open.txt")) == (0, b"world\n")
        read = multi.run(f"cat {folder}/open.txt; cat {folder}/master.key; "
                         f"cat {shut}/config; cat /etc/shadow | head -c 1",
                         workspace=record.id, cwd=None)
        assert read.stdout == "world\n", read
        assert read.stderr.count("Permission denied") == 3, read.stderr
    finally:
        workspaces.delete(record.id, multi.settings)
        shutil.rmtree(made, ignore_errors=True)


def test_id_slots_are_freed_when_their_keeper_ends(multi: Engine) -> None:
    record = workspaces.create(WorkspaceSpec(), multi.settings)
    assert record.ids is not None
    uid = gid = record.ids[0]

    def locked() -> bool:
        return id_slots.held(uid, gid, lock_dir=multi.settings.id_lock_dir)

    assert locked()  # held by the keeper
    assert record.keeper_pid is not None
    os.kill(record.keeper_pid, 9)  # however it ends
    from .engine_helpers import wait_until  # noqa: PLC0415

    wait_until(lambda: not locked(), what="the slot freed")
    workspaces.delete(record.id, multi.settings)


# ------------------------------------------------------------- a worker that is not root

NON_ROOT_SCRIPT = """
import json, os, sys
state, keys, agent, secret_dir = sys.argv[1:5]
os.environ["XDG_STATE_HOME"] = os.path.join(state, "xdg")
os.environ["XDG_DATA_HOME"] = os.path.join(state, "data")
from bashfleet.worker import Call, run_call
from bashfleet.worker.engine import sandbox, workspaces
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import WorkspaceSpec
# The filter lifted (it refuses add_key): what is tested is the keyring a call would reach.
settings = Settings(state_dir=os.path.join(state, "state"), host="non-root", seccomp="unconfined")
out = {"tenancy": sandbox.probe(settings).tenancy, "problem": sandbox.probe(settings).problem}
made = {o: workspaces.create(WorkspaceSpec(owner=o), settings) for o in ("a", "b")}
import shutil
for record in made.values():
    shutil.copy(keys, os.path.join(record.path, "keys.py"))
def run(owner, command, cwd=None):
    result = run_call(Call(call_id=f"nr-{owner}-{len(out)}", command=command, owner=owner,
                           workspace=made[owner].id, cwd=cwd), settings=settings)
    return {"out": result.stdout, "err": result.stderr,
            "error": result.error.kind if result.error else None,
            "message": result.error.message if result.error else None}
try:
    out["ns"] = [run(o, "readlink /proc/self/ns/user; cat /proc/self/uid_map") for o in made]
    out["add"] = run("a", "python3 keys.py add")
    out["own"] = run("a", "python3 keys.py read")
    out["steal"] = run("b", "python3 keys.py read")
    out["agent"] = run("a", "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); "
                       f"s.connect(\\"{agent}\\"); print(\\"connected\\")'")
    out["cwd"] = run("a", "cat token", cwd=secret_dir)
    out["setuid"] = run("a", "cp /bin/sh ./sh && chmod 6755 ./sh && echo made")
    out["root"] = str(settings.workspace_root_dir())
    out["path"] = made["a"].path
    # And with the filter, as such a host runs by default: add_key is refused.
    tight = Settings(state_dir=os.path.join(state, "tight"), host="non-root")
    made["tight"] = workspaces.create(WorkspaceSpec(owner="tight"), tight)
    shutil.copy(keys, os.path.join(made["tight"].path, "keys.py"))
    out["filtered"] = run_call(Call(call_id="nr-tight", command="python3 keys.py add",
                                    owner="tight", workspace=made["tight"].id),
                               settings=tight).stdout
finally:
    for owner, record in made.items():
        workspaces.delete(record.id, tight if owner == "tight" else settings)
    sandbox.close_all()
print(json.dumps(out))
"""


def test_a_non_root_worker_is_single_tenant_and_still_keeps_the_findings_out(
    tmp_path: Path, host_dir: Path
) -> None:
    import json  # noqa: PLC0415
    import pwd  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    nobody = pwd.getpwnam("nobody")
    state = Path(tempfile.mkdtemp(prefix="bashfleet-non-root-"))
    runtime = Path(f"/run/user/{nobody.pw_uid}")
    made_runtime = not runtime.exists()
    runtime.mkdir(parents=True, exist_ok=True)
    agent = runtime / f"agent-{uuid.uuid4().hex[:6]}.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    secret = host_dir / "x" / "config"
    try:
        os.chown(state, nobody.pw_uid, nobody.pw_gid)
        keys = state / "keys.py"
        keys.write_text(KEYS)
        keys.chmod(0o644)
        server.bind(str(agent))
        os.chmod(agent, 0o777)  # noqa: S103 - the worker's own session socket, open to it
        server.listen(1)
        secret.mkdir(parents=True)
        (secret / "token").write_text("host-secret\n")
        (host_dir / "x").chmod(0o700)
        host_dir.chmod(0o755)
        script = f"import sys; sys.path[:0] = {list(readable_install())!r}\n" + NON_ROOT_SCRIPT
        done = subprocess.run(
            ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}",
             "--clear-groups", "/usr/bin/python3", "-I", "-c", script, str(state),
             str(keys), str(agent), str(secret)],
            capture_output=True, text=True, timeout=180, check=False, cwd="/",
            env={"PATH": os.defpath, "HOME": str(state)})
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout.splitlines()[-1])
        assert out["tenancy"] == "single"  # said so in `bashfleet hosts`
        assert out["add"]["out"] == "added\n", (out["add"], out["problem"])
        assert out["own"]["out"] == "s3cr3t-value\n", out["own"]  # the attack could work
        # One tenant's keyring is not another's; a login session's agent socket is out
        # of reach.
        assert out["steal"]["out"] == "no key\n", (out["steal"], out["ns"])
        assert "connected" not in out["agent"]["out"], out["agent"]
        assert "host-secret" not in out["cwd"]["out"] and out["cwd"]["error"] == "bad_cwd"
        assert out["setuid"]["out"] == "made\n", out["setuid"]
        assert out["filtered"] == "add failed\n", out["filtered"]
        # The worker's workspace root is 0700: no other account reaches it.
        assert stat.S_IMODE(os.stat(out["root"]).st_mode) == 0o700
    finally:
        server.close()
        agent.unlink(missing_ok=True)
        if made_runtime:
            shutil.rmtree(runtime, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


STRICT_HOME_SCRIPT = """
import json, os, sys, tempfile
state = sys.argv[1]
os.environ["XDG_STATE_HOME"] = os.path.join(state, "xdg")
os.environ["XDG_DATA_HOME"] = os.path.join(state, "data")
from bashfleet.worker import Call, run_call
from bashfleet.worker.engine import sandbox, workspaces
from bashfleet.worker.settings import Settings
settings = Settings(state_dir=os.path.join(state, "state"), host="strict-home")
try:
    result = run_call(Call(call_id="strict-home-1", isolation="strict",
                           command="echo $HOME; touch ~/made && echo wrote"), settings=settings)
    print(json.dumps({"out": result.stdout,
                      "error": result.error.message if result.error else None}))
finally:
    for record in workspaces.local_records(settings):
        workspaces.delete(record.id, settings)
    sandbox.close_all()
"""


def test_strict_on_a_non_root_worker_whose_home_is_under_home(tmp_path: Path) -> None:
    import json  # noqa: PLC0415
    import pwd  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    nobody = pwd.getpwnam("nobody")
    home = Path(f"/home/bashfleet-test-{uuid.uuid4().hex[:8]}")
    state = Path(tempfile.mkdtemp(prefix="bashfleet-strict-home-"))
    try:
        home.mkdir()
        for path in (home, state):
            os.chown(path, nobody.pw_uid, nobody.pw_gid)
        script = f"import sys; sys.path[:0] = {list(readable_install())!r}\n" + STRICT_HOME_SCRIPT
        done = subprocess.run(
            ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}",
             "--clear-groups", "/usr/bin/python3", "-I", "-c", script, str(state)],
            capture_output=True, text=True, timeout=120, check=False, cwd="/",
            env={"PATH": os.defpath, "HOME": str(home)})
        assert done.returncode == 0, done.stderr[-3000:]
        answer = json.loads(done.stdout.splitlines()[-1])
        assert answer["error"] is None, answer
        # Its HOME is its workspace's own (strict hides the host's /home).
        assert answer["out"] == f"{home}\nwrote\n"
        assert not (home / "made").exists()
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


def test_a_workspaces_root_cannot_unmount_what_hides_the_hosts_secrets(multi: Engine) -> None:
    secret = Path("/etc/bashfleet")  # the fleet's configuration: hidden by a tmpfs
    made = not secret.exists()
    secret.mkdir(mode=0o755, exist_ok=True)
    probe = secret / f"bf-probe-{uuid.uuid4().hex[:8]}"
    probe.write_text("config\n")
    probe.chmod(0o644)
    assert as_nobody("cat", str(probe)) == (0, b"config\n")  # any account could read it
    try:
        result = multi.run(
            "unshare -m python3 -c 'import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
            f"rc = libc.umount2(b\"{secret}\", 2); print(rc, os.strerror(ctypes.get_errno())); "
            f"print(os.listdir(\"{secret}\"))'; mount -t tmpfs none /mnt || echo no-mount")
    finally:
        probe.unlink()
        if made:
            secret.rmdir()
    lines = result.stdout.splitlines()
    assert lines[0].startswith("-1 "), result  # locked: it came from the keeper's namespace
    assert lines[1] == "[]"  # still the empty tmpfs
    assert lines[-1] == "no-mount"  # its mount namespace is the host root's, not its own
