# Generated from client/_async/transfers.py by scripts/unasync.py:
# edit that file and run the script.
"""File transfers as a client moves them: a stream of chunks on the transfer's Redis list.

The control request that starts a transfer (`TransferRequest`) goes first; the data
follows at once, without waiting for it to be taken: an upload pushes its chunks while
fewer than `names.TRANSFER_WINDOW` wait (RPUSH says how many do), a download pops them
as the host pushes them (`worker.fleet.transfers` is the other side). The request's
answer comes once the data has gone through, or at once when the host refused it. No
side holds the whole file, and no chunk waits for an answer of its own.

Each chunk carries a MAC by the key this client signs with (`worker.wire.transfer`): a
chunk someone else pushed is refused.

Written for asyncio; `client/_sync/transfers.py` is generated from it by
`scripts/unasync.py`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import IO, TYPE_CHECKING, cast

from client._sync.concurrency import sleep
from client.errors import WorkerError, WorkspaceFileError
from worker.fleet.connect import Redis
from worker.wire import names
from worker.wire.auth import AuthError
from worker.wire.control import TransferRequest, TransferResult
from worker.wire.transfer import Reader, TransferBrokenError, Writer

if TYPE_CHECKING:
    from client._sync.fleet import Fleet, SentControl

#: Seconds one side waits for the other (a chunk, or room on the list).
IDLE_S = 30.0
#: Longest a transfer's answer is waited for (its host moves the data meanwhile).
TRANSFER_TIMEOUT_S = 3600.0
#: Seconds one BLPOP waits before looking whether the host answered instead.
_POP_S = 0.5


def send(fleet: Fleet, host: str, request: TransferRequest,
               pieces: Iterable[bytes]) -> TransferResult:
    """Upload `pieces` (each at most a chunk) as `request`'s data; its answer."""
    client = fleet._chunk_client()
    stream = names.transfer_key(request.transfer)
    writer = Writer(fleet._identity.signing_key, request.transfer)
    sent = fleet._send_control(host, request, TRANSFER_TIMEOUT_S)
    try:
        for piece in pieces:
            if sent.slot.done():
                break  # the host answered before taking it all: a refusal
            _push(client, stream, writer.data(piece), sent)
        else:
            _push(client, stream, writer.end(), sent)
    except BaseException:
        _abandon(fleet, client, sent, stream, writer.abort("the client stopped"))
        raise
    return fleet._await_control(sent, TransferResult)


def _push(client: Redis, stream: str, item: bytes, sent: SentControl) -> None:
    """Push a chunk; past the window, wait until the host took half of it."""
    waiting = int(client.rpush(stream, item))
    if waiting == 1 or waiting >= names.TRANSFER_WINDOW:
        client.expire(stream, names.TRANSFER_TTL_S)
    if waiting < names.TRANSFER_WINDOW:
        return
    deadline, pause = time.monotonic() + IDLE_S, 0.001
    while int(client.llen(stream)) > names.TRANSFER_WINDOW // 2:
        if sent.slot.done():
            return
        if time.monotonic() > deadline:
            raise WorkerError(f"host {sent.host} took no data for {IDLE_S:g} s")
        sleep(pause)  # polling the list, with a deadline
        pause = min(pause * 2, 0.002)


def receive(fleet: Fleet, host: str, request: TransferRequest,
                  sink: IO[bytes]) -> TransferResult:
    """Download `request`'s data into `sink`; its answer (WorkspaceFileError when the
    stream broke off)."""
    client = fleet._chunk_client()
    stream = names.transfer_key(request.transfer)
    reader = Reader(fleet._identity.signing_key, request.transfer)
    sent = fleet._send_control(host, request, TRANSFER_TIMEOUT_S)
    broken: Exception | None = None
    try:
        _pop_all(client, stream, reader, sent, sink)
    except (AuthError, TransferBrokenError) as exc:
        broken = exc
    except BaseException:
        _abandon(fleet, client, sent, stream, None)
        raise
    client.delete(stream)
    result = fleet._await_control(sent, TransferResult)
    if broken is not None:
        raise WorkspaceFileError(f"the download of {request.path} broke off: {broken}")
    return result


def _pop_all(client: Redis, stream: str, reader: Reader, sent: SentControl,
                   sink: IO[bytes]) -> None:
    """Write the chunks to `sink` until the end (or until the host answered instead)."""
    deadline = time.monotonic() + IDLE_S
    while True:
        popped = client.blpop([stream], timeout=_POP_S)
        if popped is None:
            if sent.slot.done():
                return  # answered without (all) its data: the answer says why
            if time.monotonic() > deadline:
                raise WorkerError(f"host {sent.host} sent no data for {IDLE_S:g} s")
            continue
        data = reader.read(cast(bytes, popped[1]))  # a binary client's: bytes
        if data is None:
            return
        sink.write(data)
        deadline = time.monotonic() + IDLE_S


def _abandon(fleet: Fleet, client: Redis, sent: SentControl, stream: str,
                   last: bytes | None) -> None:
    """Stop waiting for the answer; tell the host (an upload's abort chunk) or drop what
    it pushed (a download)."""
    fleet._replies.forget(sent.task_id)
    try:
        if last is not None:
            client.rpush(stream, last)
            client.expire(stream, names.TRANSFER_TTL_S)
        else:
            client.delete(stream)
    except Exception:  # noqa: S110 - the stop itself is what the caller hears
        pass
