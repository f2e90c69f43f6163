"""The fleet client's I/O layer for threads: `Fleet` (`fleet`) and its Redis I/O,
listeners and shells, generated from `bashfleet.client._async` by `scripts/unasync.py` (do not
edit them: edit the asyncio module and run the script). `concurrency` is written by hand.
"""
