"""bashfleet.worker.engine.snapshots.snapshots' two-phase copy: what changed after the first copy
(while a workspace ran on) is copied again, so the copy is the source at the frozen instant."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from privilege import needs_root

from bashfleet.worker.engine.snapshots import snapshot_store, snapshots, tree_copy
from bashfleet.worker.wire.models import WorkspaceRecord


def _tree(root: Path) -> dict[str, tuple[object, ...]]:
    found: dict[str, tuple[object, ...]] = {}
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder) / name
            info = path.lstat()
            rel = str(path.relative_to(root))
            content: object = None
            if stat.S_ISREG(info.st_mode):
                content = path.read_bytes()
            elif stat.S_ISLNK(info.st_mode):
                content = os.readlink(path)
            xattrs = tuple(sorted((n, os.getxattr(path, n, follow_symlinks=False))
                                  for n in os.listxattr(path, follow_symlinks=False)))
            found[rel] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), info.st_uid,
                          content, xattrs)
    return found


def _ws(ws_id: str) -> WorkspaceRecord:
    """A workspace record that names whose layers a copy's errors are about."""
    return WorkspaceRecord(id=ws_id, host="h", path="/x", fresh=True, out_dir="/o",
                           isolation="strict", network=True, ttl_s=1, created_at=0)


def _base(src: Path) -> None:
    (src / "d" / "e").mkdir(parents=True)
    (src / "d" / "a.txt").write_text("aaaa")
    (src / "d" / "e" / "b.txt").write_text("bb")
    (src / "gone.txt").write_text("x")
    (src / "link").symlink_to("d/a.txt")
    (src / "becomes_dir").write_text("file")


def _rewrite(s: Path) -> None:
    (s / "d" / "a.txt").write_text("AAAA")


def _new_file(s: Path) -> None:
    (s / "d" / "e" / "new.txt").write_text("new")


def _removed_file(s: Path) -> None:
    (s / "gone.txt").unlink()


def _new_tree(s: Path) -> None:
    (s / "n" / "m").mkdir(parents=True)
    (s / "n" / "m" / "f").write_text("f")


def _dir_mode(s: Path) -> None:
    (s / "d" / "e").chmod(0o700)


def _dir_xattr(s: Path) -> None:
    os.setxattr(s / "d", "user.opaque", b"y")


def _file_to_dir(s: Path) -> None:
    (s / "becomes_dir").unlink()
    (s / "becomes_dir").mkdir()
    (s / "becomes_dir" / "in").write_text("in")


def _removed_dir(s: Path) -> None:
    (s / "d" / "e" / "b.txt").unlink()
    (s / "d" / "e").rmdir()


def _relinked(s: Path) -> None:
    (s / "link").unlink()
    (s / "link").symlink_to("gone.txt")


def _whiteout(s: Path) -> None:
    os.mknod(s / "d" / "wh", stat.S_IFCHR | 0o600, os.makedev(0, 0))


MUTATIONS: dict[str, Callable[[Path], None]] = {
    "same size rewrite": _rewrite, "new file": _new_file, "removed file": _removed_file,
    "new tree": _new_tree, "dir mode": _dir_mode, "dir xattr": _dir_xattr,
    "file to dir": _file_to_dir, "removed dir": _removed_dir, "relinked": _relinked,
    "whiteout": _whiteout,
}


@needs_root("whiteouts (device nodes) need root")
@pytest.mark.parametrize("change", sorted(MUTATIONS))
def test_what_changed_after_the_first_copy_is_copied_again(change: str, tmp_path: Path) -> None:
    src, copy = tmp_path / "src", tmp_path / "copy"
    src.mkdir()
    _base(src)
    before = snapshots._listing(src)
    subprocess.run(["cp", "-a", "-T", str(src), str(copy)], check=True)
    MUTATIONS[change](src)
    assert _tree(src) != _tree(copy)  # the change is one the first copy has not got
    _catch_up_and_compare(src, copy, before, snapshots._listing(src))



def _catch_up_and_compare(src: Path, copy: Path, before: dict[str, tuple[snapshots.Stamp, int]],
                          after: dict[str, tuple[snapshots.Stamp, int]]) -> None:
    """The catch-up copy from listing `before` to `after`, then `copy` equals `src`."""
    copies, dirs = snapshots._catch_up(copy, before, after)
    ws = _ws("w" + "0" * 15)
    snapshots._copy_layers([(src, copy, copies, None)] if copies else [], ws)
    snapshots._settle_dirs(src, copy, dirs)
    assert _tree(copy) == _tree(src)


def test_nothing_changed_copies_nothing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    _base(src)
    listing = snapshots._listing(src)
    assert snapshots._listing(src) == listing
    assert snapshots._catch_up(tmp_path / "copy", listing, listing) == ([], [])


@needs_root("the settling gives the layer's files the snapshot's owners")
@pytest.mark.parametrize("swapped_back", [False, True])
def test_a_link_the_first_copy_took_is_never_followed(tmp_path: Path,
                                                      swapped_back: bool) -> None:
    """A workspace swaps a directory for a link to somewhere else while the first copy
    runs (then, maybe, back): the catch-up (run as root on the host) must neither remove
    nor chmod through the link the copy took."""
    src, copy, canary = tmp_path / "src", tmp_path / "copy", tmp_path / "canary"
    (src / "a").mkdir(parents=True)
    (src / "a" / "passwd").write_text("source")
    canary.mkdir(mode=0o755)
    (canary / "passwd").write_text("host's")
    before = snapshots._listing(src)
    (src / "a").rename(src / "a2")
    (src / "a").symlink_to(canary)
    subprocess.run(["cp", "-a", "-T", str(src), str(copy)], check=True)
    assert (copy / "a").is_symlink()  # the copy took the link: the attack's first half
    if swapped_back:
        (src / "a").unlink()
        (src / "a2").rename(src / "a")
        os.chmod(src / "a", 0o700)
    else:
        (src / "a2" / "passwd").unlink()
        (src / "a2").rmdir()
    after = snapshots._listing(src)
    copies, dirs = snapshots._catch_up(copy, before, after)
    ws = _ws("w" + "0" * 15)
    snapshots._copy_layers([(src, copy, copies, None)] if copies else [], ws)
    snapshots._settle_dirs(src, copy, dirs)
    # What the first copy took and the source no longer holds goes at the settling
    # (ids as they are: no slot of a workspace's among them).
    layer = tmp_path / "layer"
    layer.mkdir()
    copy.rename(layer / "copy")
    snapshots._settle_copy(layer, {"copy": after})
    copy = layer / "copy"
    assert (canary / "passwd").read_text() == "host's"
    assert stat.S_IMODE(canary.stat().st_mode) == 0o755
    assert _tree(copy) == _tree(src)


def test_a_copy_whose_source_went_names_it_and_fails_nothing(tmp_path: Path) -> None:
    """Running, an entry gone before the copy reached it is named, not an error: the
    frozen pass settles it (and there, a name is an error of the snapshot's)."""
    src = tmp_path / "src"
    _base(src)
    (tmp_path / "copy").mkdir()
    ws = _ws("w" + "0" * 15)
    gone = snapshots._copy_layers(
        [(src, tmp_path / "copy", ["d/a.txt", "d/gone", "nope/x"], None)], ws)
    assert gone == [["d/gone", "nope/x"]]
    assert (tmp_path / "copy" / "d" / "a.txt").read_text() == "aaaa"


def test_what_the_first_copy_left_out_is_copied_again_though_its_stamps_held(
        tmp_path: Path) -> None:
    """A directory swapped for a link as the first copy came to it, and swapped back
    before the freeze, lists as it did: what the copy left out is copied all the same."""
    src = tmp_path / "src"
    _base(src)
    listing = snapshots._listing(src)
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", "-T", str(src), str(copy)], check=True)
    subprocess.run(["rm", "-r", str(copy / "d" / "e")], check=True)
    assert snapshots._catch_up(copy, listing, listing) == ([], [])
    assert snapshots._catch_up(copy, listing, listing, missed=["d/e"]) == (["d/e"], [])


@needs_root("whiteouts (device nodes) need root")
@pytest.mark.parametrize("change", sorted(MUTATIONS))
def test_the_first_copys_own_looks_tell_what_changed_after_it(change: str,
                                                              tmp_path: Path) -> None:
    """As a snapshot takes it: no listing before the copy, the looks the copy took of each
    entry are what the frozen listing is held against."""
    src, copy = tmp_path / "src", tmp_path / "copy"
    src.mkdir()
    _base(src)
    copied: dict[str, os.stat_result] = {}
    assert tree_copy.copy_tree(str(src), str(copy), copied) == []
    assert set(copied) == set(snapshots._listing(src))  # every entry, the top as ''
    MUTATIONS[change](src)
    assert _tree(src) != _tree(copy)
    _catch_up_and_compare(src, copy, snapshots.stamps(copied), snapshots._listing(src))


def test_a_file_rewritten_after_the_copy_looked_is_copied_again(tmp_path: Path) -> None:
    """The copy's look at a file is the one its bytes were read after: a write after it,
    same size, is a change the frozen listing shows."""
    src, copy = tmp_path / "src", tmp_path / "copy"
    src.mkdir()
    (src / "f").write_text("aaaa")
    copied: dict[str, os.stat_result] = {}
    tree_copy.copy_tree(str(src), str(copy), copied)
    (src / "f").write_text("bbbb")
    copies, _ = snapshots._catch_up(copy, snapshots.stamps(copied), snapshots._listing(src))
    assert copies == ["f"]


def test_layers_copied_at_once_answer_in_order_and_a_failure_waits_for_the_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first layer copies on the calling thread, the others on the host's copier
    threads; what each left out comes back in the jobs' order, and a failing copy is
    raised as the workspace's SnapshotError only once every other copy ended (none
    still writes into a copy its caller is about to remove)."""
    ws = _ws("w" + "1" * 15)
    ran_on: dict[str, int] = {}
    ended: list[str] = []

    def fake_entries(src: str, dest: str, rels: list[str], ids: object = None) -> list[str]:
        ran_on[src] = threading.get_ident()
        if src == "slow":
            time.sleep(0.3)  # still copying when the first one fails
        ended.append(src)
        if src == "bad":
            raise OSError(28, "No space left on device")
        return [f"{src}-gone"]

    monkeypatch.setattr(tree_copy, "copy_entries", fake_entries)
    jobs: list[snapshots.CopyJob] = [(Path(name), tmp_path / name, ["x"], None)
                                     for name in ("a", "b", "slow")]
    assert snapshots._copy_layers(jobs, ws) == [["a-gone"], ["b-gone"], ["slow-gone"]]
    assert ran_on["a"] == threading.get_ident()
    assert ran_on["slow"] != threading.get_ident()
    ended.clear()
    bad_first: list[snapshots.CopyJob] = [(Path("bad"), tmp_path / "bad", ["x"], None),
                                          (Path("slow"), tmp_path / "slow", ["x"], None)]
    with pytest.raises(snapshot_store.SnapshotError, match=f"could not copy workspace {ws.id}'s"):
        snapshots._copy_layers(bad_first, ws)
    assert sorted(ended) == ["bad", "slow"]  # the slow copy ended before the error came


def test_a_forked_child_copies_on_copier_threads_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copier threads are the parent's: a child forked after they started (none
    of them in it) makes its own, rather than queueing work no thread will run."""
    ws = _ws("w" + "2" * 15)
    monkeypatch.setattr(tree_copy, "copy_entries",
                        lambda src, dest, rels, ids=None: [f"{src}-gone"])
    jobs: list[snapshots.CopyJob] = [(Path(name), tmp_path / name, ["x"], None)
                                     for name in ("a", "b", "c")]
    assert snapshots._copy_layers(jobs, ws) == [["a-gone"], ["b-gone"], ["c-gone"]]
    assert snapshots._copier_pool is not None  # started, in this process
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports by its exit status
        ok = False
        try:
            # Not the parent's pool (CPython's, copied, hands work to threads it
            # counts idle, which the child does not have), then one of its own.
            ok = snapshots._copier_pool is None and \
                snapshots._copy_layers(jobs, ws) == [["a-gone"], ["b-gone"], ["c-gone"]] and \
                snapshots._copier_pool is not None
        finally:
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 20
    while (status := os.waitpid(child, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            pytest.fail("the child's copy never ran: it queued on threads it does not have")
        time.sleep(0.01)  # polling the child's end, with a deadline
    assert os.waitstatus_to_exitcode(status[1]) == 0
