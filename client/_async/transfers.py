"""File transfers as a client moves them: a stream of chunks on the transfer's Redis list.

The control request that starts a transfer (`TransferRequest`) is answered once the
host's tool runs (or refused: no such workspace, too many transfers); then the data
flows on the transfer's list (`bashfleet.worker.fleet.transfers` is the other side): an upload
pushes its chunks while fewer than `names.TRANSFER_WINDOW` wait (RPUSH says how many
do), a download pops them as the host pushes them. How it ended comes last, on the
transfer's end list: its size, or the error the client raises typed (a file the
workspace has not, a directory where a file was meant...). No side holds the whole
file, and no chunk waits for an answer of its own.

Each chunk carries a MAC by the key this client signs with (`bashfleet.worker.wire.transfer`): a
chunk someone else pushed is refused.

Written for asyncio; `client/_sync/transfers.py` is generated from it by
`scripts/unasync.py`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import IO, TYPE_CHECKING, cast

from bashfleet.client._async.concurrency import sleep
from bashfleet.client.errors import WorkerError, WorkspaceFileError, error_for
from bashfleet.worker.wire import names
from bashfleet.worker.wire.auth import AuthError
from bashfleet.worker.wire.control import TransferOutcome, TransferRequest, TransferStarted
from bashfleet.worker.wire.transfer import Reader, TransferBrokenError, Writer, end_stream

if TYPE_CHECKING:
    from bashfleet.client._async.fleet import AsyncFleet
    from bashfleet.worker.fleet.connect import AsyncRedis

#: Seconds one side waits for the other (a chunk, room on the list, the end).
IDLE_S = 30.0
#: Seconds one BLPOP waits before looking at its deadline again.
_POP_S = 0.5


async def send(fleet: AsyncFleet, host: str, request: TransferRequest,
               pieces: Iterable[bytes]) -> TransferOutcome:
    """Upload `pieces` (each at most a chunk) as `request`'s data; how it ended."""
    client, key = fleet._chunk_client(), fleet._identity.signing_key
    stream, end = names.transfer_key(request.transfer), names.transfer_end_key(request.transfer)
    await fleet._control(host, request, TransferStarted)
    writer = Writer(key, request.transfer)
    try:
        for piece in pieces:
            if not await _push(client, stream, end, writer.data(piece)):
                break  # the host ended it early: the end says why
        else:
            await _push(client, stream, end, writer.end())
    except BaseException:
        await _stop(client, stream, writer.abort("the client stopped"))
        raise
    return await _outcome(client, key, request.transfer)


async def _push(client: AsyncRedis, stream: str, end: str, item: bytes) -> bool:
    """Push a chunk; past the window, wait until the host took half of it. False when
    the host ended the transfer instead."""
    waiting = int(await client.rpush(stream, item))
    if waiting == 1 or waiting >= names.TRANSFER_WINDOW:
        await client.expire(stream, names.TRANSFER_TTL_S)
    if waiting < names.TRANSFER_WINDOW:
        return True
    deadline, pause = time.monotonic() + IDLE_S, 0.001
    while int(await client.llen(stream)) > names.TRANSFER_WINDOW // 2:
        if int(await client.llen(end)):
            return False
        if time.monotonic() > deadline:
            raise WorkerError(f"the host took no data for {IDLE_S:g} s")
        await sleep(pause)  # polling the list, with a deadline
        pause = min(pause * 2, 0.002)
    return True


async def receive(fleet: AsyncFleet, host: str, request: TransferRequest,
                  sink: IO[bytes]) -> TransferOutcome:
    """Download `request`'s data into `sink`; how it ended (WorkspaceFileError when the
    stream broke off)."""
    client, key = fleet._chunk_client(), fleet._identity.signing_key
    stream = names.transfer_key(request.transfer)
    await fleet._control(host, request, TransferStarted)
    reader = Reader(key, request.transfer)
    broken: Exception | None = None
    try:
        await _pop_all(client, stream, reader, sink)
    except (AuthError, TransferBrokenError) as exc:
        broken = exc
    finally:
        await client.delete(stream)
    outcome = await _outcome(client, key, request.transfer)
    if broken is not None:
        raise WorkspaceFileError(f"the download of {request.path} broke off: {broken}")
    return outcome


async def _pop_all(client: AsyncRedis, stream: str, reader: Reader, sink: IO[bytes]) -> None:
    """Write the chunks to `sink` until the end."""
    deadline = time.monotonic() + IDLE_S
    while True:
        popped = await client.blpop([stream], timeout=_POP_S)
        if popped is None:
            if time.monotonic() > deadline:
                raise WorkerError(f"the host sent no data for {IDLE_S:g} s")
            continue
        data = reader.read(cast(bytes, popped[1]))  # a binary client's: bytes
        if data is None:
            return
        sink.write(data)
        deadline = time.monotonic() + IDLE_S


async def _outcome(client: AsyncRedis, key: str | None, transfer: str) -> TransferOutcome:
    """How the transfer ended, as its host said; its error raised typed."""
    end = names.transfer_end_key(transfer)
    popped = await client.blpop([end], timeout=IDLE_S)
    if popped is None:
        raise WorkerError(f"transfer {transfer}: the host did not say how it ended")
    await client.delete(end)
    data = Reader(key, end_stream(transfer)).read(cast(bytes, popped[1]))
    outcome = TransferOutcome.model_validate_json(bytes(data or b""))
    if outcome.error is not None:
        raise error_for(outcome.error.kind, outcome.error.message, outcome.error.file)
    return outcome


async def _stop(client: AsyncRedis, stream: str, last: bytes) -> None:
    """Tell the host the upload ends here (it stops at this chunk)."""
    try:
        await client.rpush(stream, last)
        await client.expire(stream, names.TRANSFER_TTL_S)
    except Exception:  # noqa: S110 - the stop itself is what the caller hears
        pass
