"""File transfers on the owning host: chunks between a transfer's Redis list and the
pipe of a tool in the workspace (`bashfleet.worker.engine.files.stream_tool`).

    client ──chunks (RPUSH)──► bashfleet:transfer:<id> ──BLPOP──► worker ──pipe──► cat/tar
    client ◄──BLPOP── bashfleet:transfer:<id> ◄──chunks (RPUSH)── worker ◄──pipe── dd/tar
    client ◄──BLPOP── bashfleet:transfer-end:<id> ◄── how it ended (TransferOutcome)

The request is answered once the tool runs (a refusal at once: no such workspace, too
many transfers); it is acted on in its owner's lane (`bashfleet.worker.fleet.lanes`), and the data
then moves on a thread of its own, so the control consumer's few threads stay free for
checks and kills however long a transfer takes. An owner moves at most
MAX_OWNER_TRANSFERS at once on a host, every owner together MAX_TRANSFERS. Neither side
waits for an answer per chunk: the writer pushes while fewer than
`names.TRANSFER_WINDOW` chunks wait on the list (RPUSH says how many do), and waits for
the reader only past that, so Redis holds a few MiB of a transfer whatever its size.
Each chunk is framed and MAC'd with the key that signed the request
(`bashfleet.worker.wire.transfer`). A download's bytes go from the tool's stdout straight onto the
list: they never rest in a file a command of the workspace could replace.

A side that stops for IDLE_S ends the transfer with an error: the client (nothing
popped, nothing pushed) or the tool (nothing written to the pipe or read from it, as a
tool blocked on a FIFO or a stalled mount would: it is killed); so does a transfer that
moved data for `transfer_timeout_s`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from functools import lru_cache

import redis

from bashfleet.worker.engine import files
from bashfleet.worker.engine import workspaces as engine
from bashfleet.worker.fleet.connect import redis_client
from bashfleet.worker.fleet.control import Runtime
from bashfleet.worker.fleet.workspace_calls import owned
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire import names
from bashfleet.worker.wire.auth import AuthError
from bashfleet.worker.wire.control import (
    ControlError,
    TransferOutcome,
    TransferRequest,
    TransferStarted,
)
from bashfleet.worker.wire.errors import ErrorKind, FileProblem, ToolError
from bashfleet.worker.wire.transfer import (
    CHUNK_BYTES,
    HEADER_BYTES,
    Reader,
    TransferBrokenError,
    Writer,
    end_stream,
)

log = logging.getLogger("bashfleet.worker")

#: Seconds a transfer waits for the other side (a chunk, or room on the list).
IDLE_S = 30.0
#: Transfers one worker moves at once (a thread, a tool and a pipe each); past it a
#: transfer is refused (`limit`) rather than queued behind them.
MAX_TRANSFERS = 16
#: Transfers one owner moves at once on a host (the others' stay free).
MAX_OWNER_TRANSFERS = 8


class Slots:
    """Places of running transfers: at most `host` in all, `per_owner` an owner."""

    def __init__(self, host: int, per_owner: int) -> None:
        self.host, self.per_owner = host, per_owner
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}

    def take(self, owner: str, where: str) -> None:
        """Take a place for `owner`; ToolError `limit` when there is none."""
        with self._lock:
            if self._held.get(owner, 0) >= self.per_owner:
                raise ToolError("limit", f"owner {owner or '(none)'} runs {self.per_owner} "
                                f"transfers on host {where}, the most allowed: try again "
                                "when one ended")
            if sum(self._held.values()) >= self.host:
                raise ToolError("limit", f"{self.host} transfers are running on host "
                                         f"{where}: try again when one ended")
            self._held[owner] = self._held.get(owner, 0) + 1

    def give_back(self, owner: str) -> None:
        with self._lock:
            left = self._held.get(owner, 0) - 1
            if left > 0:
                self._held[owner] = left
            else:
                self._held.pop(owner, None)


_slots = Slots(MAX_TRANSFERS, MAX_OWNER_TRANSFERS)

#: What moves a transfer's data: (client, its list, its MAC key, its id, its tool) ->
#: the bytes that travelled.
Move = Callable[[redis.Redis, str, "str | None", str, files.StreamingTool], int]


@lru_cache(maxsize=4)
def _client_for(url: str) -> redis.Redis:
    return redis_client(url, binary=True)


def _client(settings: Settings) -> redis.Redis:
    """This process's Redis client for chunks (bytes, not text)."""
    return _client_for(settings.redis_url_value() or "")


def transfer(rt: Runtime, request: TransferRequest, admin: bool, key: str | None
             ) -> TransferStarted:
    """Start the tool of an upload or a download and move its data on a thread; `key`:
    the one that signed the request (the chunks' MAC key)."""
    _slots.take(request.owner, rt.settings.host)
    try:
        record = owned(rt, request.workspace, request.owner, admin)
        engine.touch(record, rt.settings)
        tool = files.stream_tool(record, rt.settings, request.direction, request.kind,
                                 request.path, mode=request.mode)
    except BaseException:
        _slots.give_back(request.owner)
        raise
    tool.deadline = time.monotonic() + rt.settings.transfer_timeout_s
    move: Move = _take if request.direction == "upload" else _give
    threading.Thread(target=_run, args=(move, _client(rt.settings), key, request, tool),
                     name=f"bashfleet-transfer-{request.transfer}", daemon=True).start()
    return TransferStarted(path=files.in_view(record, request.path))


def _run(move: Move, client: redis.Redis, key: str | None, request: TransferRequest,
         tool: files.StreamingTool) -> None:
    """Move the data; then say how it ended on the end list."""
    transfer_id = request.transfer
    try:
        outcome = TransferOutcome(
            size=move(client, names.transfer_key(transfer_id), key, transfer_id, tool))
    except ToolError as exc:
        outcome = _failed(exc.kind, exc.message, exc.file)
    except (redis.RedisError, OSError) as exc:
        outcome = _failed("unavailable", f"the transfer failed: {exc}")
    except Exception as exc:  # a bug must still answer the client
        log.exception("transfer %s failed inside the worker", transfer_id)
        outcome = _failed("internal", f"worker error: {exc!r}")
    finally:
        if tool.outputs:  # a failure before its end was waited for
            files.kill(tool.proc)
            with contextlib.suppress(ToolError):
                tool.finish(IDLE_S)
        _slots.give_back(request.owner)
    end = Writer(key, end_stream(transfer_id)).data(outcome.model_dump_json().encode())
    with contextlib.suppress(redis.RedisError):
        client.rpush(names.transfer_end_key(transfer_id), end)
        client.expire(names.transfer_end_key(transfer_id), names.TRANSFER_TTL_S)


def _failed(kind: ErrorKind, message: str, file: FileProblem | None = None) -> TransferOutcome:
    return TransferOutcome(error=ControlError(kind=kind, message=message, file=file))


def _take(client: redis.Redis, stream: str, key: str | None, transfer_id: str,
          tool: files.StreamingTool) -> int:
    """An upload: chunks into the tool's stdin until the end; the bytes taken."""
    reader = Reader(key, transfer_id)
    broken: Exception | None = None
    try:
        while (data := _next(client, stream, reader)) is not None:
            tool.write_all(data, IDLE_S)
    except BrokenPipeError:
        pass  # the tool ended early: its status says why
    except files.FileError:
        raise  # the tool stalled (and was killed): said as it is
    except (AuthError, TransferBrokenError, ToolError) as exc:
        broken = exc
    finally:
        client.delete(stream)
        tool.close_pipe()
    tool.finish(IDLE_S)
    if broken is not None:
        raise ToolError("invalid", f"the upload broke off: {broken}")
    return reader.size


def _next(client: redis.Redis, stream: str, reader: Reader) -> memoryview | None:
    popped = client.blpop([stream], timeout=IDLE_S)
    if popped is None:
        raise ToolError("unavailable", f"no data for {IDLE_S:g} s")
    item = popped[1]
    return reader.read(item if isinstance(item, bytes) else item.encode())


def _give(client: redis.Redis, stream: str, key: str | None, transfer_id: str,
          tool: files.StreamingTool) -> int:
    """A download: the tool's stdout onto the list, then the end; the bytes given."""
    writer = Writer(key, transfer_id)
    # Each chunk read into one buffer after room for its header, framed there, pushed.
    buffer = bytearray(HEADER_BYTES + CHUNK_BYTES)
    try:
        while size := tool.read_into(memoryview(buffer)[HEADER_BYTES:], IDLE_S):
            _push(client, stream, writer.data_in(buffer, size))
        tool.finish(IDLE_S)
    except ToolError as exc:
        tool.close_pipe()
        if tool.outputs:  # not waited for yet (the reader went away)
            files.kill(tool.proc)
            with contextlib.suppress(ToolError):
                tool.finish(IDLE_S)
        with contextlib.suppress(redis.RedisError):
            client.rpush(stream, writer.abort(exc.message))
        raise
    _push(client, stream, writer.end())
    return writer.size


def _push(client: redis.Redis, stream: str, item: bytes | memoryview) -> None:
    """Push a chunk; past the window, wait until the reader took half of it."""
    waiting = int(client.rpush(stream, item))
    if waiting == 1 or waiting >= names.TRANSFER_WINDOW:
        client.expire(stream, names.TRANSFER_TTL_S)
    if waiting < names.TRANSFER_WINDOW:
        return
    deadline, pause = time.monotonic() + IDLE_S, 0.001
    while int(client.llen(stream)) > names.TRANSFER_WINDOW // 2:
        if time.monotonic() > deadline:
            raise ToolError("unavailable", f"the download's reader took nothing for {IDLE_S:g} s")
        time.sleep(pause)  # polling the list, with a deadline
        pause = min(pause * 2, 0.002)
