"""`AsyncFleet`: the fleet client for asyncio, natively asynchronous.

    async with AsyncFleet() as fleet:
        results = await asyncio.gather(*(fleet.run(f"make -C pkg{i}") for i in range(400)))

No thread per call: Redis is spoken with `redis.asyncio`, one task hears every answer,
one task watches every call in flight, and backpressure is explicit (`max_in_flight`,
`redis_concurrency`). It is the source `Fleet` is generated from
(`client/_async/fleet.py` names its parts, one module per concern, whose docstrings say
what each method does); one AsyncFleet belongs to one event loop.
"""

from __future__ import annotations

from bashfleet.client._async.fleet import AsyncFleet
from bashfleet.client._async.workspace import AsyncWorkspace

__all__ = ["AsyncFleet", "AsyncWorkspace"]
