"""The Python API of the fleet, blocking: `Fleet` (`bashfleet.client.aio.AsyncFleet` for asyncio).

    fleet = Fleet()                      # BASHFLEET_REDIS_URL, else the local fleet
    result = fleet.run("make test", host="build-1")
    job = fleet.run("./serve.sh", mode="background").job
    fleet.check(job.id); fleet.kill(job.id)

`Fleet` is generated from `AsyncFleet` (`client/_sync/fleet.py` from
`client/_async/fleet.py`, by `scripts/unasync.py`, as are the modules of its parts:
calls, workspaces, images, snapshots, jobs): one client, written once, whose docstrings
say what each method does. Thread-safe; cheap to keep for the life of a
process. Also here: how a client finds the fleet and its keys, and how a `RunRequest`
is built from `run`'s options (what the CLI and the MCP server use).
"""

from __future__ import annotations

from bashfleet.client._core.identity import resolve_admin_key, resolve_signing_key, resolve_url
from bashfleet.client._core.messages import run_request
from bashfleet.client._sync.fleet import Fleet
from bashfleet.client._sync.workspace import Workspace

__all__ = ["Fleet", "Workspace", "resolve_admin_key", "resolve_signing_key", "resolve_url",
           "run_request"]
