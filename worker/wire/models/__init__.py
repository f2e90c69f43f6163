"""The wire contract: every model that crosses Redis, a process or the CLI's --json.

All models forbid unknown fields so a typo in a caller fails loudly instead of being
ignored, and every field says what it means. Models are JSON-only (never pickle).

One module per concern, each importing only those it stands on:

- `base`: the base `Model`, shared limits and patterns, tags, network policies,
  `Isolation`, `Stdin`
- `policy`: how a dialect shapes a call (truncation, interception, `Policy`)
- `calls`: a call as asked for (`RunRequest`) and as run (`Call`)
- `results`: what a call returns (`CallResult` and its parts)
- `jobs`: background jobs (records, checks, output slices, listings)
- `hosts`: worker hosts and their sandbox
- `images`, `workspaces`, `snapshots`: what their names say

`from bashfleet.worker.wire.models import RunRequest` imports the module that defines
the name and those it stands on, not the others (PEP 562: `__getattr__` below).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bashfleet.worker.wire.models.base import (
        CODE_VARIABLE_PREFIXES,
        CODE_VARIABLES,
        MAX_COMMAND_BYTES,
        MAX_PATH_CHARS,
        MAX_TAG_NAME_CHARS,
        MAX_TAG_VALUE_CHARS,
        MAX_TAGS,
        MAX_TIMEOUT_S,
        OWNER_PATTERN,
        SNAPSHOT_ID_PATTERN,
        WORKSPACE_ID_PATTERN,
        AskedNetwork,
        Isolation,
        KeptNetwork,
        Model,
        Stdin,
        Tags,
        runs_code,
    )
    from bashfleet.worker.wire.models.calls import (
        MAX_SESSION_CHARS,
        MAX_SHELL_CHARS,
        SHELL_PATTERN,
        SLOW_TIMEOUT_S,
        Call,
        CallOptions,
        Mode,
        RunRequest,
        TermSize,
    )
    from bashfleet.worker.wire.models.hosts import (
        HostInfo,
        SandboxProbe,
    )
    from bashfleet.worker.wire.models.images import (
        ImageInfo,
    )
    from bashfleet.worker.wire.models.jobs import (
        CheckResult,
        JobRecord,
        JobStatus,
        JobView,
        OutputChunk,
    )
    from bashfleet.worker.wire.models.policy import (
        DEFAULT_INTERCEPT_RULES,
        ByteTail,
        CharCap,
        HeadTailTokens,
        InterceptRule,
        Middle,
        Policy,
        TailLines,
        Truncation,
    )
    from bashfleet.worker.wire.models.results import (
        CANCELLED_MESSAGE,
        SYSTEM_ERROR_KINDS,
        CallResult,
        InputWait,
        JobHandle,
        ProcessInfo,
        Spill,
        SystemError_,
        SystemErrorKind,
        TruncationInfo,
    )
    from bashfleet.worker.wire.models.snapshots import (
        RestoreResult,
        Snapshot,
        SnapshotRecord,
    )
    from bashfleet.worker.wire.models.workspaces import (
        WorkspaceLimits,
        WorkspaceRecord,
        WorkspaceSpec,
        WorkspaceView,
    )

#: The submodule that defines each public name.
_HOMES: dict[str, str] = {
    "AskedNetwork": "base",
    "CODE_VARIABLES": "base",
    "CODE_VARIABLE_PREFIXES": "base",
    "Isolation": "base",
    "KeptNetwork": "base",
    "MAX_COMMAND_BYTES": "base",
    "MAX_PATH_CHARS": "base",
    "MAX_TAGS": "base",
    "MAX_TAG_NAME_CHARS": "base",
    "MAX_TAG_VALUE_CHARS": "base",
    "MAX_TIMEOUT_S": "base",
    "Model": "base",
    "OWNER_PATTERN": "base",
    "SNAPSHOT_ID_PATTERN": "base",
    "Stdin": "base",
    "Tags": "base",
    "WORKSPACE_ID_PATTERN": "base",
    "runs_code": "base",
    "ByteTail": "policy",
    "CharCap": "policy",
    "DEFAULT_INTERCEPT_RULES": "policy",
    "HeadTailTokens": "policy",
    "InterceptRule": "policy",
    "Middle": "policy",
    "Policy": "policy",
    "TailLines": "policy",
    "Truncation": "policy",
    "Call": "calls",
    "CallOptions": "calls",
    "MAX_SESSION_CHARS": "calls",
    "MAX_SHELL_CHARS": "calls",
    "Mode": "calls",
    "RunRequest": "calls",
    "SHELL_PATTERN": "calls",
    "SLOW_TIMEOUT_S": "calls",
    "TermSize": "calls",
    "CANCELLED_MESSAGE": "results",
    "CallResult": "results",
    "InputWait": "results",
    "JobHandle": "results",
    "ProcessInfo": "results",
    "SYSTEM_ERROR_KINDS": "results",
    "Spill": "results",
    "SystemErrorKind": "results",
    "SystemError_": "results",
    "TruncationInfo": "results",
    "CheckResult": "jobs",
    "JobRecord": "jobs",
    "JobStatus": "jobs",
    "JobView": "jobs",
    "OutputChunk": "jobs",
    "HostInfo": "hosts",
    "SandboxProbe": "hosts",
    "ImageInfo": "images",
    "WorkspaceLimits": "workspaces",
    "WorkspaceRecord": "workspaces",
    "WorkspaceSpec": "workspaces",
    "WorkspaceView": "workspaces",
    "RestoreResult": "snapshots",
    "Snapshot": "snapshots",
    "SnapshotRecord": "snapshots",
}

__all__ = [
    "CANCELLED_MESSAGE",
    "CODE_VARIABLES",
    "CODE_VARIABLE_PREFIXES",
    "DEFAULT_INTERCEPT_RULES",
    "MAX_COMMAND_BYTES",
    "MAX_PATH_CHARS",
    "MAX_SESSION_CHARS",
    "MAX_SHELL_CHARS",
    "MAX_TAGS",
    "MAX_TAG_NAME_CHARS",
    "MAX_TAG_VALUE_CHARS",
    "MAX_TIMEOUT_S",
    "OWNER_PATTERN",
    "SHELL_PATTERN",
    "SLOW_TIMEOUT_S",
    "SNAPSHOT_ID_PATTERN",
    "SYSTEM_ERROR_KINDS",
    "WORKSPACE_ID_PATTERN",
    "AskedNetwork",
    "ByteTail",
    "Call",
    "CallOptions",
    "CallResult",
    "CharCap",
    "CheckResult",
    "HeadTailTokens",
    "HostInfo",
    "ImageInfo",
    "InputWait",
    "InterceptRule",
    "Isolation",
    "JobHandle",
    "JobRecord",
    "JobStatus",
    "JobView",
    "KeptNetwork",
    "Middle",
    "Mode",
    "Model",
    "OutputChunk",
    "Policy",
    "ProcessInfo",
    "RestoreResult",
    "RunRequest",
    "SandboxProbe",
    "Snapshot",
    "SnapshotRecord",
    "Spill",
    "Stdin",
    "SystemErrorKind",
    "SystemError_",
    "Tags",
    "TailLines",
    "TermSize",
    "Truncation",
    "TruncationInfo",
    "WorkspaceLimits",
    "WorkspaceRecord",
    "WorkspaceSpec",
    "WorkspaceView",
    "runs_code",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
