"""bashfleet's worker side: the engine that runs one bash call right, and (in the fleet)
the Celery app that runs calls from Redis.

Pure helpers (sanitize, truncate, normalize, environment) import nothing from Celery
or Redis; neither does the engine.
"""

from worker.engine import CallError, run_call
from worker.jobs import JobError, check_job, kill_job, load_record, local_records
from worker.models import (
    DEFAULT_INTERCEPT_RULES,
    ByteTail,
    Call,
    CallResult,
    CharCap,
    CheckResult,
    HostInfo,
    InterceptRule,
    JobHandle,
    JobRecord,
    JobStatus,
    JobView,
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
    "DEFAULT_INTERCEPT_RULES",
    "ByteTail",
    "Call",
    "CallError",
    "CallResult",
    "CharCap",
    "CheckResult",
    "HostInfo",
    "InterceptRule",
    "JobError",
    "JobHandle",
    "JobRecord",
    "JobStatus",
    "JobView",
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
