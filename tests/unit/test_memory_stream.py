"""capture.MemoryStream: bounded memory, exact counts, and what a shaper can read back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bashfleet.worker.engine.output.capture import MemoryStream, shape
from bashfleet.worker.wire.models import Middle, TailLines


def _fill(chunks: list[bytes], head: int = 64, tail: int = 64) -> MemoryStream:
    stream = MemoryStream(head_cap=head, tail_cap=tail)
    for chunk in chunks:
        stream.append(chunk)
    return stream


@given(st.lists(st.binary(max_size=50), max_size=40))
def test_counts_are_exact_and_memory_bounded(chunks: list[bytes]) -> None:
    data = b"".join(chunks)
    stream = _fill(chunks)
    assert stream.total == len(data)
    assert stream.newlines == data.count(b"\n")
    assert len(stream.head) <= 64 and len(stream.tail) <= 2 * 64 + 50
    # The head is the exact start, the kept tail the exact end.
    assert bytes(stream.head) == data[:64]
    assert data.endswith(bytes(stream.tail))


@given(st.lists(st.binary(max_size=50), max_size=40), st.integers(0, 3000), st.integers(0, 300))
def test_reads_return_true_bytes_of_the_stream(chunks: list[bytes], offset: int, size: int) -> None:
    data = b"".join(chunks)
    got = _fill(chunks).read(offset, size)
    wanted = data[offset : offset + size]
    # Whatever comes back is the real end of the asked range (never invented bytes).
    assert wanted.endswith(got)
    if offset + size <= 64 or offset >= len(data) - 64:
        assert got == wanted


def test_shapes_a_huge_stream_from_memory_like_a_file() -> None:
    stream = MemoryStream()
    for i in range(200_000):
        stream.append(f"line {i}\n".encode())
    cut = shape(stream, stream.total, stream.lines, TailLines(), None)
    assert cut.info.total_lines == 200_000
    assert cut.info.truncated and cut.text.endswith("line 199999\n")
    assert cut.info.shown_lines == 2000
    middle = shape(stream, stream.total, stream.lines, Middle(), None)
    assert middle.text.startswith("line 0\n") and middle.text.endswith("line 199999\n")
