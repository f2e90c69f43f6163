"""The wire contract: what a client and a worker both import.

`models` (calls, results, jobs, hosts), `control` (one request and one response model
per control call), `names` (every Redis key, channel, queue and task name, TTLs, the
state enums, id validation), `auth` (signed envelopes), `errors` (one error base),
`lua` (every Lua script's text, with its KEYS, ARGV and reply).
Nothing here imports celery, kombu, redis or psutil: a client loads only this.
"""
