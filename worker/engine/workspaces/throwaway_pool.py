"""Throwaway workspaces: a call without a workspace gets one from a pool,
removed once it and its jobs end. One that its call left unchanged is reused.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from bashfleet.worker.engine import (
    layout,
    sandbox,
)
from bashfleet.worker.engine.workspaces import (
    disk,
    keeper_calls,
    lifecycle,
    making,
    store,
    untouched,
    usage,
)
from bashfleet.worker.engine.workspaces.store import WorkspaceError
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import (
    WorkspaceRecord,
    WorkspaceSpec,
)

log = logging.getLogger("bashfleet.workspaces")


# ----------------------------------------------------------------- throwaway workspaces


#: The stamps of the throwaways' directories found as they must be (`untouched`).
looks = untouched.Looks()


def _left_nothing(record: WorkspaceRecord, settings: Settings) -> bool:
    """No file in its directory, /tmp, /var/tmp, HOME or output directory but the mount
    points its view made (a workspace path under /tmp has its parents made in its /tmp),
    and its upper layer as its view's build left it. Each by the stamps of the last look
    that found it so while they hold (`untouched`), else by a look at all of it."""
    state = os.fspath(store.state_path(settings, record.id))

    def holds_only(path: str, skeleton: Callable[[], Iterable[str]] = tuple) -> bool:
        # The skeleton is worked out only when the stamps do not decide.
        return looks.unchanged(record.id, path,
                               lambda: untouched.only_skeleton(path, skeleton()))

    clean = (holds_only(record.path) and holds_only(f"{state}/tmp", lambda: _skeleton(record))
             and holds_only(f"{state}/vartmp") and holds_only(f"{state}/home")
             and holds_only(record.out_dir))
    if clean and record.ids is not None:
        # A workspace with layers of its own: its upper layers hold just what its view's
        # build put there (a throwaway's next call, maybe another owner's, sees nothing
        # of this one's, in /usr or anywhere).
        upper = f"{state}/layer/upper"
        clean = looks.unchanged(record.id, upper,
                                lambda: _layer_as_built(upper, record, settings))
    if not clean:
        looks.forget(record.id)
    return clean


def _layer_as_built(upper: str, record: WorkspaceRecord, settings: Settings
                    ) -> tuple[bool, untouched.TreeStamps]:
    """Whether the upper layer lists as its view's build left it (its skeleton), and
    the stamps of what was seen. What the view's mounts cover is not looked at (no call
    can reach it: `disk.covered_by_mounts`)."""
    try:
        kept = json.loads(disk.skeleton_path(settings, record.id).read_text("utf-8"))
        covered = frozenset(str(path) for path in kept["covered"])
    except (OSError, ValueError, TypeError, KeyError):
        return False, ()
    listing, stamps = untouched.listing_with_stamps(upper, skip=covered)
    return kept["listing"] == listing, stamps


def _skeleton(record: WorkspaceRecord) -> set[str]:
    """Paths (relative to /tmp) of the mount points the view made in its /tmp."""
    found: set[str] = set()
    for path in (record.path, record.out_dir, *record.mounts):
        if layout.inside(path, "/tmp") and path != "/tmp":
            parts = os.path.relpath(path, "/tmp").split(os.sep)
            found.update(os.sep.join(parts[:n]) for n in range(1, len(parts) + 1))
    return found


#: How long a throwaway workspace may go without a call before the reaper takes it: longer
#: than any call or job may run (a background job's 24 h), so one in use is never reaped.
THROWAWAY_TTL_S = 25 * 3600.0


#: Seconds a call without a workspace waits for one a fill under way is making.
FILL_WAIT_S = 10.0


def _pool_size(settings: Settings) -> int:
    """Throwaway workspaces kept ready: a consumer's slots can all start a call at once."""
    return max(settings.workspace_pool, settings.concurrency)


class Throwaways:
    """Workspaces made ahead for calls without one (a consumer's slots' worth), so such a
    call does not wait the few milliseconds one takes to make; given back after a call
    that left nothing in it (`end`), by one thread of this process."""

    def __init__(self) -> None:
        self.ready: dict[tuple[Path, sandbox.Choice], list[WorkspaceRecord]] = {}
        self.lock = threading.Lock()
        #: Told when a workspace made ahead is ready, or a fill ended.
        self.changed = threading.Condition(self.lock)
        self.filling: set[tuple[Path, sandbox.Choice]] = set()
        self.ended: queue.SimpleQueue[tuple[WorkspaceRecord, Settings] | None] = \
            queue.SimpleQueue()
        self.recycler: threading.Thread | None = None

    def take(self, settings: Settings, spec: WorkspaceSpec) -> WorkspaceRecord:
        """A throwaway workspace for `spec` (its owner set, marked used now)."""
        if spec.path is not None:
            return making.create(spec.model_copy(update={"ttl_s": THROWAWAY_TTL_S}), settings,
                          throwaway=True)
        choice = making.choose(spec, settings)
        key = (settings.state_dir, choice)
        record = self._pop(key) or self._wait_for_fill(key)
        if record is None:
            # None ready: make this one now, and some ahead for the calls that follow
            # (those that end give theirs back: `end`).
            self._refill_later(settings, choice)
            return making.create(spec.model_copy(update={"ttl_s": THROWAWAY_TTL_S}), settings,
                          throwaway=True)
        store.touch(record, settings)
        # Its owner and tags are this call's: held here, not written (no call reads them
        # from its record; the next call that takes it gets its own).
        return record.model_copy(update={"owner": spec.owner, "tags": spec.tags})

    def _pop(self, key: tuple[Path, sandbox.Choice]) -> WorkspaceRecord | None:
        with self.lock:
            ready = self.ready.get(key, [])
            while ready:
                record = ready.pop()
                if usage.keeper_alive(record):
                    return record
        return None

    def _wait_for_fill(self, key: tuple[Path, sandbox.Choice]) -> WorkspaceRecord | None:
        """One a fill under way makes, rather than a workspace of our own made beside it:
        the fill holds an id slot already (a host with one slot left has none for us)."""
        deadline = time.monotonic() + FILL_WAIT_S
        with self.changed:
            while key in self.filling and not self.ready.get(key):
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(left)
        return self._pop(key)

    def _refill_later(self, settings: Settings, choice: sandbox.Choice) -> None:
        key = (settings.state_dir, choice)
        with self.lock:
            if key in self.filling or len(self.ready.get(key, [])) >= _pool_size(settings):
                return
            self.filling.add(key)
        threading.Thread(target=self._refill, args=(settings, choice), daemon=True,
                         name="bashfleet-throwaways").start()

    def _refill(self, settings: Settings, choice: sandbox.Choice) -> None:
        key = (settings.state_dir, choice)
        spec = WorkspaceSpec(isolation=choice.level, network=choice.network,
                             ttl_s=THROWAWAY_TTL_S)
        try:
            while len(self.ready.get(key, [])) < _pool_size(settings):
                record = making.create(spec, settings, throwaway=True)
                with self.changed:
                    self.ready.setdefault(key, []).append(record)
                    self.changed.notify_all()
        except (OSError, WorkspaceError) as exc:
            log.warning("could not make a throwaway workspace ahead: %s", exc)
        finally:
            with self.changed:
                self.filling.discard(key)
                self.changed.notify_all()

    def fill(self, settings: Settings) -> None:
        """Make the host default's throwaways now (a consumer's start)."""
        spec = WorkspaceSpec()
        self._refill_later(settings, making.choose(spec, settings))

    def end(self, record: WorkspaceRecord, settings: Settings, *, jobs_left: bool) -> None:
        """After its call: made ready for another call when nothing of this one is left in
        it, else removed (off the call's path, by the recycling thread); while a job it
        started runs, removed once that ends (its keeper exits then; the reaper removes
        the rest)."""
        # Sandboxed: its keeper killed what the call left and says whether it is clean.
        # Unsandboxed: no namespace holds its processes apart, so none is promised (a
        # call sees and reaches every process and file of the worker's user anyway):
        # an empty directory serves the next call.
        clean = (keeper_calls.take_clean(record.id) if record.keeper_pid is not None
                 else True)
        if jobs_left and record.keeper_pid is not None:
            try:
                conn = keeper_calls.connections.take(record)
                conn.exit_when_idle()
                keeper_calls.connections.give_back(record.id, conn)
                return
            except OSError:
                pass
        if jobs_left:
            return  # an unsandboxed one: reaped with its TTL once its jobs ended
        if clean and record.fresh and _left_nothing(record, settings) \
                and self._give_back(record, settings):
            return  # nothing of the call is left in it
        self.ended.put((record, settings))
        with self.lock:
            if self.recycler is None or not self.recycler.is_alive():
                self.recycler = threading.Thread(target=self._recycle_loop, daemon=True,
                                                 name="bashfleet-recycler")
                self.recycler.start()

    def _recycle_loop(self) -> None:
        while (item := self.ended.get()) is not None:
            try:
                self._recycle_or_delete(*item)
            except Exception:  # the thread lives on for the next ones
                log.exception("could not recycle or delete workspace %s", item[0].id)

    def _recycle_or_delete(self, record: WorkspaceRecord, settings: Settings) -> None:
        """Back to the ready ones when its call left nothing: no process, no file in its
        directory, /tmp, /var/tmp, HOME or output directory (a kept output is another's
        to read only), nothing in /dev/shm, no IPC object. Else deleted."""
        clean = False
        if record.fresh and record.keeper_pid is not None:
            try:
                conn = keeper_calls.connections.take(record)
                clean = conn.recycle()
                keeper_calls.connections.give_back(record.id, conn)
            except OSError:
                clean = False
        if not (clean and _left_nothing(record, settings) and self._give_back(record, settings)):
            lifecycle.delete(record.id, settings)

    def _give_back(self, record: WorkspaceRecord, settings: Settings) -> bool:
        """Back to the ready ones, if the pool has room."""
        key = (settings.state_dir, sandbox.Choice(record.isolation, record.network))
        with self.lock:
            ready = self.ready.setdefault(key, [])
            if len(ready) >= _pool_size(settings):
                return False
            ready.append(record.model_copy(update={"owner": "", "tags": {}}))
        return True

    def close(self) -> None:
        """Delete the ready ones nobody took."""
        with self.lock:
            ready = [(key[0], record) for key, records in self.ready.items()
                     for record in records]
            self.ready.clear()
        for state_dir, record in ready:
            delete_at(state_dir, record)


throwaways = Throwaways()
sandbox.on_close(throwaways.close)


def delete_at(state_dir: Path, record: WorkspaceRecord) -> None:
    """Delete `record`'s workspace kept in `state_dir` (its keeper, files, cgroup)."""
    settings = Settings(state_dir=state_dir, host=record.host,
                        workspace_root=Path(record.out_dir).parent.parent)
    lifecycle.delete(record.id, settings)


def warm(settings: Settings) -> None:
    """Start the zygote and fill the throwaway pool now, so that the first call does not
    wait for them (a command consumer calls this at start)."""
    available, _ = sandbox.availability(settings)
    if sandbox.host_default(settings.isolation, available) == "none":
        return
    with contextlib.suppress(OSError):
        throwaways.fill(settings)
