"""Job events as a listener hears them: parsing, filtering, and the rules that make a
listener hear each event once, in order, whatever Redis does.

Workers add each job event (a job started, a job ended: `bashfleet.worker.wire.events.JobEvent`)
to the stream `bashfleet:events` and publish it on the channel of the same name, with
its stream id (`bashfleet.worker.fleet.registry.save_job`). A listener
(`bashfleet.client._async.events`) subscribes to the channel, then reads the stream after the last
id it saw (what it missed before it started, or while it reconnected), then takes what the channel
brings. What it delivers is decided here (`EventCursor.admit`):

1. stream order: an event at or before the last one delivered is not delivered again
   (the channel and the catch-up read overlap);
2. one `started` and one `ended` per job, a `started` never after its job's `ended`:
   a worker that finds Redis emptied (a restart without its data, or another fleet's
   Redis) publishes its jobs' records again, and their events with them, under new
   stream ids;
3. after Redis came back as another instance (its run id changed: a restart, or a
   fleet replaced by another), an event of a job this listener never heard of, stamped
   before the listener lost the old instance (less CLOCK_SKEW_S), is such a
   re-publication of the past: skipped. An end that happened during the outage is
   still news, and so is anything of a job the listener follows.

Before any of that, an event is opened with the keys of the fleet it came from
(`bashfleet.worker.wire.events.open_event`): a worker seals every event it publishes, and one
that does not verify (a Redis writer's "job ended, exit 0") is dropped with a warning,
never delivered. A listener that follows a local fleet brought down and up again gets
the new fleet's keys with its address (`EventCursor.connected`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from bashfleet.client._core.constants import CLOCK_SKEW_S, EVENT_MEMORY
from bashfleet.worker.wire import names
from bashfleet.worker.wire.events import JobEvent, open_event
from bashfleet.worker.wire.models import JobView


def seq_key(seq: str) -> tuple[int, int]:
    """A stream id as a sortable pair (`1700000000000-3` -> (1700000000000, 3))."""
    millis, _, count = seq.partition("-")
    return int(millis or 0), int(count or 0)


def parse_entry(
    entry_id: str, fields: Mapping[str, str], keys: Mapping[str, str]
) -> JobEvent | None:
    """A stream entry as an event, its seal checked with `keys` (None: not one of ours,
    of a newer format, or not verified: dropped with a warning)."""
    return open_event(keys, fields.get("e", ""), entry_id)


def parse_published(data: str | bytes, keys: Mapping[str, str]) -> JobEvent | None:
    """A message of the events channel as an event (None when malformed or forged)."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    parsed = names.parse_event_message(text)
    return parse_entry(parsed[0], {"e": parsed[1]}, keys) if parsed else None


def job_matches(
    view: JobView, *, tags: Mapping[str, str] | None = None, owner: str | None = None
) -> bool:
    """True when a listed job carries every tag of `tags` and, when `owner` is given,
    belongs to it (a job without an owner field matches no owner)."""
    if owner is not None and getattr(view, "owner", None) != owner:
        return False
    return all(view.tags.get(name) == value for name, value in (tags or {}).items())


class EventCursor:
    """What one listener delivered: where to catch up from, and what not to deliver again
    (the module's rules 1-3)."""

    def __init__(self, since: str, started_at: float, *, keys: Mapping[str, str],
                 memory: int = EVENT_MEMORY) -> None:
        """`since`: the stream id to deliver after; `started_at`: when the listener began
        (the clock of its host); `keys`: what verifies the events (the client's record
        keys: `Identity.record_keys`)."""
        self.last = since
        self.keys: Mapping[str, str] = keys
        self._memory = memory
        self._heard: OrderedDict[str, str] = OrderedDict()  # job id -> last kind delivered
        self._instance: str | None = None
        self._contact = started_at  # when the current instance last answered
        self._forgotten_before: float | None = None  # rule 3, once an instance changed

    # ------------------------------------------------------------------ connection

    def connected(self, instance: str, now: float, keys: Mapping[str, str]) -> bool:
        """Note the Redis instance (its run id) a listener (re)connected to, and the keys
        of the fleet it serves (another local fleet has other keys); True when it is
        another instance than before (rule 3 applies from then on)."""
        self.keys = keys
        changed = self._instance is not None and instance != self._instance
        if changed:
            self._forgotten_before = self._contact - CLOCK_SKEW_S
        self._instance = instance
        self._contact = now
        return changed

    def heard_from_redis(self, now: float) -> None:
        """Redis answered (a read, a message, an idle tick)."""
        self._contact = now

    # ------------------------------------------------------------------- admission

    def admit(self, event: JobEvent) -> bool:
        """True (and remembered) for an event to deliver; False for one to skip."""
        if seq_key(event.seq) <= seq_key(self.last):
            return False
        self.last = event.seq
        before = self._heard.get(event.job_id)
        if before == "ended" or (before == "started" and event.kind == "started"):
            return False
        if before is None and self._replayed(event):
            return False
        self._remember(event)
        return True

    def _replayed(self, event: JobEvent) -> bool:
        return self._forgotten_before is not None and event.at < self._forgotten_before

    def _remember(self, event: JobEvent) -> None:
        self._heard[event.job_id] = event.kind
        self._heard.move_to_end(event.job_id)
        while len(self._heard) > self._memory:
            self._heard.popitem(last=False)

    def take_entries(self, entries: Iterable[Any]) -> list[JobEvent]:
        """The events to deliver among a batch of stream entries (`(id, fields)` pairs;
        one that is not ours moves the cursor past it)."""
        found = []
        for entry_id, fields in entries:
            event = parse_entry(entry_id, fields, self.keys)
            if event is None:
                if seq_key(entry_id) > seq_key(self.last):
                    self.last = entry_id
            elif self.admit(event):
                found.append(event)
        return found

    def take_message(self, message: Mapping[str, Any]) -> JobEvent | None:
        """The event a channel message brings, if it is one to deliver."""
        if message["type"] != "message":
            return None
        event = parse_published(message["data"], self.keys)
        return event if event is not None and self.admit(event) else None

    def catch_up_start(self) -> str:
        """The XRANGE start of a catch-up read: just after the last event delivered."""
        return f"({self.last}"
