"""bashfleet.worker.engine.output.capture:
UTF-8 boundaries, slices of a file, and shaping small and huge files."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bashfleet.worker.engine.output import truncate
from bashfleet.worker.engine.output.capture import (
    SMALL_CHUNK,
    WHOLE_READ_LIMIT,
    FollowedFile,
    read_slice,
    shape,
)
from bashfleet.worker.engine.output.sanitize import (
    REDACTED,
    redact,
    sanitize,
    secret_pattern,
    utf8_boundary,
)
from bashfleet.worker.wire.models import (
    ByteTail,
    CharCap,
    Middle,
    TailLines,
    Truncation,
    TruncationInfo,
)

MIB = 1024 * 1024


def _raw_lines(raw: bytes) -> int:
    return raw.count(b"\n") + (1 if raw and not raw.endswith(b"\n") else 0)


def _valid_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _write(tmp_path: Path, raw: bytes, name: str = "out.log") -> Path:
    path = tmp_path / name
    path.write_bytes(raw)
    return path


# ------------------------------------------------------------------- _utf8_boundary


@pytest.mark.parametrize(
    ("data", "boundary"),
    [
        (b"", 0),
        (b"abc", 3),
        (b"ab\xc3", 2),  # lead of a 2-byte character, alone
        (b"ab\xc3\xa9", 4),
        (b"a\xe2", 1),
        (b"a\xe2\x9c", 1),
        (b"a\xe2\x9c\x93", 4),
        (b"\xf0\x9f\x98", 0),
        (b"\xf0\x9f\x98\x80", 4),
        (b"x\xf0", 1),
        (b"\x80", 1),  # a stray continuation byte: nothing to wait for
        (b"a\x80\x80\x80\x80", 5),
        (b"a\xff", 2),  # not a lead byte at all
    ],
)
def test_utf8_boundary(data: bytes, boundary: int) -> None:
    assert utf8_boundary(data) == boundary


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=40), st.data())
def test_utf8_boundary_of_any_cut(text: str, data: st.DataObject) -> None:
    encoded = text.encode("utf-8")
    cut = data.draw(st.integers(0, len(encoded)))
    prefix = encoded[:cut]
    end = utf8_boundary(prefix)
    # The longest prefix that is whole characters: it decodes, and it is a real
    # character boundary of the text.
    assert cut - 3 <= end <= cut
    prefix[:end].decode("utf-8")
    assert text.encode("utf-8").startswith(prefix[:end])
    whole = [len(text[:i].encode("utf-8")) for i in range(len(text) + 1)]
    assert end == max(b for b in whole if b <= cut)


# ----------------------------------------------------------------------- read_slice


def test_read_slice_ends_on_a_line_boundary(tmp_path: Path) -> None:
    path = _write(tmp_path, b"one\ntwo\nthree\n")
    assert read_slice(path, 0, 10, None) == ("one\ntwo\n", 8, 14)
    assert read_slice(path, 8, 10, None) == ("three\n", 14, 14)
    assert read_slice(path, 14, 10, None) == ("", 14, 14)


def test_read_slice_clamps_offsets(tmp_path: Path) -> None:
    path = _write(tmp_path, b"abc\n")
    assert read_slice(path, -5, 100, None) == ("abc\n", 4, 4)
    assert read_slice(path, 99, 100, None) == ("", 4, 4)


def test_read_slice_long_line_never_splits_a_character(tmp_path: Path) -> None:
    path = _write(tmp_path, "é✓😀".encode() * 3)  # 9 bytes a round, no newline
    text, end, size = read_slice(path, 0, 4, None)
    assert (text, end, size) == ("é", 2, 27)
    text, end, _ = read_slice(path, end, 8, None)
    assert (text, end) == ("✓😀", 9)  # the é after them is cut: left for next time


def test_read_slice_limit_below_one_character_still_moves_on(tmp_path: Path) -> None:
    path = _write(tmp_path, "😀x".encode())
    assert read_slice(path, 0, 1, None) == ("😀", 4, 5)
    assert read_slice(path, 4, 1, None) == ("x", 5, 5)
    assert read_slice(path, 0, 0, None) == ("", 0, 5)


def test_read_slice_sanitizes_and_redacts(tmp_path: Path) -> None:
    path = _write(tmp_path, b"\x1b[31mtoken=s3cr3tvalue\x1b[0m\r\n")
    text, end, size = read_slice(path, 0, 1000, secret_pattern(["s3cr3tvalue"]))
    assert text == f"token={REDACTED}\n"
    assert end == size


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.text(alphabet=st.sampled_from("ab é✓😀\n"), max_size=30), max_size=10),
    st.integers(1, 40),
)
def test_consecutive_slices_lose_nothing(pieces: list[str], limit: int) -> None:
    raw = "".join(pieces).encode()
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), raw)
        offset, parts, rounds = 0, [], 0
        while offset < len(raw):
            text, next_offset, size = read_slice(path, offset, limit, None)
            assert size == len(raw)
            assert next_offset > offset
            assert next_offset - offset <= max(limit, 4)
            parts.append(text)
            offset = next_offset
            rounds += 1
            assert rounds <= len(raw)
    assert "".join(parts) == raw.decode()


# --------------------------------------------------------------------------- shape

_POLICIES: list[Truncation] = [
    TailLines(),
    TailLines(max_lines=7, max_bytes=300),
    ByteTail(),
    ByteTail(max_bytes=100),
    CharCap(),
    CharCap(max_chars=50),
    Middle(),
    Middle(max_bytes=1000, keep_bytes=64),
]


def _expected(raw: bytes, policy: Truncation, secrets: list[str] | None = None) -> truncate.Cut:
    """The pure cut of the whole clean text, with totals of the raw bytes."""
    clean = redact(sanitize(raw), secret_pattern(secrets or []))
    cut = truncate.apply(clean, policy)
    assert truncate.count_lines(clean) == _raw_lines(raw)  # true of the files used here
    return truncate.Cut(cut.text, cut.info.model_copy(update={"total_bytes": len(raw)}))


def _check_counts(text: str, info: TruncationInfo, raw: bytes, policy: Truncation) -> None:
    """Invariants every shaped stream satisfies."""
    assert info.total_bytes == len(raw)
    assert info.total_lines == _raw_lines(raw)
    assert info.shown_lines <= info.total_lines
    if _valid_utf8(raw):
        # Sanitizing only removes then. (Invalid bytes become U+FFFD, 3 bytes each, so
        # the shown text of binary output can be larger than what the command wrote.)
        assert info.shown_bytes <= info.total_bytes
    size = len(text) if isinstance(policy, CharCap) else truncate.utf8_len(text)
    assert size <= truncate.shown_limit(policy)
    text.encode("utf-8")
    if info.direction == "middle" and info.truncated:
        head, _, tail = text.partition(truncate.SNIP)
        assert info.shown_bytes == truncate.utf8_len(head) + truncate.utf8_len(tail)
        assert info.shown_ranges[0] == (1, truncate.count_lines(head))
        assert info.shown_ranges[1][1] == info.total_lines
        assert info.shown_ranges[1][0] == info.total_lines - truncate.count_lines(tail) + 1
    else:
        assert info.shown_bytes == truncate.utf8_len(text)
        assert info.shown_lines == truncate.count_lines(text)
    if info.direction == "tail" and info.shown_lines:
        assert info.shown_ranges == (
            (info.total_lines - info.shown_lines + 1, info.total_lines),
        )
    if info.direction == "head" and info.shown_lines:
        assert info.shown_ranges == ((1, info.shown_lines),)
    if not info.truncated:
        assert info.limit is None


def _small_files() -> dict[str, bytes]:
    return {
        "empty": b"",
        "one line": b"hello\n",
        "no final newline": b"a\nb\nc",
        "3000 short lines": b"".join(b"line %d\n" % i for i in range(3000)),
        "single 60 KB line": b"x" * (60 * 1024),
        "multibyte": "é✓😀 text\n".encode() * 5000,
        "200 KB plain": b"".join(b"%07d\n" % i for i in range(25000)),
    }


@pytest.mark.parametrize("policy", _POLICIES, ids=repr)
@pytest.mark.parametrize("name", list(_small_files()))
def test_shape_small_file_is_the_pure_cut(tmp_path: Path, name: str, policy: Truncation) -> None:
    raw = _small_files()[name]
    path = _write(tmp_path, raw)
    shaped = shape(path, len(raw), _raw_lines(raw), policy, None)
    expected = _expected(raw, policy)
    assert shaped.text == expected.text
    assert shaped.info == expected.info
    _check_counts(shaped.text, shaped.info, raw, policy)


def test_shape_small_totals_are_raw_bytes_not_clean_text(tmp_path: Path) -> None:
    raw = b"".join(b"\x1b[32mok %d\x1b[0m\r\n" % i for i in range(3000))
    path = _write(tmp_path, raw)
    shaped = shape(path, len(raw), _raw_lines(raw), TailLines(), None)
    info = shaped.info
    assert info.total_bytes == len(raw)
    assert info.total_lines == 3000
    assert info.limit == "lines"
    assert shaped.text == "".join(f"ok {i}\n" for i in range(1000, 3000))
    assert info.shown_bytes == truncate.utf8_len(shaped.text)
    assert info.shown_ranges == ((1001, 3000),)
    _check_counts(shaped.text, info, raw, TailLines())


def test_shape_small_whole_output_is_clean_and_not_truncated(tmp_path: Path) -> None:
    raw = b"\x1b[1mbold\x1b[0m\r\nplain\n"
    path = _write(tmp_path, raw)
    shaped = shape(path, len(raw), 2, TailLines(), None)
    assert shaped.text == "bold\nplain\n"
    assert not shaped.info.truncated
    assert shaped.info.total_bytes == len(raw)
    assert shaped.info.shown_bytes == 11
    assert shaped.info.shown_ranges == ((1, 2),)


def test_shape_reads_only_the_first_size_bytes(tmp_path: Path) -> None:
    path = _write(tmp_path, b"one\ntwo\nthree\n")
    shaped = shape(path, 8, 2, TailLines(), None)
    assert shaped.text == "one\ntwo\n"
    assert (shaped.info.total_bytes, shaped.info.total_lines) == (8, 2)


def test_shape_redacts_secrets(tmp_path: Path) -> None:
    raw = b"password is hunter2hunter2\n" * 10
    path = _write(tmp_path, raw)
    shaped = shape(path, len(raw), 10, TailLines(), secret_pattern(["hunter2hunter2"]))
    assert "hunter2hunter2" not in shaped.text
    assert shaped.text == f"password is {REDACTED}\n" * 10


def test_shape_small_digest_lists_errors_of_the_cut_part(tmp_path: Path) -> None:
    lines = [b"ok %d\n" % i for i in range(3000)]
    lines[10] = b"error: first\n"
    lines[2999] = b"error: shown, not digested\n"
    raw = b"".join(lines)
    path = _write(tmp_path, raw)
    shaped = shape(path, len(raw), 3000, TailLines(), None, digest=True)
    assert shaped.digest == ("error: first",)
    assert shape(path, len(raw), 3000, TailLines(), None).digest == ()


def test_shape_small_middle_digest_is_the_snipped_part_only(tmp_path: Path) -> None:
    raw = b"error: head\n" + b"x\n" * 100 + b"error: cut\n" + b"y\n" * 100 + b"error: tail\n"
    path = _write(tmp_path, raw)
    policy = Middle(max_bytes=100, keep_bytes=20)
    shaped = shape(path, len(raw), _raw_lines(raw), policy, None, digest=True)
    assert shaped.digest == ("error: cut",)


# ---------------------------------------------------------------- huge files (> 1 MiB)


def _huge_files() -> dict[str, bytes]:
    numbered = b"".join(b"%08d some text\n" % i for i in range(80000))  # 1.36 MB
    colored = b"".join(b"\x1b[31m%08d\x1b[0m colored\r\n" % i for i in range(50000))
    wide = "é✓😀 wide line\n".encode() * 60000
    return {
        "numbered": numbered,
        "no final newline": numbered + b"last partial line",
        "colored CRLF": colored,
        "multibyte": wide,
        "one huge line": b"z" * (WHOLE_READ_LIMIT + 4321),
        "huge line then short": b"q" * (WHOLE_READ_LIMIT + 10) + b"\nshort\n",
    }


@pytest.fixture(scope="module")
def huge_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("huge")
    for index, raw in enumerate(_huge_files().values()):
        (directory / f"{index}.log").write_bytes(raw)
    return directory


@pytest.mark.parametrize("policy", _POLICIES, ids=repr)
@pytest.mark.parametrize("index", range(len(_huge_files())), ids=list(_huge_files()))
def test_shape_huge_file_counts_are_exact(huge_dir: Path, index: int, policy: Truncation) -> None:
    path = huge_dir / f"{index}.log"
    raw = path.read_bytes()
    assert len(raw) > WHOLE_READ_LIMIT
    followed = FollowedFile(path)
    followed.catch_up()
    assert (followed.offset, followed.lines) == (len(raw), _raw_lines(raw))
    shaped = shape(path, followed.offset, followed.lines, policy, None)
    info = shaped.info
    _check_counts(shaped.text, info, raw, policy)
    assert info.truncated
    assert info.limit is not None
    # The windows read give exactly what a whole read would have shown.
    expected = _expected(raw, policy)
    assert shaped.text == expected.text
    assert info == expected.info


def test_shape_huge_tail_digest(tmp_path: Path) -> None:
    lines = [b"fine %d\n" % i for i in range(150000)]
    lines[5] = b"Traceback (most recent call last):\n"
    lines[140000] = b"FAILED test_x\n"
    raw = b"".join(lines)
    assert len(raw) > WHOLE_READ_LIMIT
    path = _write(tmp_path, raw)
    shaped = shape(path, len(raw), 150000, TailLines(), None, digest=True)
    assert shaped.info.shown_ranges == ((148001, 150000),)
    assert shaped.digest == ("Traceback (most recent call last):", "FAILED test_x")


def test_shape_huge_middle_single_line_counts_it_once(tmp_path: Path) -> None:
    raw = b"m" * (2 * MIB)
    path = _write(tmp_path, raw)
    shaped = shape(path, len(raw), 1, Middle(), None)
    assert shaped.text == "m" * 4096 + truncate.SNIP + "m" * 4096
    assert shaped.info.shown_lines == 1
    assert shaped.info.shown_ranges == ((1, 1), (1, 1))
    assert shaped.info.partial_line


def test_shape_huge_middle_with_keep_larger_than_half(tmp_path: Path) -> None:
    # Head and tail windows would overlap: the file is read whole and cut once.
    raw = b"".join(b"%09d\n" % i for i in range(150000))  # 1.5 MB
    path = _write(tmp_path, raw)
    policy = Middle(max_bytes=1000, keep_bytes=MIB)
    shaped = shape(path, len(raw), 150000, policy, None)
    assert shaped.info.shown_bytes <= shaped.info.total_bytes
    assert shaped.info.shown_lines <= shaped.info.total_lines
    assert shaped.text == _expected(raw, policy).text


def test_shape_huge_escapes_only_output(tmp_path: Path) -> None:
    # Sanitizing removes almost everything: the shown text is what is left.
    raw = b"\x1b[0m" * (WHOLE_READ_LIMIT // 4 + 100) + b"\nthe end\n"
    path = _write(tmp_path, raw)
    shaped = shape(path, len(raw), 2, TailLines(), None)
    assert shaped.text == "\nthe end\n"
    assert not shaped.info.truncated  # the whole file was read, nothing left out
    assert shaped.info.total_bytes == len(raw)
    _check_counts(shaped.text, shaped.info, raw, TailLines())


# ----------------------------------------------------------------- shape properties

_raw_pieces = st.lists(
    st.one_of(
        st.sampled_from([b"\n", b"\r\n", b"\x1b[31m", b"\x1b[0m", b"\x00", b"\xe2\x9c\x93",
                         b"\xc3", b"error: x\n", b"\x1b]0;t\x07"]),
        st.binary(max_size=6),
        st.text(alphabet="ab é", max_size=12).map(str.encode),
    ),
    max_size=40,
).map(b"".join)
_small_policies = st.one_of(
    st.builds(TailLines, max_lines=st.integers(1, 8), max_bytes=st.integers(1, 60)),
    st.builds(ByteTail, max_bytes=st.integers(1, 60)),
    st.builds(CharCap, max_chars=st.integers(1, 60)),
    st.builds(Middle, max_bytes=st.integers(1, 60), keep_bytes=st.integers(1, 30)),
)


@settings(max_examples=150, deadline=None)
@given(_raw_pieces, _small_policies)
def test_shape_counts_add_up_on_any_bytes(raw: bytes, policy: Truncation) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), raw)
        shaped = shape(path, len(raw), _raw_lines(raw), policy, None, digest=True)
    _check_counts(shaped.text, shaped.info, raw, policy)
    clean = sanitize(raw)
    if not shaped.info.truncated:
        assert shaped.text == clean
    elif shaped.info.direction == "tail":
        assert clean.endswith(shaped.text)
    elif shaped.info.direction == "head":
        assert clean.startswith(shaped.text)


# ------------------------------------------------------------------- FollowedFile


def test_followed_file_counts_a_growing_file(tmp_path: Path) -> None:
    path = _write(tmp_path, b"")
    followed = FollowedFile(path)
    assert followed.catch_up() == 0
    written = b""
    for part in (b"one\ntw", b"o\n", b"x" * (3 * SMALL_CHUNK) + b"\nlast"):
        with path.open("ab") as handle:
            handle.write(part)
        written += part
        assert followed.catch_up() == len(part)
        assert (followed.offset, followed.lines) == (len(written), _raw_lines(written))
    assert followed.catch_up() == 0


def test_followed_file_budget_bounds_one_catch_up(tmp_path: Path) -> None:
    raw = b"y\n" * (5 * SMALL_CHUNK)
    followed = FollowedFile(_write(tmp_path, raw))
    first = followed.catch_up(budget=1)
    assert 0 < first < len(raw)
    followed.catch_up()
    assert (followed.offset, followed.lines) == (len(raw), _raw_lines(raw))


def test_small_output_is_shaped_from_what_was_read(tmp_path: Path) -> None:
    raw = b"a\nb\n"
    path = _write(tmp_path, raw)
    followed = FollowedFile(path)
    followed.catch_up()
    assert followed.source() == raw
    path.unlink()  # nothing needs the file any more
    shaped = shape(followed.source(), followed.offset, followed.lines, TailLines(), None)
    assert shaped.text == "a\nb\n"
    assert (shaped.info.total_bytes, shaped.info.total_lines) == (4, 2)


@pytest.mark.parametrize("size", [SMALL_CHUNK, SMALL_CHUNK + 1, WHOLE_READ_LIMIT + 1])
def test_followed_file_source_and_the_file_shape_alike(tmp_path: Path, size: int) -> None:
    raw = (b"0123456789abcde\n" * (size // 16 + 1))[:size]
    path = _write(tmp_path, raw)
    followed = FollowedFile(path)
    followed.catch_up()
    source = followed.source()
    assert source == (raw if size <= SMALL_CHUNK else path)
    for policy in (TailLines(), CharCap(), Middle(), ByteTail()):
        kept = shape(source, followed.offset, followed.lines, policy, None, digest=True)
        assert kept == shape(path, len(raw), _raw_lines(raw), policy, None, digest=True)


# ---------------------------------------------------------- the pi dialect's head / tail

SEQ = 100_000
SEQ_RAW = b"".join(b"%d\n" % n for n in range(1, SEQ + 1))  # 588,895 bytes


@pytest.mark.parametrize(
    ("asked", "shown"),
    [
        # Read whole (588,895 bytes): the newcomer's `head: 3` showed 91468-91470.
        ((1, 3, None), (1, 3, "head")),
        ((1, None, 3), (99_998, 100_000, "tail")),
        ((1, 10, 3), (8, 10, "middle")),
        ((1, 99_999, 2), (99_998, 99_999, "middle")),
        ((1, 200_000, 2), (99_999, 100_000, "tail")),
        # The sequence 4 times (2.4 MB): read in windows, lines where they are.
        ((4, 3, None), (1, 3, "head")),
        ((4, None, 3), (399_998, 400_000, "tail")),
        ((4, 10, 3), (8, 10, "middle")),
        ((4, 200_000, 2), (199_999, 200_000, "middle")),
        ((4, 500_000, 2), (399_999, 400_000, "tail")),
    ],
)
def test_head_and_tail_pick_lines_of_the_whole_output(
    tmp_path: Path, asked: tuple[int, int | None, int | None], shown: tuple[int, int, str]
) -> None:
    """`asked`: copies of the sequence, head, tail; `shown`: first and last line, the
    direction."""
    (copies, head, tail), (first, last, direction) = asked, shown
    raw = SEQ_RAW * copies
    path = _write(tmp_path, raw)
    shaped = shape(path, len(raw), SEQ * copies, ByteTail(), None, lines=(head, tail))
    assert shaped.text == "".join(f"{n % SEQ or SEQ}\n" for n in range(first, last + 1))
    info = shaped.info
    assert info.shown_ranges == ((first, last),)
    assert (info.total_lines, info.total_bytes) == (SEQ * copies, len(raw))
    assert (info.shown_lines, info.shown_bytes) == (last - first + 1, len(shaped.text))
    assert info.truncated and info.limit == "lines" and info.direction == direction


def test_a_head_past_the_byte_limit_is_cut_at_its_start(tmp_path: Path) -> None:
    path = _write(tmp_path, SEQ_RAW * 4)
    shaped = shape(path, 4 * len(SEQ_RAW), 4 * SEQ, ByteTail(), None, lines=(50_000, None))
    assert shaped.text.startswith("1\n2\n3\n")
    assert len(shaped.text.encode()) <= 50 * 1024
    info = shaped.info
    assert info.limit == "bytes" and info.direction == "head"
    assert info.shown_ranges == ((1, info.shown_lines),)
    last_shown = shaped.text.splitlines()[-1]
    assert str(info.shown_lines).startswith(last_shown) and info.partial_line


def test_no_head_or_tail_shapes_by_the_policy_as_before(tmp_path: Path) -> None:
    path = _write(tmp_path, SEQ_RAW)
    assert shape(path, len(SEQ_RAW), SEQ, ByteTail(), None) == \
        shape(path, len(SEQ_RAW), SEQ, ByteTail(), None, lines=(None, None))
