"""The fleet client's I/O layer, written once, for asyncio: `AsyncFleet` (`fleet`), its
Redis I/O (`records`), reply listener (`replies`), job-event listener (`events`) and
sessions' shells (`shells`), over the core (`bashfleet.client._core`).

`scripts/unasync.py` generates the blocking twin of every module here but
`concurrency` (written by hand in both folders) into `bashfleet.client._sync`.
"""
