"""The control calls of interactive sessions, on the owning host: one function per request.

`write_stdin`, `close_stdin` and `resize` reach the session's supervisor through its
Unix socket (`bashfleet.worker.engine.isolate.relay`), then read the output produced since the last
read by any client of the job's owner (`bashfleet.worker.engine.jobs.interactive.exchange`). Served
by the control consumer, so a write never waits for a command slot.
"""

from __future__ import annotations

import base64
import binascii

from bashfleet.worker.engine.jobs import interactive, jobs
from bashfleet.worker.fleet import recovery
from bashfleet.worker.fleet.control import Runtime, owned_record
from bashfleet.worker.wire.control import (
    CloseStdinRequest,
    Collect,
    ResizeRequest,
    SessionOutput,
    WriteStdinRequest,
)
from bashfleet.worker.wire.models import JobRecord


def _input(request: WriteStdinRequest) -> bytes:
    if request.data_b64 is None:
        return request.data.encode("utf-8", "surrogateescape")
    if request.data:
        raise jobs.JobError("invalid", "give `data` or `data_b64`, not both")
    try:
        return base64.b64decode(request.data_b64, validate=True)
    except binascii.Error as exc:
        raise jobs.JobError("invalid", f"data_b64 is not base64: {exc}") from None


def _ended(rt: Runtime, record: JobRecord, out: SessionOutput) -> SessionOutput:
    """Keep the fleet's record of a session that ended in step."""
    if not out.running:
        recovery.sync_job(rt.redis, record, rt.settings.sealing_keys())
    return out


def write_stdin(rt: Runtime, request: WriteStdinRequest, admin: bool = False) -> SessionOutput:
    """Write to a session's stdin (nothing for a poll); its new output."""
    record = owned_record(rt.settings, request.id, request.owner, admin)
    out = interactive.exchange(rt.settings, record, _input(request), request.collect,
                               close_input=request.close)
    return _ended(rt, record, out)


def close_stdin(rt: Runtime, request: CloseStdinRequest, admin: bool = False) -> SessionOutput:
    """End a session's input (EOF; Ctrl-D on a terminal); its new output."""
    record = owned_record(rt.settings, request.id, request.owner, admin)
    out = interactive.exchange(rt.settings, record, b"", request.collect, close_input=True)
    return _ended(rt, record, out)


def resize(rt: Runtime, request: ResizeRequest, admin: bool = False) -> SessionOutput:
    """Set a session's terminal size."""
    record = owned_record(rt.settings, request.id, request.owner, admin)
    interactive.resize(record, request.rows, request.cols)
    return interactive.exchange(rt.settings, record, b"", Collect(read=False))
