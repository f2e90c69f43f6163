"""Background jobs and interactive sessions: start a job in a workspace, check and kill it
from any process given its record (`jobs`); the records and statuses on this host's disk
(`job_records`); a call that keeps its stdin open, through a pipe or a PTY
(`interactive`). Their supervisors run inside the namespaces:
`bashfleet.worker.engine.isolate` (`job_supervisor`, `relay`, `job_end`).
"""
