"""What the engine tells whoever runs a foreground call, and what it asks them: one
interface, `CallWatcher`, passed to `run_call(watcher=)`.

    run_call ◄── watcher.starting()            once, just before bash starts: may it?
             ──► watcher.spawned(Spawned)      once, as soon as bash exists
             ──► watcher.running()             once, if it still runs FOLLOW_INTERVAL_S later
             ◄── watcher.cancelled()           at each wake-up (every 50 ms): kill it?
             ◄── watcher.detach_requested()    at each later wake-up: leave it as a job?
             ──► watcher.put_away(step)        once it ended (no job started): its workspace's turn
             ──► CallResult                    the return value, whatever happened

The fleet implements it to record the call on the host's disk and in Redis while it
runs (`bashfleet.worker.fleet.exec_watch`); an in-process caller passes nothing
(`UNWATCHED`), or subclasses `Unwatched` to override one method. A background call and
an interactive session are only asked `cancelled()`: their process is a job, recorded
by the job's own code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class Spawned:
    """A foreground call's process, the moment it exists."""

    pid: int
    """Process id of the call's bash."""
    pgid: int
    """Its process group (bash leads a group of its own)."""
    marker: str
    """The marker value every process of the call carries."""
    output_dir: Path
    """The folder of the call's spill files, where its output is read while it runs."""


class CallWatcher(Protocol):
    """The events of one call, in order, and the two questions the engine asks while it
    runs. Any method may raise: the call's processes are then killed and the error goes
    on to `run_call`'s caller (nobody would be left to watch them)."""

    def starting(self) -> None:
        """The call's bash is about to start (a foreground call's, once its workspace
        and files are ready): raise to start nothing. The fleet reads its claim of the
        call here, sent before the call was prepared: its round trip overlaps that."""

    def spawned(self, process: Spawned) -> None:
        """The call's bash was started (the engine's timeout clock starts after this)."""

    def running(self) -> None:
        """The call still runs FOLLOW_INTERVAL_S after its spawn (most calls end sooner).
        Never called for a call that was not `spawned`."""

    def cancelled(self) -> bool:
        """True: kill the call now, as a timeout would (its result says `cancelled`)."""
        ...

    def detach_requested(self) -> bool:
        """True: leave the call running as a background job, as an auto-background
        timeout would. Asked only after `running`, and only of a call whose output goes
        to files (one kept in memory has nowhere to go on writing)."""
        ...

    def put_away(self, step: Callable[[], None]) -> None:
        """The call ended without starting a job: `step` puts its workspace away (a named
        one touched, a throwaway one made ready for the next call or removed). Run it
        now, or keep it for after the answer went out (the answer need not wait for it);
        it must run."""


class Unwatched:
    """The watcher of a call nobody watches: hears nothing, never cancels or detaches."""

    def starting(self) -> None:
        """Nothing to wait for."""

    def spawned(self, process: Spawned) -> None:
        """Nothing to record."""

    def running(self) -> None:
        """Nothing to record."""

    def cancelled(self) -> bool:
        return False

    def detach_requested(self) -> bool:
        return False

    def put_away(self, step: Callable[[], None]) -> None:
        """Now: nobody answers after."""
        step()


#: `run_call`'s watcher when it is given none.
UNWATCHED: CallWatcher = Unwatched()
