"""The zygote serves requests side by side: keepers asked for at once are made at once,
each answer reaches the thread that asked, and a request that fails (a bad view, a
helper that never reports, the zygote's end) fails only what it must. The blanks of a
burst are made ahead, and a take waits for one on its way."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bashfleet.worker.engine import resources, sandbox, workspaces
from bashfleet.worker.engine.isolate import launcher
from bashfleet.worker.engine.workspaces import blank_pool, disk, making, store, usage
from bashfleet.worker.engine.workspaces.store import WorkspaceError
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import WorkspaceSpec

from .engine_helpers import fd_holders, wait_until
from .sandbox_helpers import needs_bubblewrap, needs_cgroups

pytestmark = needs_bubblewrap

#: The stuck request's deadline in the zygote: long enough for the others to be made
#: while it is outstanding, short enough for a test.
STUCK_SETUP_S = 4.0


@dataclass
class Asked:
    """One request made on its own thread: its host pid, or the error it raised."""

    thread: threading.Thread
    pid: int | None = None
    error: OSError | None = None
    listener_inode: int = 0
    done: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def client() -> Iterator[launcher.LauncherClient]:
    bwrap = sandbox.bwrap_path(Settings(host="zygote-test"))
    assert bwrap is not None
    made = launcher.LauncherClient(sandbox.zygote_argv(bwrap, os.geteuid() != 0),
                                   sandbox.LAUNCHER_ENV)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def scratch() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="bashfleet-zygote-") as path:
        yield path


@pytest.fixture
def stuck_pipe() -> Iterator[tuple[int, int]]:
    """A pipe whose buffer is full: a helper told to join a "cgroup" through its write
    end blocks in write(2) and never reports. Closing the read end frees it (EPIPE)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(write_end, b"x" * 65536)
    os.set_blocking(write_end, True)
    try:
        yield read_end, write_end
    finally:
        os.close(write_end)
        os.close(read_end)


@pytest.fixture
def keepers() -> Iterator[list[int]]:
    """Host pids of keepers a test made; killed at its end."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _blank() -> dict[str, object]:
    return {"network": True, "worker_uid": os.geteuid(), "maker": os.getpid()}


def _ask(client: launcher.LauncherClient, path: str, spec: dict[str, object],
         extra_fds: list[int] | None = None, setup_s: float | None = None) -> Asked:
    """Ask for a keeper listening at `path` on a thread of its own."""
    listener = launcher.listen(path)
    asked = Asked(threading.Thread(target=lambda: None))
    asked.listener_inode = os.fstat(listener.fileno()).st_ino

    def run() -> None:
        try:
            asked.pid = client.keeper(spec, [listener.fileno(), *(extra_fds or [])], 20.0,
                                      setup_s=setup_s)
        except OSError as exc:
            asked.error = exc
        finally:
            listener.close()
            asked.done.set()

    asked.thread = threading.Thread(target=run, daemon=True)
    asked.thread.start()
    return asked


def _held_elsewhere(fd: int) -> Callable[[], bool | None]:
    """Whether a process other than this one holds the pipe of `fd` (a helper does)."""
    target = f"pipe:[{os.fstat(fd).st_ino}]"
    return lambda: bool(fd_holders(target) - {os.getpid()}) or None


def test_keepers_are_made_side_by_side_each_answer_to_its_asker(
        client: launcher.LauncherClient, scratch: str, stuck_pipe: tuple[int, int],
        keepers: list[int]) -> None:
    """A helper that never reports holds up no other request: six keepers and a bad
    view asked for after it are answered while it is outstanding, each thread gets the
    keeper that holds its own listening socket, the bad view fails alone; then the stuck
    one times out (ETIMEDOUT from the zygote, its helper killed) and the zygote goes on."""
    read_end, write_end = stuck_pipe
    stuck = _ask(client, f"{scratch}/stuck.sock", _blank(), [write_end], STUCK_SETUP_S)
    wait_until(_held_elsewhere(read_end), what="the stuck helper to block")
    root = f"{scratch}/root"
    os.mkdir(root)
    bad = _ask(client, f"{scratch}/bad.sock",
               {**_blank(), "plan": [["private"], ["tmpfs", root, 0o755],
                                     ["tmpfs", f"{scratch}/missing", 0o755]]})
    good = [_ask(client, f"{scratch}/k{n}.sock", _blank()) for n in range(6)]
    for asked in [bad, *good]:
        assert asked.done.wait(STUCK_SETUP_S * 0.75), "held up behind the stuck helper"
    assert not stuck.done.is_set()
    keepers.extend(asked.pid for asked in good if asked.pid is not None)
    assert [asked.error for asked in good] == [None] * 6
    for asked in good:
        assert asked.pid is not None
        assert asked.pid in fd_holders(f"socket:[{asked.listener_inode}]")
    assert len({asked.pid for asked in good}) == 6
    assert isinstance(bad.error, launcher.SandboxError)
    assert not isinstance(bad.error, launcher.KeeperLostError)
    assert bad.error.errno != errno.ETIMEDOUT
    assert stuck.done.wait(20.0)
    assert isinstance(stuck.error, launcher.SandboxError)
    assert stuck.error.errno == errno.ETIMEDOUT
    assert "did not report" in str(stuck.error)
    wait_until(lambda: not _held_elsewhere(read_end)() or None,
               what="the stuck helper to be killed")
    after = _ask(client, f"{scratch}/after.sock", _blank())
    assert after.done.wait(20.0)
    if after.pid is not None:
        keepers.append(after.pid)
    assert after.error is None and after.pid is not None


def test_a_hidden_directory_gone_since_the_plan_fails_no_view(
        client: launcher.LauncherClient, scratch: str, keepers: list[int]) -> None:
    """Another process removes a directory the plan hides (the host's /etc/bashfleet,
    made and removed by a test beside): nothing is there to hide, and the view is made.
    A plain tmpfs on a missing path still fails (the bad view above)."""
    root = f"{scratch}/hide-root"
    os.mkdir(root)
    os.mkdir(f"{root}/kept")
    plan = [["private"], ["tmpfs", root, 0o755], ["mkdir", f"{root}/kept", 0o755],
            ["hide", f"{root}/gone", 0o755], ["hide", f"{root}/kept", 0o755],
            ["hide_ro", f"{root}/gone"], ["hide_ro", f"{root}/kept"]]
    asked = _ask(client, f"{scratch}/hide.sock", {**_blank(), "plan": plan})
    assert asked.done.wait(20.0)
    assert asked.error is None and asked.pid is not None, asked.error
    keepers.append(asked.pid)


def test_the_zygote_s_end_fails_every_request_waiting(
        client: launcher.LauncherClient, scratch: str, stuck_pipe: tuple[int, int]) -> None:
    """Two requests outstanding (helpers that never report) when the zygote dies: both
    get KeeperLostError at once, not at their deadline; a request after it too."""
    read_end, write_end = stuck_pipe
    waiting = [_ask(client, f"{scratch}/w{n}.sock", _blank(), [write_end], 60.0)
               for n in range(2)]
    wait_until(lambda: len(fd_holders(f"pipe:[{os.fstat(read_end).st_ino}]")) >= 3 or None,
               what="both helpers to block")
    os.killpg(client.proc.pid, signal.SIGKILL)
    for asked in waiting:
        assert asked.done.wait(10.0)
        assert isinstance(asked.error, launcher.KeeperLostError)
    with pytest.raises(launcher.KeeperLostError):
        client.keeper(_blank(), [], 5.0)


def test_a_burst_s_blanks_are_made_ahead_and_each_taken_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Six blanks asked for ahead (a fork of six) and six takes at once: the takes wait
    for those on their way (six made in all, not twelve), each gets its own, alive."""
    settings = Settings(state_dir=tmp_path / "state", host="burst",
                        workspace_root=tmp_path / "ws", workspace_pool=0)
    pool = blank_pool.Blanks()
    made: list[int] = []
    real = blank_pool.make_blank

    def counted(*args: Any, **kwargs: Any) -> blank_pool.Blank:
        blank = real(*args, **kwargs)
        made.append(blank.pid)
        return blank

    monkeypatch.setattr(blank_pool, "make_blank", counted)
    taken: list[blank_pool.Blank] = []
    try:
        pool.ahead(settings, "none", prebuilt=False, count=6)
        with ThreadPoolExecutor(6) as takers:
            taken = list(takers.map(
                lambda _: pool.take(settings, "none", prebuilt=False), range(6)))
        assert sorted(made) == sorted(blank.pid for blank in taken)
        assert len(set(made)) == 6
        for blank in taken:
            os.kill(blank.pid, 0)
        assert not pool.ready.get((settings.state_dir, "none", False))
    finally:
        for blank in taken:
            blank.end()
        pool.close()


@needs_cgroups
def test_a_pool_closed_at_exit_leaves_no_blank_s_cgroup(tmp_path: Path) -> None:
    """The blanks a process made ahead end with it, their cgroups removed before it
    goes (a burst's worth of empty groups left behind at each exit otherwise)."""
    settings = Settings(state_dir=tmp_path / "state", host="close",
                        workspace_root=tmp_path / "ws", workspace_pool=0)
    pool = blank_pool.Blanks()
    key = (settings.state_dir, "none", False)
    try:
        pool.ahead(settings, "none", prebuilt=False, count=3)
        wait_until(lambda: len(pool.ready.get(key, [])) == 3 or None,
                   what="three blanks made ahead")
        groups = [path for blank in pool.ready[key] if blank.group is not None
                  for path, _ in blank.group.paths]
        assert len(groups) >= 3
        assert all(os.path.isdir(path) for path in groups)
    finally:
        pool.close()
    assert [path for path in groups if os.path.exists(path)] == []


@needs_cgroups
def test_a_maker_that_dies_before_its_blank_s_keeper_starts_leaves_the_reaper_its_cgroup(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker killed while it makes a blank, its cgroup made and its keeper not yet
    started: the reaper ends the blank (by its note, a keeper of pid 0) and removes its
    cgroup, which would otherwise outlive everything that named it."""
    settings = Settings(state_dir=tmp_path / "state", host="dies",
                        workspace_root=tmp_path / "ws", workspace_pool=0)
    made: list[str] = []
    real_group = resources.blank_group

    def group(*args: Any) -> Any:
        found = real_group(*args)
        made.extend(path for path, _ in (found.paths if found is not None else []))
        return found

    class Killed(BaseException):
        """The maker's death, where its keeper would start."""

    def killed(*_: Any) -> int:
        raise Killed

    monkeypatch.setattr(resources, "blank_group", group)
    monkeypatch.setattr(sandbox.zygote, "keeper", killed)
    with pytest.raises(Killed):
        blank_pool.make_blank(settings, "none")
    notes = list(settings.workspaces_dir.glob("*.blank"))
    assert len(notes) == 1 and made and all(os.path.isdir(path) for path in made)
    # Not while its maker lives (this process): a blank on its way is never taken away.
    assert blank_pool.reap_blanks(settings) == 0
    assert all(os.path.isdir(path) for path in made)
    # Its maker gone (the note names a process that is no more): reaped.
    note = json.loads(notes[0].read_text("utf-8"))
    assert note["pid"] == 0
    notes[0].write_text(json.dumps({**note, "maker_start": note["maker_start"] - 3600}),
                        encoding="utf-8")
    assert blank_pool.reap_blanks(settings, wait=True) == 1
    assert [path for path in made if os.path.exists(path)] == []
    assert list(settings.workspaces_dir.glob("*.blank")) == []


@needs_cgroups
def test_a_blank_s_note_stays_until_its_cgroup_is_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A blank ended while its cgroup could not be removed (its keeper would not go, or
    its maker was killed meanwhile) keeps its note: the next reaper, once the maker is
    gone, removes what is left. Removed whole, its note goes."""
    settings = Settings(state_dir=tmp_path / "state", host="stays",
                        workspace_root=tmp_path / "ws", workspace_pool=0)
    blank = blank_pool.make_blank(settings, "none")
    assert blank.group is not None and blank.pid > 0
    paths = [path for path, _ in blank.group.paths]
    gave_up = monkeypatch.context()
    with gave_up as patch:
        patch.setattr(type(blank.group), "remove", lambda self, timeout=2.0: False)
        for thread in blank.end():
            thread.join()
    assert blank.note.exists() and all(os.path.isdir(path) for path in paths)
    assert blank_pool.reap_blanks(settings, wait=True) == 0  # its maker (we) lives
    note = json.loads(blank.note.read_text("utf-8"))
    blank.note.write_text(json.dumps({**note, "maker_start": note["maker_start"] - 3600}),
                          encoding="utf-8")
    assert blank_pool.reap_blanks(settings, wait=True) == 1
    assert [path for path in paths if os.path.exists(path)] == []
    assert not blank.note.exists()
    wait_until(lambda: not os.path.exists(f"/proc/{blank.pid}") or None,
               what="the blank's keeper to be gone")


def _taken_blanks(monkeypatch: pytest.MonkeyPatch) -> list[blank_pool.Blank]:
    """The blanks `workspaces.create` takes from now on."""
    taken: list[blank_pool.Blank] = []
    real_take = blank_pool.blanks.take

    def take(*args: Any, **kwargs: Any) -> blank_pool.Blank:
        blank = real_take(*args, **kwargs)
        taken.append(blank)
        return blank

    monkeypatch.setattr(blank_pool.blanks, "take", take)
    return taken


def _maker_gone(note: Path) -> None:
    """Make a note name a maker that is no more (its start an hour earlier)."""
    info = json.loads(note.read_text("utf-8"))
    note.write_text(json.dumps({**info, "maker_start": info["maker_start"] - 3600}),
                    encoding="utf-8")


def _gone(pid: int) -> Callable[[], bool | None]:
    return lambda: not os.path.exists(f"/proc/{pid}") or None


@needs_cgroups
def test_a_claim_that_fails_after_the_keeper_took_it_ends_the_blank(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workspace's network could not be put in force once its keeper was claimed: the
    blank is ended, its keeper and cgroup with it (its note had gone at the claim: the
    keeper and its group stayed for good)."""
    settings = Settings(state_dir=tmp_path / "state", host="fails",
                        workspace_root=tmp_path / "ws", workspace_pool=0)
    taken = _taken_blanks(monkeypatch)

    def refused(*_: Any) -> None:
        raise WorkspaceError("spawn_failed", "no network for it")

    monkeypatch.setattr(making, "_claim_network", refused)
    with pytest.raises(WorkspaceError, match="no network for it"):
        workspaces.create(WorkspaceSpec(owner="o"), settings)
    assert len(taken) == 1 and taken[0].group is not None and taken[0].pid > 0
    paths = [path for path, _ in taken[0].group.paths]
    wait_until(_gone(taken[0].pid), what="the claimed blank's keeper to be gone")
    wait_until(lambda: not any(os.path.exists(path) for path in paths) or None,
               what="its cgroup to be removed")
    wait_until(lambda: not list(settings.workspaces_dir.glob("*.blank")) or None,
               what="its note to go")


@needs_cgroups
def test_a_maker_killed_before_the_record_is_saved_leaves_the_reaper_its_blank(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker killed between a blank's claim and the workspace record's save: no record
    names the keeper or the cgroup, so the blank's note must (it went at the claim)."""
    settings = Settings(state_dir=tmp_path / "state", host="killed",
                        workspace_root=tmp_path / "ws", workspace_pool=0)
    taken = _taken_blanks(monkeypatch)

    class Killed(BaseException):
        """The maker's death, where the record would be saved: nothing of it runs after."""

    def killed(*_: Any) -> None:
        raise Killed

    with monkeypatch.context() as dying:
        dying.setattr(store, "save", killed)
        dying.setattr(blank_pool.Blank, "end", lambda self: [])
        dying.setattr(disk, "remove_files", lambda *_: None)
        with pytest.raises(Killed):
            workspaces.create(WorkspaceSpec(owner="o"), settings)
    blank = taken[0]
    assert blank.group is not None
    paths = [path for path, _ in blank.group.paths]
    assert os.path.exists(f"/proc/{blank.pid}") and all(os.path.isdir(p) for p in paths)
    assert blank.note.exists()
    _maker_gone(blank.note)
    assert blank_pool.reap_blanks(settings, wait=True) == 1
    wait_until(_gone(blank.pid), what="the keeper to be gone")
    assert not any(os.path.exists(path) for path in paths)
    assert not blank.note.exists()


@needs_cgroups
def test_a_note_left_beside_a_saved_record_is_dropped_not_reaped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A maker killed after the record's save and before its blank's note went: the
    keeper and cgroup are the workspace's; the reaper drops the note and ends nothing."""
    settings = Settings(state_dir=tmp_path / "state", host="saved",
                        workspace_root=tmp_path / "ws", workspace_pool=0)
    taken = _taken_blanks(monkeypatch)
    with monkeypatch.context() as dying:
        dying.setattr(blank_pool.Blank, "forget", lambda self: None)
        record = workspaces.create(WorkspaceSpec(owner="o"), settings)
    try:
        blank = taken[0]
        assert blank.note.exists() and record.keeper_pid == blank.pid and record.cgroup
        _maker_gone(blank.note)
        assert blank_pool.reap_blanks(settings, wait=True) == 0
        assert not blank.note.exists()
        assert usage.keeper_alive(record)
        assert all(os.path.isdir(path) for path in record.cgroup)
    finally:
        workspaces.delete(record.id, settings)


@needs_cgroups
def test_a_maker_that_dies_as_its_blank_s_cgroup_is_made_leaves_the_reaper_a_note(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The note is written before the blank's cgroup and layers are made: a maker killed
    right after making the group (a process exiting while its make-ahead thread ran)
    leaves the reaper a note naming it."""
    settings = Settings(state_dir=tmp_path / "state", host="dies-early",
                        workspace_root=tmp_path / "ws", workspace_pool=0)
    made: list[str] = []
    real_group = resources.blank_group

    class Killed(BaseException):
        """The maker's death, just after its blank's cgroup was made."""

    def group_then_killed(*args: Any) -> Any:
        found = real_group(*args)
        made.extend(path for path, _ in (found.paths if found is not None else []))
        raise Killed

    with monkeypatch.context() as dying:
        dying.setattr(resources, "blank_group", group_then_killed)
        dying.setattr(blank_pool, "_undo", lambda *_, **__: None)  # nothing runs after death
        with pytest.raises(Killed):
            blank_pool.make_blank(settings, "none")
    assert made and all(os.path.isdir(path) for path in made)
    notes = list(settings.workspaces_dir.glob("*.blank"))
    assert len(notes) == 1
    _maker_gone(notes[0])
    assert blank_pool.reap_blanks(settings, wait=True) == 1
    assert [path for path in made if os.path.exists(path)] == []
    assert list(settings.workspaces_dir.glob("*.blank")) == []
