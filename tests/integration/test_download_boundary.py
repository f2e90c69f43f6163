"""A directory download writes only inside its destination, whatever the workspace does,
with real workers.

The attack as reported: the worker wrote a download's archive into the workspace's /tmp
(`.bashfleet-download-*.tar`), a background job renamed a crafted tar over it, and the
client's `tarfile` filter let the crafted tar's symlink chain out (CVE-2025-4517): a
command wrote anywhere the client's user may. Now the archive streams from the tool's
stdout through a pipe (no file of it in the workspace), and since the workspace's
commands may replace that tool (`tar` is theirs to replace), the client checks every
member itself before anything is written (`bashfleet.client._core.archives`), on every Python:
Debian 12's 3.11.2, whose tarfile has no filters, included.

Each crafted archive (`crafted_tars`) is first shown to write its target outside the
destination when unpacked as it is; the download of it must not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bashfleet.client import Fleet, Workspace
from bashfleet.client.errors import WorkspaceFileError
from bashfleet.client.redis_server import RedisServer

from . import crafted_tars
from .conftest import WorkerFactory, WorkerProcess

HOST = "dlbound"
#: The workspaces whose tools a test replaces: their /usr/local/bin is their own (a mount
#: of their directory's bin/), as an image workspace's is; the host's own directories
#: are read-only to every workspace.
OWN_TOOLS = {"/usr/local/bin": "bin"}
REPO = Path(__file__).resolve().parents[2]
DEBIAN_PYTHON = Path("/usr/bin/python3")

#: A job that, like the reported attack's, swaps its crafted tar over every file of the
#: workspace's /tmp a download might leave there, and notes each swap it made.
RENAMER = (
    "while :; do for f in /tmp/.bashfleet-*; do "
    "if [ -e \"$f\" ] && [ \"${f%.x}\" = \"$f\" ]; then "
    "cp /crafted/overflow.tar \"$f.x\" && mv -f \"$f.x\" \"$f\" && echo \"$f\" >> /crafted/hits; "
    "fi; done; sleep 0.005; done"
)
#: The workspace's `tar` replaced by one that sends the crafted archive (`$CRAFTED`).
FAKE_TAR = "#!/bin/sh\nexec cat /crafted/current.tar\n"


@pytest.fixture(name="host", scope="module")
def _host_fixture(session_workers: WorkerFactory) -> Iterator[WorkerProcess]:
    yield from session_workers.module_host(HOST)


def _fleet(redis_server: RedisServer) -> Fleet:
    return Fleet(redis_server.url, owner=f"tenant-{uuid.uuid4().hex[:8]}")


def _outside(dest: Path) -> set[str]:
    """What lies beside the destination (where every crafted archive aims)."""
    return {path.name for path in dest.parent.iterdir()} if dest.parent.exists() else set()


def _proof(name: str, dest: Path) -> None:
    """Unpacked as it is, the archive named does what it is made for."""
    archive = crafted_tars.crafted(dest)[name]
    crafted_tars.unpack_naively(archive.data, dest)
    if archive.target is not None:
        assert archive.target.exists(), f"{name}: the naive unpack did not reach its target"
    else:
        assert (dest / "null").is_char_device(), f"{name}: no device made"


def test_a_renamer_in_the_workspace_finds_no_archive_to_swap(
    host: WorkerProcess, redis_server: RedisServer, tmp_path: Path,
) -> None:
    """The reported attack, replayed: while a job swaps its crafted tar over anything a
    download could leave in /tmp, downloads bring the directory's own files, exactly."""
    _proof("overflow", tmp_path / "naive" / "dest")
    with _fleet(redis_server) as fleet, fleet.workspace(host=HOST) as ws:
        ws.run("mkdir -p data/sub /crafted; echo one > data/a; head -c 300000 /dev/urandom "
               "> data/sub/b; ln -s a data/link")
        ws.write_file("/crafted/overflow.tar",
                      crafted_tars.crafted(tmp_path / "down0" / "dest")["overflow"].data)
        job = ws.run(RENAMER, mode="background").job
        assert job is not None
        try:
            for n in range(5):
                dest = tmp_path / f"down{n}" / "dest"
                ws.download("data", dest)
                assert (dest / "a").read_text() == "one\n"
                assert (dest / "sub" / "b").read_bytes() == ws.read_file("data/sub/b")
                assert os.readlink(dest / "link") == "a"
                assert _outside(dest) == {"dest"}
            hits = ws.run("cat /crafted/hits 2>/dev/null | wc -l").stdout.strip()
        finally:
            ws.kill(job.id)
    assert hits == "0", "a download left a file in the workspace's /tmp"


def test_whatever_the_workspaces_tar_sends_nothing_lands_outside(
    host: WorkerProcess, redis_server: RedisServer, tmp_path: Path,
) -> None:
    """The workspace's `tar` replaced by one that sends a crafted archive: each download
    is refused whole, with a clear error, nothing written, on this Python and on
    Debian's (the very bytes the host sent)."""
    sent = tmp_path / "sent"
    sent.mkdir()
    with _fleet(redis_server) as fleet, fleet.workspace(host=HOST, mounts=OWN_TOOLS) as ws:
        ws.run("mkdir -p /crafted dir; echo x > dir/x")
        ws.write_file("/usr/local/bin/tar", FAKE_TAR, mode=0o755)
        for name in crafted_tars.crafted(tmp_path / "x" / "dest"):
            _proof(name, tmp_path / "naive" / name / "dest")
            dest = tmp_path / "fleet" / name / "dest"
            archive = crafted_tars.crafted(dest)[name]
            ws.write_file("/crafted/current.tar", archive.data)
            with pytest.raises(WorkspaceFileError, match=r"refused to unpack into .*dest: '"):
                ws.download("dir", dest)
            assert not dest.exists() or not any(dest.iterdir()), name
            assert _outside(dest) <= {"dest"}, name
            _capture(ws, sent / f"{name}.tar")
    _check_on_debian_python(sent, tmp_path / "fleet")


def _capture(ws: Workspace, path: Path) -> None:
    """The bytes the host streams for a download of `dir`, as they arrive."""
    with open(path, "wb") as sink:
        ws._receive("tree", "dir", sink)


#: Run by Debian's python3: the host's bytes through the client's checks (refused, nothing
#: written), after the naive unpack of each archive reached its target there too.
DEBIAN_CHECK = """
import io, json, sys, tarfile, types
from pathlib import Path
sys.path[:0] = [sys.argv[1] + "/tests/integration"]
# The checkout's folders as the package `bashfleet`'s subpackages, as installed.
package = types.ModuleType("bashfleet")
package.__path__ = [sys.argv[1]]
sys.modules["bashfleet"] = package
from bashfleet.client._core import archives
import crafted_tars
sent, fleet, scratch = Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
report = {"filters": archives.HAS_FILTERS, "version": sys.version.split()[0]}
for path in sorted(sent.iterdir()):
    name = path.stem
    naive = scratch / name / "dest"
    archive = crafted_tars.crafted(naive)[name]
    crafted_tars.unpack_naively(archive.data, naive)
    reached = archive.target.exists() if archive.target else (naive / "null").is_char_device()
    dest = fleet / name / "dest"
    try:
        with tarfile.open(fileobj=io.BytesIO(path.read_bytes())) as tar:
            archives.extract(tar, str(dest))
        refused = None
    except archives.UnsafeMemberError as exc:
        refused = str(exc)
    beside = sorted(p.name for p in dest.parent.iterdir()) if dest.parent.exists() else []
    report[name] = {"naive_reached": reached, "refused": refused, "beside": beside}
print(json.dumps(report))
"""


def _check_on_debian_python(sent: Path, fleet: Path) -> None:
    if not DEBIAN_PYTHON.exists():
        pytest.skip("no /usr/bin/python3 (Debian's) on this machine")
    with tempfile.TemporaryDirectory() as scratch:
        done = subprocess.run(
            [str(DEBIAN_PYTHON), "-s", "-c", DEBIAN_CHECK, str(REPO), str(sent), str(fleet),
             scratch], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    print(f"\n{DEBIAN_PYTHON} {report.pop('version')} (tarfile filters: "
          f"{report.pop('filters')}): {report}", file=sys.stderr)
    assert set(report) == {path.stem for path in sent.iterdir()}
    for name, seen in report.items():
        assert seen["naive_reached"], name
        assert seen["refused"], name
        assert seen["beside"] == [], name  # not even the destination was made


def test_a_tree_the_commands_made_comes_down_only_inside(
    host: WorkerProcess, redis_server: RedisServer, tmp_path: Path,
) -> None:
    """Real tar, a tree made by commands: links inside come down as links; one pointing
    outside (or a FIFO) refuses the whole download, nothing written."""
    with _fleet(redis_server) as fleet, fleet.workspace(host=HOST) as ws:
        ws.run("mkdir -p ok/d bad fifo; echo f > ok/d/f; ln -s d/f ok/rel; ln -s . ok/self; "
               "cp -r ok/d bad/; ln -s ../../../.. bad/up; cp -r ok/d fifo/; mkfifo fifo/p")
        ws.download("ok", tmp_path / "ok" / "dest")
        assert (tmp_path / "ok" / "dest" / "rel").read_text() == "f\n"
        assert _outside(tmp_path / "ok" / "dest") == {"dest"}
        for name, why in (("bad", "outside"), ("fifo", "FIFO")):
            dest = tmp_path / name / "dest"
            with pytest.raises(WorkspaceFileError, match=why):
                ws.download(name, dest)
            assert _outside(dest) <= {"dest"} and (not dest.exists() or not any(dest.iterdir()))
