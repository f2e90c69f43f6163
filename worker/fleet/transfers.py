"""File transfers on the owning host: chunks between a transfer's Redis list and the
pipe of a tool in the workspace (`worker.engine.files.stream_tool`).

    client ──chunks (RPUSH)──► bashfleet:transfer:<id> ──BLPOP──► worker ──pipe──► cat/tar
    client ◄──BLPOP── bashfleet:transfer:<id> ◄──chunks (RPUSH)── worker ◄──pipe── cat/tar

Neither side waits for an answer per chunk: the writer pushes while fewer than
`names.TRANSFER_WINDOW` chunks wait on the list (RPUSH says how many do), and waits for
the reader only past that, so Redis holds a few MiB of a transfer whatever its size.
Each chunk is framed and MAC'd with the key that signed the request
(`worker.wire.transfer`). A download's bytes go from the tool's stdout straight onto the
list: they never rest in a file a command of the workspace could replace.

The request is served on a control thread for as long as the data flows (a 1 GB file:
seconds); a side that stops for IDLE_S ends it with an error.
"""

from __future__ import annotations

import contextlib
import os
import time
from functools import lru_cache

import redis

from worker.engine import files
from worker.engine import workspaces as engine
from worker.fleet.connect import redis_client
from worker.fleet.control import Runtime
from worker.fleet.workspace_calls import owned
from worker.settings import Settings
from worker.wire import names
from worker.wire.auth import AuthError
from worker.wire.control import TransferRequest, TransferResult
from worker.wire.errors import ToolError
from worker.wire.transfer import (
    CHUNK_BYTES,
    HEADER_BYTES,
    Reader,
    TransferBrokenError,
    Writer,
)

#: Seconds a transfer waits for the other side (a chunk, or room on the list).
IDLE_S = 30.0


@lru_cache(maxsize=4)
def _client_for(url: str) -> redis.Redis:
    return redis_client(url, binary=True)


def _client(settings: Settings) -> redis.Redis:
    """This process's Redis client for chunks (bytes, not text)."""
    return _client_for(settings.redis_url_value() or "")


def transfer(rt: Runtime, request: TransferRequest, admin: bool, key: str | None
             ) -> TransferResult:
    """Take an upload in, or give a download out; `key`: the one that signed the request
    (the chunks' MAC key)."""
    client, stream = _client(rt.settings), names.transfer_key(request.transfer)
    try:
        record = owned(rt, request.workspace, request.owner, admin)
        engine.touch(record, rt.settings)
        tool = files.stream_tool(record, rt.settings, request.direction, request.kind,
                                 request.path, mode=request.mode)
    except ToolError as exc:
        if request.direction == "download":
            _give_up(client, stream, Writer(key, request.transfer), exc)
        else:
            client.delete(stream)
        raise
    path = files.in_view(record, request.path)
    if request.direction == "upload":
        return TransferResult(path=path, size=_take(client, stream, Reader(key, request.transfer),
                                                    tool))
    return TransferResult(path=path, size=_give(client, stream, Writer(key, request.transfer),
                                                tool))


def _take(client: redis.Redis, stream: str, reader: Reader, tool: files.StreamingTool) -> int:
    """An upload: chunks into the tool's stdin until the end; the bytes taken."""
    broken: Exception | None = None
    try:
        while (data := _next(client, stream, reader)) is not None:
            _write_all(tool.fd, data)
    except BrokenPipeError:
        pass  # the tool ended early: its status says why
    except (AuthError, TransferBrokenError, ToolError) as exc:
        broken = exc
    finally:
        client.delete(stream)
        tool.close_pipe()
    tool.finish()
    if broken is not None:
        raise ToolError("invalid", f"the upload broke off: {broken}")
    return reader.size


def _next(client: redis.Redis, stream: str, reader: Reader) -> memoryview | None:
    popped = client.blpop([stream], timeout=IDLE_S)
    if popped is None:
        raise ToolError("unavailable", f"no data for {IDLE_S:g} s")
    item = popped[1]
    return reader.read(item if isinstance(item, bytes) else item.encode())


def _write_all(fd: int, data: memoryview) -> None:
    view = data
    while view:
        view = view[os.write(fd, view):]


def _give(client: redis.Redis, stream: str, writer: Writer, tool: files.StreamingTool) -> int:
    """A download: the tool's stdout onto the list, then the end; the bytes given."""
    # Each chunk read into one buffer after room for its header, framed there, pushed.
    buffer = bytearray(HEADER_BYTES + CHUNK_BYTES)
    try:
        while size := _fill(tool.fd, memoryview(buffer)[HEADER_BYTES:]):
            _push(client, stream, writer.data_in(buffer, size))
        tool.finish()
    except ToolError as exc:
        tool.close_pipe()
        if tool.outputs:  # not waited for yet (the reader went away)
            with contextlib.suppress(ToolError):
                tool.finish()
        _give_up(client, stream, writer, exc)
        raise
    _push(client, stream, writer.end())
    return writer.size


def _fill(fd: int, view: memoryview) -> int:
    """Read the pipe until `view` is full or the tool closed it; the bytes read."""
    size = 0
    while size < len(view):
        got = os.readv(fd, [view[size:]])
        if not got:
            break
        size += got
    return size


def _push(client: redis.Redis, stream: str, item: bytes | memoryview) -> None:
    """Push a chunk; past the window, wait until the reader took half of it."""
    pipe = client.pipeline(transaction=False)
    pipe.rpush(stream, item)
    pipe.expire(stream, names.TRANSFER_TTL_S)
    waiting = int(pipe.execute()[0])
    if waiting < names.TRANSFER_WINDOW:
        return
    deadline, pause = time.monotonic() + IDLE_S, 0.001
    while int(client.llen(stream)) > names.TRANSFER_WINDOW // 2:
        if time.monotonic() > deadline:
            raise ToolError("unavailable", f"the download's reader took nothing for {IDLE_S:g} s")
        time.sleep(pause)  # polling the list, with a deadline
        pause = min(pause * 2, 0.002)


def _give_up(client: redis.Redis, stream: str, writer: Writer, exc: ToolError) -> None:
    """Tell the reader the download ends here (the reply says why, typed)."""
    with contextlib.suppress(redis.RedisError):
        client.rpush(stream, writer.abort(exc.message))
        client.expire(stream, names.TRANSFER_TTL_S)
