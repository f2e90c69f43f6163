"""bashfleet's worker side, in three rooms:

- `bashfleet.worker.wire`: the contract both sides import (models, control requests and
  responses, names, signing, errors); no celery, kombu, redis or psutil.
- `bashfleet.worker.engine`: one call on this machine (spawn, capture, sanitize, truncate,
  environment, secrets, limits, processes, background jobs); no Redis.
- `bashfleet.worker.fleet`: the Celery and Redis side (the only importer of celery, kombu and
  redis): connecting, the registry, the tasks, the host supervisor, recovery.

This package re-exports the engine's and the wire's public names, loaded on first use
(PEP 562), so `import bashfleet.worker.wire` does not load the engine, and nothing here ever
imports `bashfleet.worker.fleet`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bashfleet.worker.engine.call import CallError, run_call
    from bashfleet.worker.engine.jobs.jobs import (
        JobError,
        check_job,
        kill_job,
        load_record,
        local_records,
    )
    from bashfleet.worker.settings import Settings, get_settings
    from bashfleet.worker.wire.models import (
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
        RunRequest,
        Spill,
        SystemError_,
        TailLines,
        TruncationInfo,
    )

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
    "RunRequest",
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

#: Where each public name is defined (every other one is in `bashfleet.worker.wire.models`).
_HOMES: dict[str, str] = {
    "CallError": "bashfleet.worker.engine.call",
    "run_call": "bashfleet.worker.engine.call",
    "JobError": "bashfleet.worker.engine.jobs.jobs",
    "check_job": "bashfleet.worker.engine.jobs.jobs",
    "kill_job": "bashfleet.worker.engine.jobs.jobs",
    "load_record": "bashfleet.worker.engine.jobs.jobs",
    "local_records": "bashfleet.worker.engine.jobs.jobs",
    "Settings": "bashfleet.worker.settings",
    "get_settings": "bashfleet.worker.settings",
}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'bashfleet.worker' has no attribute {name!r}")
    module = importlib.import_module(_HOMES.get(name, "bashfleet.worker.wire.models"))
    value = getattr(module, name)
    globals()[name] = value  # the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
