# Generated from client/_async/transfers.py by scripts/unasync.py:
# edit that file and run the script.
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

from bashfleet.client._sync.concurrency import sleep
from bashfleet.client.errors import WorkerError, WorkspaceFileError, error_for
from bashfleet.worker.wire import names
from bashfleet.worker.wire.auth import AuthError
from bashfleet.worker.wire.control import TransferOutcome, TransferRequest, TransferStarted
from bashfleet.worker.wire.transfer import Reader, TransferBrokenError, Writer, end_stream

if TYPE_CHECKING:
    from bashfleet.client._sync.fleet import Fleet
    from bashfleet.worker.fleet.connect import Redis

#: Seconds one side waits for the other (a chunk, room on the list, the end).
IDLE_S = 30.0
#: Seconds one BLPOP waits before looking at its deadline again.
_POP_S = 0.5


def send(fleet: Fleet, host: str, request: TransferRequest,
               pieces: Iterable[bytes]) -> TransferOutcome:
    """Upload `pieces` (each at most a chunk) as `request`'s data; how it ended."""
    client, key = fleet._chunk_client(), fleet._identity.signing_key
    stream, end = names.transfer_key(request.transfer), names.transfer_end_key(request.transfer)
    fleet._control(host, request, TransferStarted)
    writer = Writer(key, request.transfer)
    try:
        for piece in pieces:
            if not _push(client, stream, end, writer.data(piece)):
                break  # the host ended it early: the end says why
        else:
            _push(client, stream, end, writer.end())
    except BaseException:
        _stop(client, stream, writer.abort("the client stopped"))
        raise
    return _outcome(client, key, request.transfer)


def _push(client: Redis, stream: str, end: str, item: bytes) -> bool:
    """Push a chunk; past the window, wait until the host took half of it. False when
    the host ended the transfer instead."""
    waiting = int(client.rpush(stream, item))
    if waiting == 1 or waiting >= names.TRANSFER_WINDOW:
        client.expire(stream, names.TRANSFER_TTL_S)
    if waiting < names.TRANSFER_WINDOW:
        return True
    deadline, pause = time.monotonic() + IDLE_S, 0.001
    while int(client.llen(stream)) > names.TRANSFER_WINDOW // 2:
        if int(client.llen(end)):
            return False
        if time.monotonic() > deadline:
            raise WorkerError(f"the host took no data for {IDLE_S:g} s")
        sleep(pause)  # polling the list, with a deadline
        pause = min(pause * 2, 0.002)
    return True


def receive(fleet: Fleet, host: str, request: TransferRequest,
                  sink: IO[bytes]) -> TransferOutcome:
    """Download `request`'s data into `sink`; how it ended (WorkspaceFileError when the
    stream broke off)."""
    client, key = fleet._chunk_client(), fleet._identity.signing_key
    stream = names.transfer_key(request.transfer)
    fleet._control(host, request, TransferStarted)
    reader = Reader(key, request.transfer)
    broken: Exception | None = None
    try:
        _pop_all(client, stream, reader, sink)
    except (AuthError, TransferBrokenError) as exc:
        broken = exc
    finally:
        client.delete(stream)
    outcome = _outcome(client, key, request.transfer)
    if broken is not None:
        raise WorkspaceFileError(f"the download of {request.path} broke off: {broken}")
    return outcome


def _pop_all(client: Redis, stream: str, reader: Reader, sink: IO[bytes]) -> None:
    """Write the chunks to `sink` until the end."""
    deadline = time.monotonic() + IDLE_S
    while True:
        popped = client.blpop([stream], timeout=_POP_S)
        if popped is None:
            if time.monotonic() > deadline:
                raise WorkerError(f"the host sent no data for {IDLE_S:g} s")
            continue
        data = reader.read(cast(bytes, popped[1]))  # a binary client's: bytes
        if data is None:
            return
        sink.write(data)
        deadline = time.monotonic() + IDLE_S


def _outcome(client: Redis, key: str | None, transfer: str) -> TransferOutcome:
    """How the transfer ended, as its host said; its error raised typed."""
    end = names.transfer_end_key(transfer)
    popped = client.blpop([end], timeout=IDLE_S)
    if popped is None:
        raise WorkerError(f"transfer {transfer}: the host did not say how it ended")
    client.delete(end)
    data = Reader(key, end_stream(transfer)).read(cast(bytes, popped[1]))
    outcome = TransferOutcome.model_validate_json(bytes(data or b""))
    if outcome.error is not None:
        raise error_for(outcome.error.kind, outcome.error.message, outcome.error.file)
    return outcome


def _stop(client: Redis, stream: str, last: bytes) -> None:
    """Tell the host the upload ends here (it stops at this chunk)."""
    try:
        client.rpush(stream, last)
        client.expire(stream, names.TRANSFER_TTL_S)
    except Exception:  # noqa: S110 - the stop itself is what the caller hears
        pass
