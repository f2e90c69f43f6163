"""The Celery and Redis side of a worker, and the only package that imports celery,
kombu or redis: `connect` (the one place that builds a Redis client and the Celery
app), `registry` (Redis I/O, the worker's Lua scripts included: their text is in
`bashfleet.worker.wire.lua`), `tasks` (exec and control tasks), `control` (what the
control tasks do), `supervisor` (the host's), `consumer` (a consumer process),
`recovery` (after faults).
"""
