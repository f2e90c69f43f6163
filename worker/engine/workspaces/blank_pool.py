"""Blank keepers: keepers started ahead of need, each with its namespaces, ids and
network made, waiting for a workspace to claim them. Claiming one skips the slowest
steps of making a workspace. Blanks of a worker that ended are reaped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bashfleet.worker.engine import cgroups, id_slots, layout, procs, resources, sandbox
from bashfleet.worker.engine.isolate import launcher
from bashfleet.worker.engine.network import network
from bashfleet.worker.engine.workspaces import disk, store, visibility
from bashfleet.worker.settings import Settings

log = logging.getLogger("bashfleet.workspaces")


# --------------------------------------------------------------------- blank keepers


#: The notes of the blanks whose removal this process runs now: the reaper leaves them
#: to it (a keeper that will not die would get a thread a round otherwise).
_removing: set[str] = set()
_removing_lock = threading.Lock()


@dataclass
class Blank:
    """A keeper made ahead: its namespaces and cgroup ready, no view yet."""

    pid: int
    start: float | None
    socket_path: str
    group: cgroups.Group | None
    note: Path
    """Its file in the state directory (who made it): the reaper ends the blanks of a
    worker process that died."""
    slot: id_slots.Slot | None = None
    """Its host ids (the keeper holds their slot's lock; `fd` here is -1)."""
    layers: Path | None = None
    """Its layers, made ahead and mounted in its namespace (moved into the workspace's
    state when claimed)."""
    prebuilt: bool = False
    """Its `/` (the host's, in layers) is built: a claim binds the workspace's own paths."""
    net: network.State = dataclasses.field(default_factory=network.State)
    """Its network, made ahead (an `egress` blank's link and rules)."""
    ws_id: str | None = None
    """The id its workspace takes unless its maker chose one: its cgroup is named for it
    (`ws-<id>`), so a claim renames none."""
    ended: bool = False

    def end(self) -> list[threading.Thread]:
        """Kill it and remove what it held (a blank never claimed, or a failed claim):
        its cgroup and layers on a thread that waits for the keeper to be gone
        (returned: a process that exits joins it), its note last (`_remove_held`)."""
        if self.ended:
            return []
        self.ended = True
        with contextlib.suppress(ProcessLookupError):
            # pid 0: its maker died before its keeper started (kill(0) is our own group).
            if self.pid > 0 and (self.start is None
                                 or procs.is_same_process(self.pid, self.start)):
                os.kill(self.pid, 9)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        if self.layers is None and self.group is None:
            self.note.unlink(missing_ok=True)
            return []
        with _removing_lock:
            _removing.add(str(self.note))
        ender = threading.Thread(target=self._remove_held, daemon=True,
                                 name="bashfleet-blank-end")
        ender.start()
        return [ender]

    def _remove_held(self) -> None:
        """Its cgroup and layers, removed once its keeper is gone; its note last, and only
        once both went: a process killed meanwhile (or a removal that gave up) leaves the
        reaper a note of what is left (`reap_blanks`)."""
        try:
            removed = self.group is None or self.group.remove(timeout=10.0)
            if self.layers is not None:
                removed = _remove_when_free(self.layers) and removed
            if removed:
                self.note.unlink(missing_ok=True)
        finally:
            with _removing_lock:
                _removing.discard(str(self.note))


    def hold(self, group: cgroups.Group) -> None:
        """Its cgroup under another name (a claim's): its note says so, for the reaper."""
        self.group = group
        _write_note(self.note, self.pid, self.start, group, self.layers)

    def forget(self) -> None:
        """It is a workspace now (its record saved): its note goes."""
        self.ended = True
        with contextlib.suppress(FileNotFoundError):
            self.note.unlink()


def _remove_when_free(path: Path) -> bool:
    """Remove a blank's layers once its namespace (where they were mounted) is gone;
    False when they were still there after 10 s."""
    deadline = time.monotonic() + 10.0
    while True:
        disk.remove_tree(path)
        if not path.exists():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)  # the dead keeper's mounts are let go of a moment later


class Blanks:
    """Blank keepers made ahead, per network kind (`blank_kind`), in this process (a few:
    `workspace_pool`; more for a burst on its way: `ahead`). They are made side by side
    (the zygote makes several keepers at once), and a take waits for one already being
    made rather than making another."""

    def __init__(self) -> None:
        self.ready: dict[tuple[Path, str, bool], list[Blank]] = {}
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        """Notified when a blank being made is ready or failed."""
        self.making: dict[tuple[Path, str, bool], int] = {}
        """Blanks being made ahead, per key."""
        self.waiting: dict[tuple[Path, str, bool], int] = {}
        """Takes waiting for one of those, per key."""
        self.threads: list[threading.Thread] = []

    def take(self, settings: Settings, kind: str, *, prebuilt: bool = True) -> Blank:
        """A blank keeper (made now when none is ready or on its way); more are made in
        the background. `prebuilt`: with the host's root in layers built ahead (an image's
        workspace wants its own `/`)."""
        key = (settings.state_dir, kind, prebuilt)
        blank = self._ready_or_coming(key)
        self.ahead(settings, kind, prebuilt=prebuilt, count=settings.workspace_pool)
        if blank is not None and (blank.start is None or procs.is_same_process(blank.pid,
                                                                              blank.start)):
            return blank
        if blank is not None:
            blank.end()
        return make_blank(settings, kind, prebuilt=prebuilt)

    def _ready_or_coming(self, key: tuple[Path, str, bool]) -> Blank | None:
        """A ready blank of `key`, waiting for one being made when there are more on
        their way than takes already waiting for them; None when none will come."""
        deadline = time.monotonic() + launcher.KEEPER_SETUP_S
        with self.changed:
            while True:
                ready = self.ready.get(key, [])
                if ready:
                    return ready.pop()
                left = deadline - time.monotonic()
                if self.making.get(key, 0) <= self.waiting.get(key, 0) or left <= 0:
                    return None
                self.waiting[key] = self.waiting.get(key, 0) + 1
                try:
                    self.changed.wait(left)
                finally:
                    self.waiting[key] -= 1

    def ahead(self, settings: Settings, kind: str, *, prebuilt: bool, count: int) -> None:
        """Have `count` blanks of a kind ready or on their way: the missing ones are made
        now, side by side, in the background (a fork of `count` starts them while its
        snapshot is taken; each take tops the pool up to `workspace_pool`)."""
        key = (settings.state_dir, kind, prebuilt)
        with self.lock:
            missing = count - len(self.ready.get(key, [])) - self.making.get(key, 0)
            if missing <= 0:
                return
            self.making[key] = self.making.get(key, 0) + missing
            threads = [threading.Thread(target=self._make_one, args=(settings, kind, prebuilt),
                                        daemon=True, name="bashfleet-blanks")
                       for _ in range(missing)]
            self.threads = [t for t in self.threads if t.is_alive()] + threads
            # Started before the lock goes: `close` joins what it lists, and joining a
            # thread not yet started raises (a worker ending while a take tops up).
            for thread in threads:
                thread.start()

    def _make_one(self, settings: Settings, kind: str, prebuilt: bool) -> None:
        key = (settings.state_dir, kind, prebuilt)
        blank = None
        try:
            blank = make_blank(settings, kind, prebuilt=prebuilt)
        except OSError as exc:
            log.warning("could not make a keeper ahead: %s", exc)
        finally:
            with self.changed:
                self.making[key] -= 1
                if blank is not None:
                    self.ready.setdefault(key, []).append(blank)
                self.changed.notify_all()

    def close(self) -> None:
        """End the blanks this process made (at its exit), those being made too."""
        with self.lock:
            threads = list(self.threads)
        for thread in threads:
            thread.join(timeout=launcher.KEEPER_SETUP_S)
        with self.lock:
            ready = [blank for blanks_ in self.ready.values() for blank in blanks_]
            self.ready.clear()
        enders = [thread for blank in ready for thread in blank.end()]
        for thread in enders:
            thread.join(timeout=10.0)


blanks = Blanks()
sandbox.on_close(blanks.close)


def make_blank(settings: Settings, net: str, *, prebuilt: bool = False) -> Blank:
    """A blank keeper: forked by the zygote into new namespaces, in a cgroup of its own;
    on a host that gives workspaces ids of their own, with a slot of them, its user
    namespace made, and (`prebuilt`) the host's root in layers of its own mounted."""
    disk.ensure_dir(settings.workspaces_dir, 0o700)
    name = f"blank-{uuid.uuid4().hex[:15]}"
    # Its cgroup is named for the workspace it will be: a cgroup v1 rename waits for the
    # cgroup lock behind every keeper being moved into a group meanwhile (an RCU grace
    # period each), 11 ms of a claim while the pool is topped up beside it.
    ws_id = store.new_id()
    sock_path = str(settings.workspaces_dir / f"{name}.sock")
    note = settings.workspaces_dir / f"{name}.blank"
    slot = _claim_ids(settings)
    layers = settings.workspaces_dir / f"{name}.layer" if slot is not None and prebuilt \
        else None
    # `network` True: the host's namespace; else a namespace of its own.
    spec: dict[str, object] = {"network": net == "host", "worker_uid": os.geteuid(),
                               "maker": os.getpid()}
    group = None
    try:
        # Said before anything is made: a maker that dies from here on leaves the reaper
        # a note of what to remove (its cgroup and layers would stay behind for good).
        _write_note(note, 0, None, resources.blank_group_paths(settings, f"ws-{ws_id}"),
                    layers)
        if slot is not None:
            spec["ids"] = {"uid": slot.uid, "gid": slot.gid, "count": id_slots.SLOT_SIZE}
            spec["slot"] = True
        if layers is not None and slot is not None:
            disk.make_layers(layers, slot, None)
            spec["prebuild"] = layout.prebuild_steps(str(layers), visibility.host_entries())
        with contextlib.suppress(OSError):
            group = resources.blank_group(settings, f"ws-{ws_id}")
        listener = launcher.listen(sock_path)
    except BaseException:
        if slot is not None:
            slot.close()
        _undo(group, layers, note)
        raise
    fds = group.procs_fds() if group is not None else []
    try:
        # `maker`: a blank keeper ends with the worker process that made it ahead (none
        # else would claim it); a claimed one lives on (a workspace outlives its worker).
        pid = sandbox.zygote.keeper(settings, spec, [listener.fileno(), *fds,
                                                     *([slot.fd] if slot else [])])
    except OSError:
        _undo(group, layers, note, sock_path)
        raise
    finally:
        listener.close()
        for fd in fds:
            os.close(fd)
        if slot is not None:
            slot.close()  # the keeper holds the lock now, for its life
    blank = Blank(pid, procs.start_time(pid), sock_path, group, note,
                  slot=dataclasses.replace(slot, fd=-1) if slot is not None else None,
                  layers=layers, prebuilt=layers is not None, ws_id=ws_id)
    if net == "egress":
        _blank_network(blank, settings)
    _write_note(note, pid, blank.start, group, layers)
    return blank


def _undo(group: cgroups.Group | None, layers: Path | None, note: Path,
          sock_path: str | None = None) -> None:
    """Remove what a blank that could not be made had taken."""
    if group is not None:
        group.remove(timeout=0)
    if sock_path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(sock_path)
    if layers is not None:
        disk.remove_tree(layers)
    note.unlink(missing_ok=True)


def _claimed(settings: Settings, info: dict[str, object]) -> bool:
    """True when a workspace's record (or its deletion's) names this blank's keeper and
    cgroup: the blank was claimed and its record saved. Another keeper named there (a
    restore whose maker died before it saved the new one) does not make it that
    workspace's."""
    paths = info.get("cgroup")
    for path in paths if isinstance(paths, list) else []:
        name = os.path.basename(str(path))
        if not (name.startswith("ws-") and store.valid_id(name[3:])):
            continue
        for saved in (store.record_path(settings, name[3:]),
                      store.ending_path(settings, name[3:])):
            with contextlib.suppress(OSError, ValueError):
                if json.loads(saved.read_text("utf-8")).get("keeper_pid") == info.get("pid"):
                    return True
    return False


def _write_note(note: Path, pid: int, start: float | None,
                group: cgroups.Group | list[str] | None, layers: Path | None) -> None:
    """A blank's note: its keeper (pid 0: not started yet), its maker, and what it
    holds (or will: `group` as paths), for the reaper to end once its maker is gone
    (`reap_blanks`)."""
    paths = group if isinstance(group, list) else \
        [p for p, _ in group.paths] if group is not None else []
    note.write_text(json.dumps({"pid": pid, "start": start, "maker": os.getpid(),
                                "maker_start": procs.start_time(os.getpid()),
                                "cgroup": paths,
                                "layers": str(layers) if layers else None}),
                    encoding="utf-8")


def _blank_network(blank: Blank, settings: Settings) -> None:
    """An `egress` blank's link and rules, made ahead (off the workspace's path)."""
    try:
        blank.net = network.apply(blank.pid, None, network.State(), sandbox.EGRESS, settings)
    except BaseException:
        blank.end()
        raise


def _claim_ids(settings: Settings) -> id_slots.Slot | None:
    """Host ids of the workspace's own (None: a single-tenant host)."""
    host = sandbox.host_ids(settings)
    if host is None:
        return None
    return id_slots.claim(host, first=int.from_bytes(os.urandom(2), "big"),
                     lock_dir=settings.id_lock_dir, legacy=settings.id_range is None)


def reap_blanks(settings: Settings, *, wait: bool = False) -> int:
    """End the blank keepers of worker processes that died; how many. `wait`: return
    once their layers and cgroups are removed (or their removal gave up), as a
    short-lived caller must (`bashfleet down`): its threads would end with it, and the
    cgroups stay behind (their notes, kept, are the next reaper's)."""
    ended = 0
    enders: list[threading.Thread] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(settings.workspaces_dir):
            if not entry.name.endswith(".blank"):
                continue
            with _removing_lock:
                if entry.path in _removing:
                    continue
            with contextlib.suppress(OSError, ValueError, KeyError):
                info = json.loads(Path(entry.path).read_text("utf-8"))
                maker_start = info.get("maker_start")
                if maker_start is not None and procs.is_same_process(info["maker"], maker_start):
                    continue
                if _claimed(settings, info):
                    # Its maker died between saving the workspace's record and removing
                    # this note: the keeper and cgroup are that workspace's now.
                    Path(entry.path).unlink(missing_ok=True)
                    continue
                group = cgroups.Group("v2", [(p, ()) for p in info.get("cgroup", [])])
                layers = info.get("layers")
                enders += Blank(info["pid"], info.get("start"), entry.path[:-6] + ".sock",
                                group, Path(entry.path),
                                layers=Path(layers) if layers else None).end()
                ended += 1
    for thread in enders if wait else ():
        thread.join()  # each gives up by itself (`Group.remove`, `_remove_when_free`)
    return ended
