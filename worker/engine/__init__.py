"""One call on this machine, no Redis: spawn (in its sandbox), capture, sanitize,
truncate, normalize, environment, secrets, session state, limits, processes, and
background jobs with their supervisor. `call.run_call` is the entry point.
"""
