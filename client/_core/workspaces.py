"""Workspaces, the client's pure part: where one is made, what Redis says of one, how
files travel (chunks, tar streams). No I/O.

A workspace is a directory on one host and the namespaces its calls share (see
`bashfleet.worker.engine.workspaces`); the client reaches it through its host's control queue
(make, renew, delete, files) and runs calls in it through that host's command queue.
"""

from __future__ import annotations

import os
import random
import tarfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import IO, TypeVar

from pydantic import ValidationError

from bashfleet.client._core import archives
from bashfleet.client._core.sending import opened_view
from bashfleet.client.errors import CallRejected, HostUnavailable, WorkspaceFileError
from bashfleet.worker.wire import auth
from bashfleet.worker.wire.models import HostInfo, Model, SnapshotRecord, WorkspaceView
from bashfleet.worker.wire.owner_keys import SUB_OWNER

#: Seal purpose of a workspace's view in Redis (what its host wrote).
#: Bytes per file read or write (a control call's message stays small on Redis).
FILE_CHUNK = 4 * 1024 * 1024
#: The owner quota workspaces count in: its members are an owner's live workspaces.
QUOTA_KIND = "workspaces"


def choose_host(infos: Sequence[HostInfo], host: str | None, label: str | None, *,
                owned: Mapping[str, int] | None = None,
                pick: Callable[[Sequence[str]], str] = random.choice) -> str:
    """Where a new workspace goes: `host`, else a live host (of `label`) with the fewest
    of the owner's live workspaces (`owned`, by host), then the least loaded (calls
    running and queued, per command slot), then any of those (`pick`, at random: by
    name, every client would pile onto the same host); HostUnavailable when none is
    alive. A workspace holds no command slot while idle, so free slots alone left every
    workspace of an idle fleet on one host."""
    if host is not None:
        return host
    alive = [info for info in infos if info.alive and (label is None or label in info.labels)]
    if not alive:
        where = f" with label {label!r}" if label else ""
        raise HostUnavailable(f"no live host{where} to make a workspace on")
    counts = owned or {}

    def rank(info: HostInfo) -> tuple[int, float]:
        return counts.get(info.host, 0), load(info)

    best = min(rank(info) for info in alive)
    return pick(sorted(info.host for info in alive if rank(info) == best))


def load(info: HostInfo) -> float:
    """Calls running and waiting on a host, per command slot."""
    return (info.busy + info.queued) / max(info.slots, 1)


def owned_by_host(views: Iterable[WorkspaceView], placing: Mapping[str, int]) -> Counter[str]:
    """An owner's live workspaces by host: those in Redis (`views`), and those its client
    is making now (`placing`), not there yet (made at once, they would all see none)."""
    counts = Counter(view.host for view in views)
    counts.update(placing)
    return counts


#: The tag on an agent session's workspaces (`bashfleet mcp`'s) naming the owner of
#: who started its server.
STARTED_BY = "started_by"
#: How an agent session's owner begins (`session:<id>`).
SESSION_OWNER_PREFIX = "session:"


def started_by(view: WorkspaceView, owner: str) -> bool:
    """Whether a workspace is an agent session's that `owner` started (`session:<id>`;
    `<owner>::session:<id>` for a server holding an owner key)."""
    prefixes = (SESSION_OWNER_PREFIX, f"{owner}{SUB_OWNER}{SESSION_OWNER_PREFIX}")
    return view.owner.startswith(prefixes) and view.tags.get(STARTED_BY) == owner


M = TypeVar("M", bound=Model)

#: Seal purpose of a snapshot's record (`bashfleet.worker.fleet.snapshot_calls`).
SNAPSHOT = "snapshot"
#: The owner quota snapshots count in.
SNAPSHOT_QUOTA_KIND = "snapshots"


def open_snapshot(keys: Mapping[str, str], snap_id: str, sealed: str | None
                  ) -> SnapshotRecord | None:
    """A snapshot's record as its host sealed it in Redis; None when there is none or it
    does not verify (never believed)."""
    return _opened(keys, SNAPSHOT, snap_id, sealed, SnapshotRecord)


def open_view(keys: Mapping[str, str], ws_id: str, sealed: str | None) -> WorkspaceView | None:
    """A workspace's view as its host sealed it in Redis; None when there is none or it
    does not verify (never believed)."""
    text = opened_view(keys, ws_id, sealed)
    if text is None:
        return None
    try:
        return WorkspaceView.model_validate_json(text)
    except ValidationError:
        return None


def _opened(keys: Mapping[str, str], purpose: str, name: str, sealed: str | None,
            model: type[M]) -> M | None:
    if sealed is None:
        return None
    try:
        return model.model_validate_json(auth.unlock(keys, purpose, name, sealed))
    except (auth.AuthError, ValidationError, ValueError):
        return None


def chunks(data: bytes, size: int = FILE_CHUNK) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) pieces of `data`: one, empty, for empty data."""
    if not data:
        yield 0, b""
        return
    for offset in range(0, len(data), size):
        yield offset, data[offset:offset + size]


#: Bytes of the pieces a streamed upload is cut into (one transfer chunk each).
PIECE_BYTES = 1024 * 1024


def file_pieces(path: str | os.PathLike[str], size: int = PIECE_BYTES) -> Iterator[bytes]:
    """A local file's bytes, a piece at a time (one empty piece for an empty file)."""
    with open(path, "rb") as source:
        first = True
        while (piece := source.read(size)) or first:
            first = False
            yield piece


def tar_pieces(directory: str | os.PathLike[str], size: int = PIECE_BYTES) -> Iterator[bytes]:
    """A local directory's contents as an uncompressed tar, a piece at a time: what
    `pack` makes, never the whole of it at once."""
    folder = os.fspath(directory)
    if not os.path.isdir(folder):
        raise CallRejected(f"not a directory: {folder}")
    return _batched(_tar_stream(folder), size)


def _tar_stream(folder: str) -> Iterator[bytes]:
    import io  # noqa: PLC0415

    # A TarFile only for its `gettarinfo` (lstat, hard links already seen).
    index = tarfile.TarFile(fileobj=io.BytesIO(), mode="w")
    written = 0
    for path, name in _tree(folder, ""):
        info = index.gettarinfo(path, arcname=name)
        header = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        yield header
        written += len(header)
        if info.isreg():
            left = info.size
            for piece in file_pieces(path):
                yield piece[:left]
                left -= min(left, len(piece))
                if not left:
                    break
            # Zeros for what a file that shrank meanwhile no longer has, then the padding.
            padding = -info.size % tarfile.BLOCKSIZE
            yield bytes(left + padding)
            written += info.size + padding
    end = 2 * tarfile.BLOCKSIZE
    yield bytes(end + -(written + end) % tarfile.RECORDSIZE)


def _tree(folder: str, prefix: str) -> Iterator[tuple[str, str]]:
    """(path, name in the archive) of everything under `folder`, parents first, names
    sorted, symlinks not followed."""
    for entry in sorted(os.listdir(folder)):
        path, name = os.path.join(folder, entry), f"{prefix}{entry}"
        yield path, name
        if os.path.isdir(path) and not os.path.islink(path):
            yield from _tree(path, f"{name}/")


def _batched(pieces: Iterable[bytes], size: int) -> Iterator[bytes]:
    """`pieces` joined and cut again into pieces of `size` bytes (the last shorter)."""
    buffer = bytearray()
    for piece in pieces:
        buffer += piece
        while len(buffer) >= size:
            yield bytes(buffer[:size])
            del buffer[:size]
    if buffer:
        yield bytes(buffer)


def pack(directory: str | os.PathLike[str]) -> bytes:
    """A local directory as an uncompressed tar (its contents, not itself)."""
    folder = os.fspath(directory)
    if not os.path.isdir(folder):
        raise CallRejected(f"not a directory: {folder}")
    import io  # noqa: PLC0415

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name in sorted(os.listdir(folder)):
            archive.add(os.path.join(folder, name), arcname=name)
    return buffer.getvalue()


def unpack(data: bytes, directory: str | os.PathLike[str]) -> None:
    """`unpack_file` of a tar in memory."""
    import io  # noqa: PLC0415

    unpack_file(io.BytesIO(data), directory)


def unpack_file(source: IO[bytes], directory: str | os.PathLike[str]) -> None:
    """Unpack a tar from a workspace into a local directory (made if missing), checked
    member by member first (`bashfleet.client._core.archives`): the archive comes from a place a
    model's commands can write. WorkspaceFileError, nothing written, when a member would
    land outside the directory (absolute, `..`, a link out) or is a device or FIFO."""
    folder = os.fspath(directory)
    try:
        with tarfile.open(fileobj=source, mode="r") as archive:
            archives.extract(archive, folder)
    except archives.UnsafeMemberError as exc:
        raise WorkspaceFileError(f"refused to unpack into {folder}: {exc}") from None
    except tarfile.TarError as exc:
        raise WorkspaceFileError(f"could not unpack into {folder}: {exc}") from None
