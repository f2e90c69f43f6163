"""What the image control calls do on the owning host: list, pull, remove.

The store is `bashfleet.worker.engine.images.images`; this module only puts it behind the control
queue. A pull may take minutes, and the control consumer has a few threads that must answer
`check` and `kill` at once: so a pull runs on a thread of its own (`Pulls`), and each
control call waits for it at most `ImagePullRequest.wait_s` (a few seconds), answering
what it said since the caller's last question. The client asks again with the pull's
id until it is done. That also makes a long pull survive its caller: a client that
goes away leaves it to finish (a later pull of the same reference joins it, or finds
the image held), and a worker restart costs only the pull's restart (the blobs it had
copied stay in the store).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field

from bashfleet.worker.engine import sandbox
from bashfleet.worker.engine.images import images
from bashfleet.worker.engine.images.image_meta import parse_ref
from bashfleet.worker.fleet.control import Runtime
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.control import (
    ImageList,
    ImagePull,
    ImagePullRequest,
    ImageRemoved,
    ImageRemoveRequest,
    ImagesRequest,
)
from bashfleet.worker.wire.errors import ToolError
from bashfleet.worker.wire.models import ImageInfo

log = logging.getLogger("bashfleet.worker")

#: Pulls of different references one host runs at once (more are refused, `limit`).
MAX_RUNNING_PULLS = 4
#: Seconds a finished pull's outcome is kept for its caller's next question.
KEEP_FINISHED_S = 600.0
#: Progress lines a pull keeps (the earlier ones are dropped; counts stay exact).
MAX_LINES = 500


@dataclass
class Pull:
    """One pull under way on this host (or finished a little while ago)."""

    ref: str
    refresh: bool
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    done: threading.Event = field(default_factory=threading.Event)
    lines: list[str] = field(default_factory=list)
    dropped: int = 0
    """Lines said and no longer kept."""
    image: ImageInfo | None = None
    error: ToolError | None = None
    finished_at: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def say(self, line: str) -> None:
        """A progress line (from the pull's thread)."""
        with self.lock:
            self.lines.append(line)
            if len(self.lines) > MAX_LINES:
                self.dropped += len(self.lines) - MAX_LINES
                del self.lines[: len(self.lines) - MAX_LINES]

    def since(self, seen: int) -> tuple[tuple[str, ...], int]:
        """(the lines said after the first `seen`, how many were said in all)."""
        with self.lock:
            total = self.dropped + len(self.lines)
            return tuple(self.lines[max(0, seen - self.dropped):]), total


class Pulls:
    """The pulls of this worker process: one per reference at a time, joined by later
    requests for it, each on a thread of its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[str, Pull] = {}
        self._running: dict[tuple[str, bool], Pull] = {}

    def start(self, ref: str, refresh: bool, settings: Settings) -> Pull:
        """The running pull of `ref`, or a new one (`limit` past MAX_RUNNING_PULLS)."""
        key = (parse_ref(ref).canonical, refresh)  # a bad reference fails here, at once
        with self._lock:
            self._forget_old()
            if key in self._running:
                return self._running[key]
            if len(self._running) >= MAX_RUNNING_PULLS:
                raise ToolError("limit", f"{len(self._running)} pulls run on {settings.host} "
                                f"already (at most {MAX_RUNNING_PULLS}); retry when one ends")
            pull = Pull(ref, refresh)
            self._running[key] = self._by_id[pull.id] = pull
        threading.Thread(target=self._run, args=(pull, key, settings), daemon=True,
                         name=f"pull-{pull.id[:8]}").start()
        return pull

    def get(self, pull_id: str, host: str) -> Pull:
        """A pull asked before; `not_found` when this process knows none by that id."""
        with self._lock:
            found = self._by_id.get(pull_id)
        if found is None:
            raise ToolError("not_found", f"no pull {pull_id} on {host} (it ended more than "
                            f"{KEEP_FINISHED_S:.0f}s ago, or the worker restarted): pull again")
        return found

    def _run(self, pull: Pull, key: tuple[str, bool], settings: Settings) -> None:
        try:
            pull.image, _ = images.ensure(pull.ref, settings, pull.say, refresh=pull.refresh)
        except ToolError as exc:
            pull.error = exc
        except Exception as exc:  # a bug must still end the pull, said to its caller
            log.exception("pull of %s failed inside the worker", pull.ref)
            pull.error = ToolError("internal", f"worker error pulling {pull.ref}: {exc!r}")
        finally:
            with self._lock:
                pull.finished_at = time.monotonic()
                self._running.pop(key, None)
            pull.done.set()

    def _forget_old(self) -> None:
        now = time.monotonic()
        for pull_id, pull in list(self._by_id.items()):
            if pull.finished_at is not None and now - pull.finished_at > KEEP_FINISHED_S:
                del self._by_id[pull_id]


#: This worker process's pulls.
PULLS = Pulls()


def takes_images(settings: Settings) -> None:
    """ToolError `unavailable` at once when this host cannot run an image's workspace:
    a single-tenant host (no host ids of its own for each workspace), said as such
    before anything is pulled, with what to do about it."""
    if sandbox.host_ids(settings) is not None:
        return
    raise ToolError("unavailable", (
        f"host {settings.host} is single-tenant (`bashfleet hosts` says so) and cannot take "
        "images: an image's files need host ids of each workspace's own. Run its worker "
        "as root with subordinate ids for its run user (/etc/subuid and /etc/subgid), or "
        "send the workspace to another host (--host; `bashfleet hosts` lists them)"))


def pull(rt: Runtime, request: ImagePullRequest, admin: bool = False) -> ImagePull:
    """Start (or join) a pull, or ask after one; wait for it at most `wait_s`; what it
    said since `seen`, and its image once done (its error, raised, if it failed)."""
    host = rt.settings.host
    if request.pull_id is not None:
        found = PULLS.get(request.pull_id, host)
    else:
        takes_images(rt.settings)
        found = PULLS.start(request.ref, request.refresh, rt.settings)
    found.done.wait(request.wait_s)
    lines, seen = found.since(request.seen)
    if found.done.is_set() and found.error is not None:
        raise found.error
    return ImagePull(pull_id=found.id, host=host, ref=found.ref, done=found.done.is_set(),
                     image=found.image, lines=lines, seen=seen)


def list_images(rt: Runtime, request: ImagesRequest, admin: bool = False) -> ImageList:
    """The images this host holds (shared by every owner, as the host's root is)."""
    return ImageList(host=rt.settings.host, images=tuple(images.held(rt.settings)))


def remove(rt: Runtime, request: ImageRemoveRequest, admin: bool = False) -> ImageRemoved:
    """Remove an image no workspace uses (an admin's call: every owner shares them)."""
    if not admin:
        raise ToolError("unauthorized", "removing an image needs the admin key or the "
                        "fleet key: the images of a host are shared by all its owners "
                        "(`bashfleet gc` collects unused ones)")
    removed = images.remove(request.ref, rt.settings, images.in_use(rt.settings))
    if removed:
        log.info("image %s removed", request.ref, extra={"action": "image_remove"})
    return ImageRemoved(host=rt.settings.host, ref=request.ref, removed=removed)
