"""The declared public API: each package's `__all__` is exactly what it exports."""

from __future__ import annotations

import importlib

import pytest

EXPECTED = {
    "bashfleet.worker": {
        "DEFAULT_INTERCEPT_RULES", "ByteTail", "Call", "CallError", "CallResult", "CharCap",
        "CheckResult", "HostInfo", "InterceptRule", "JobError", "JobHandle", "JobRecord",
        "JobStatus", "JobView", "Middle", "OutputChunk", "Policy", "ProcessInfo", "RunRequest",
        "Settings", "Spill", "SystemError_", "TailLines", "TruncationInfo", "check_job",
        "get_settings", "kill_job", "load_record", "local_records", "run_call",
    },
    "bashfleet.client": {
        "AsyncFleet", "AsyncWorkspace", "BashfleetError", "CallNotRun", "CallRejected",
        "Fleet", "FleetUnavailable", "HostUnavailable", "ImageError", "LimitReached",
        "OutputTooLarge", "RestoreResult", "Snapshot", "SnapshotMoveError", "UnknownSnapshot",
        "SessionPinned", "Unauthorized", "UnknownCall", "UnknownJob", "UnknownWorkspace",
        "WaitTimeout", "WorkerError", "WorkerLost", "Workspace", "WorkspaceFileError",
    },
}


@pytest.mark.parametrize("package", sorted(EXPECTED))
def test_all_is_the_declared_api(package: str) -> None:
    module = importlib.import_module(package)
    assert set(module.__all__) == EXPECTED[package]
    for name in module.__all__:
        assert getattr(module, name) is not None


def test_pure_modules_import_no_celery_or_redis() -> None:
    # By design, pure functions import nothing from Celery or Redis.
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    code = (
        "import sys; import bashfleet.worker.engine.output.sanitize, "
        "bashfleet.worker.engine.output.truncate, bashfleet.worker.engine.output.normalize, "
        "bashfleet.worker.engine.environment, "
        "bashfleet.worker.engine.session_state, bashfleet.worker.engine.call; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('celery', 'kombu', 'redis')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
