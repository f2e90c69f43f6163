"""The fleet client, written once: `bashfleet.client.aio.AsyncFleet` is the class of
`client/_async/fleet.py`, and `bashfleet.client.fleet.Fleet` the same class in
`client/_sync/fleet.py`, which `scripts/unasync.py` generates from it (dropping `async`,
`await` and the `Async` prefix of names; checked in, and a test fails when it differs).

    async with AsyncFleet() as fleet:        # BASHFLEET_REDIS_URL, else the local fleet
        result = await fleet.run("make test", host="build-1")
        job = (await fleet.run("./serve.sh", mode="background")).job
        await fleet.check(job.id); await fleet.kill(job.id)

What the client decides is the core's (`bashfleet.client._core`, no I/O): how a request is
validated and signed, where a call goes, what an answer means, when a call waited for
is lost. What this layer does is Redis I/O (`bashfleet.client._async.records`), in the order the
core asks for it:

- a call is one Lua script that records it and pushes its Celery message (the JSON
  kombu would push: `bashfleet.worker.wire.messages`) in one round trip; a control call (check,
  kill, read_output, cancel, jobs, write_stdin...) is one message pushed on the owning
  host's control queue, served apart from the command slots. No Celery in a client.
- answers arrive on the client's reply channel, heard by one listener
  (`bashfleet.client._async.replies`); a call waits on its own slot;
- calls in flight are watched together: every WATCH_INTERVAL_S one pipelined round
  trip reads every waiting call's stored answer and record and the locks of their
  hosts (a worker that dies shows as WorkerLost within seconds; the command is never
  sent again);
- backpressure is explicit: at most `max_in_flight` calls sent and not answered (more
  wait in the client, unsent), at most `redis_concurrency` Redis commands under way;
- every error a worker answers is a typed exception (`bashfleet.client.errors`).

`AsyncFleet` is made of one part per concern, each a class in a module of its own
(each generated for `Fleet` the same way):

- `bashfleet.client._async.calls.Calls`: run, execute, the send, the watch, cancel,
  detach;
- `bashfleet.client._async.workspaces.Workspaces`: make, open and list workspaces;
- `bashfleet.client._async.images.Images`: list, pull and remove images;
- `bashfleet.client._async.snapshots.Snapshots`: list and delete snapshots;
- `bashfleet.client._async.jobs.Jobs`: check, kill, read_output, stdin; list jobs across
  owners; wait and events;
- `bashfleet.client._async.base.FleetBase`, under them all: the client's state and
  `close`, the guarded Redis helper (`_on_redis`) and the control plumbing.

The asyncio client belongs to one event loop; the blocking one serves any number of
threads (its listener and watch are threads: two, whatever the calls in flight).
"""

from __future__ import annotations

from bashfleet.client._async.calls import Calls
from bashfleet.client._async.images import Images
from bashfleet.client._async.jobs import Jobs
from bashfleet.client._async.snapshots import Snapshots
from bashfleet.client._async.workspaces import Workspaces


class AsyncFleet(Calls, Workspaces, Images, Snapshots, Jobs):
    """A client of the fleet. Cheap to keep for the life of a process.

    `redis_url`: the fleet's Redis (default BASHFLEET_REDIS_URL, else the local fleet of
    `bashfleet up`). `owner`: who this client's calls and jobs belong to (default:
    BASHFLEET_OWNER, else `user:<login>`); another owner's jobs are unknown to it.
    `admin`: sign with the admin key when one is configured (BASHFLEET_ADMIN_KEY, or the
    local fleet's), to reach every owner's jobs. `max_in_flight`: calls sent and not
    answered, at most (the others wait their turn in this process, unsent).
    `redis_concurrency`: Redis commands under way at once (the connections it holds).
    """
