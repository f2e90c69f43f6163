"""bashfleet's worker side: the engine that runs one bash call right, and (in the fleet)
the Celery app that runs calls from Redis.

Pure helpers (sanitize, truncate, normalize, environment) import nothing from Celery
or Redis; neither does the engine.
"""

from worker.engine import CallError, run_call
from worker.jobs import JobError, check_job, kill_job, load_record, local_records
from worker.models import (
    ByteTail,
    Call,
    CallResult,
    CharCap,
    CheckResult,
    InterceptRule,
    JobHandle,
    JobRecord,
    JobStatus,
    Middle,
    OutputChunk,
    Policy,
    ProcessInfo,
    Spill,
    SystemError_,
    TailLines,
    TruncationInfo,
)
from worker.settings import Settings, get_settings

__all__ = [
    "ByteTail",
    "Call",
    "CallError",
    "CallResult",
    "CharCap",
    "CheckResult",
    "InterceptRule",
    "JobError",
    "JobHandle",
    "JobRecord",
    "JobStatus",
    "Middle",
    "OutputChunk",
    "Policy",
    "ProcessInfo",
    "Settings",
    "Spill",
    "SystemError_",
    "TailLines",
    "TruncationInfo",
    "check_job",
    "get_settings",
    "kill_job",
    "load_record",
    "local_records",
    "run_call",
]
