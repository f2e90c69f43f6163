"""Every timing, retry table and limit of the fleet clients, once (both `Fleet` and
`AsyncFleet` read them here; arq's `constants.py` is the model: a module that imports
nothing of the client).

Redis' own timeouts (connect, socket, health check) are the connection's:
`bashfleet.worker.fleet.connect`.
"""

from __future__ import annotations

# ------------------------------------------------------------------------- watching

#: How often the calls waited for are watched (their records, their hosts' locks, their
#: stored answers): one pipelined round trip for every call in flight.
WATCH_INTERVAL_S = 0.5
#: A claim follows a take within milliseconds; a message gone from its queue this long
#: without one was lost with the consumer that took it.
MESSAGE_LOST_GRACE_S = 3.0
#: The same for a call sent to a host whose lock is held: its consumer claims what it
#: took, seconds late when hundreds of its slots start at once on a busy machine; a
#: consumer killed between the take and the claim is still told within the 8 s a lost
#: call is promised in.
MESSAGE_TAKEN_BY_LIVE_HOST_GRACE_S = 6.0
#: A running call's host lock gone this long (not replaced by another instance's) means
#: its worker died. The lock lives ALIVE_TTL_S past the last heartbeat; the grace covers
#: a heartbeat that came late because Redis was away (a failover longer than the lock).
#: Both clients wait it out: saying WorkerLost at the first missed lock would make a
#: heartbeat that came late a false alarm.
LOCK_GONE_GRACE_S = 2.0
#: A host a send found alive (its lock held) is not looked up again by the sends of this
#: long: its heartbeat's period. A call sent meanwhile to a host that stopped waits
#: queued, and the watch withdraws it at its next pass (its host's lock gone), as it
#: does for a host that died after a send: a killed host's lock outlives it ALIVE_TTL_S.
HOST_SEEN_ALIVE_S = 1.0
#: Behind Redis Sentinel, an outage shorter than this (a failover: seconds) does not
#: fail the calls waited for: their answers are stored, and read once a replica took
#: over. A single Redis that goes away is said at once (FleetUnavailable).
FAILOVER_GRACE_S = 30.0
#: Most messages of a queue scanned when looking for the ones still waiting: a longer
#: queue counts as still holding every call sent to it (they wait their turn).
QUEUE_SCAN_LIMIT = 10_000

# ------------------------------------------------------------------------ answering

#: Longest wait for a control call (check, kill, read_output, cancel, jobs...).
CTL_TIMEOUT_S = 30.0
#: Seconds a workspace made from a Dockerfile may take to build on its host.
BUILD_TIMEOUT_S = 900.0
#: Longest a host holds one question about a pull before answering (it is asked again
#: until the pull is done, and each answer brings the pull's new progress lines).
PULL_POLL_S = 2.0
#: How long the first call of a client waits for its reply subscription before sending:
#: an answer published before it would only be read at the next watch.
SUBSCRIBE_WAIT_S = 2.0
#: Longest block of a listener's read (replies and job events): how soon `close` ends
#: it. One tick for both clients (the blocking one's thread notices `close` then; the
#: asyncio one is cancelled at once anyway). 0.25 s: four idle reads a second.
LISTEN_TICK_S = 0.25
#: Backoff between two attempts to listen again while Redis is away (replies and job
#: events alike): the last delay repeats.
RETRY_DELAYS_S = (0.1, 0.2, 0.5, 1.0, 2.0)

# ---------------------------------------------------------------------------- events

#: How often an idle job-event listener looks up (a `wait` re-reads its job then).
IDLE_TICK_S = 1.0
#: The same for a `wait` with a timeout: keeps the timeout within a tenth of a second.
TIMED_WAIT_TICK_S = 0.1
#: Events read per catch-up round trip.
CATCH_UP_BATCH = 500
#: Jobs a listener remembers the events of (so none is heard twice): as many as the
#: stream keeps (EVENTS_MAXLEN).
EVENT_MEMORY = 10_000
#: Hosts' clocks and the client's may disagree by this much: an event stamped up to this
#: much before a listener lost its Redis is still taken as new after a restart (an event
#: that happens after the restart is stamped after it, less its host's clock offset).
#: NTP keeps a fleet's clocks within milliseconds; 5 s leaves room for a host without.
CLOCK_SKEW_S = 5.0

# ----------------------------------------------------------------------------- calls

#: Calls sent and not answered yet, at most (more wait in the client, unsent).
DEFAULT_MAX_IN_FLIGHT = 1024
#: Redis commands under way at once, at most: the connections a client holds (plus one
#: for its reply channel and one per job-event listener).
DEFAULT_REDIS_CONCURRENCY = 16
#: Longest output `run(..., output="full")` reads back by default (stdout and stderr
#: together): past it the call's output stays in its spill files (OutputTooLarge).
FULL_OUTPUT_MAX_BYTES = 64 * 1024 * 1024


def backoff(delays: tuple[float, ...], attempt: int) -> float:
    """The wait before attempt `attempt` + 1 (counted from 0): the last delay repeats."""
    return delays[min(attempt, len(delays) - 1)]
