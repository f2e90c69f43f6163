"""A transfer's chunks: framed and MAC'd in order, refused when forged, reordered,
replayed into another transfer or cut short; a directory's tar stream as pieces."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from bashfleet.client._core.workspaces import file_pieces, pack, tar_pieces
from bashfleet.worker.wire.auth import AuthError
from bashfleet.worker.wire.transfer import Reader, TransferBrokenError, Writer, new_transfer_id

KEY = "k" * 32


def _stream(key: str | None, transfer: str) -> list[bytes]:
    writer = Writer(key, transfer)
    return [writer.data(b"one"), writer.data(b"two"), writer.end()]


def test_chunks_are_read_in_order_to_the_end() -> None:
    transfer = new_transfer_id()
    reader = Reader(KEY, transfer)
    assert [reader.read(item) for item in _stream(KEY, transfer)] == [b"one", b"two", None]


@pytest.mark.parametrize("change", ["forged", "reordered", "other transfer", "other key"])
def test_a_chunk_that_is_not_the_writers_is_refused(change: str) -> None:
    transfer = new_transfer_id()
    items = _stream(KEY, transfer)
    if change == "forged":
        items[0] = items[0][:-1] + b"X"
    elif change == "reordered":
        items[0], items[1] = items[1], items[0]
    elif change == "other transfer":
        items = _stream(KEY, new_transfer_id())
    else:
        items = _stream("another key" * 3, transfer)
    with pytest.raises(AuthError):
        Reader(KEY, transfer).read(items[0])


def test_a_lost_chunk_or_an_abort_breaks_the_stream() -> None:
    transfer = new_transfer_id()
    writer = Writer(KEY, transfer)
    writer.data(b"lost")
    reader = Reader(KEY, transfer)
    with pytest.raises(AuthError):  # the next one is not chunk 0
        reader.read(writer.end())
    writer = Writer(None, transfer)
    with pytest.raises(TransferBrokenError, match="stopped"):
        Reader(None, transfer).read(writer.abort("the client stopped"))
    short = Writer(None, transfer)
    short.size = 10  # said to have sent 10 bytes, none of which arrived
    with pytest.raises(TransferBrokenError, match="0 bytes arrived, 10 were sent"):
        Reader(None, transfer).read(short.end())


def test_a_directorys_pieces_are_the_tar_pack_makes(tmp_path: Path) -> None:
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "e" / "big").write_bytes(os.urandom(3 * 1024 * 1024 + 5))
    (tmp_path / "d" / "small").write_bytes(b"s")
    (tmp_path / "d" / "link").symlink_to("small")
    pieces = list(tar_pieces(tmp_path / "d", size=1024 * 1024))
    assert all(len(piece) == 1024 * 1024 for piece in pieces[:-1])
    with tarfile.open(fileobj=io.BytesIO(b"".join(pieces))) as streamed, \
            tarfile.open(fileobj=io.BytesIO(pack(tmp_path / "d"))) as packed:
        shape = [(m.name, m.type, m.size, m.linkname) for m in packed.getmembers()]
        assert [(m.name, m.type, m.size, m.linkname) for m in streamed.getmembers()] == shape
        big = streamed.extractfile("e/big")
        assert big is not None and big.read() == (tmp_path / "d" / "e" / "big").read_bytes()
    assert len(b"".join(pieces)) % tarfile.RECORDSIZE == 0


def test_a_files_pieces(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 10)
    assert list(file_pieces(tmp_path / "f", size=4)) == [b"xxxx", b"xxxx", b"xx"]
    (tmp_path / "empty").write_bytes(b"")
    assert list(file_pieces(tmp_path / "empty")) == [b""]
