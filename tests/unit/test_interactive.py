"""Pure parts of interactive sessions: the terminal filter of `attach`, which stdin counts
as piped, the rules that tell a process waits for input, the prompt, byte-exact reads."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bashfleet.client.attach import TerminalFilter
from bashfleet.client.foreground import piped_stdin
from bashfleet.worker.engine.jobs.interactive import _SYSCALLS, prompt_of, read_new, syscall_reads

X86 = _SYSCALLS["x86_64"]


@pytest.fixture
def pipe_ends() -> Iterator[tuple[int, int, tuple[int, int]]]:
    read_end, write_end = os.pipe()
    info = os.fstat(read_end)
    yield read_end, write_end, (info.st_dev, info.st_ino)
    os.close(read_end)
    os.close(write_end)


def test_terminal_filter_removes_control_strings_even_split() -> None:
    title = b"\x1b]0;pwned\x07"
    clipboard = b"\x1b]52;c;ZWNobyBoaQ==\x1b\\"
    dcs = b"\x1bP+q544e\x1b\\"
    colour = b"\x1b[31mred\x1b[0m"
    stream = b"a" + title + b"b" + clipboard + colour + dcs + b"\r\nend"
    for cut in range(len(stream) + 1):
        feed = TerminalFilter()
        shown = feed.feed(stream[:cut]) + feed.feed(stream[cut:])
        assert shown == b"ab" + colour + b"\r\nend", cut


@given(st.binary(max_size=200), st.integers(min_value=0, max_value=200))
def test_terminal_filter_never_lets_an_osc_through(data: bytes, cut: int) -> None:
    stream = data + b"\x1b]52;c;AAAA\x07" + data
    feed = TerminalFilter()
    shown = feed.feed(stream[:cut]) + feed.feed(stream[cut:])
    assert b"\x1b]52;c;AAAA" not in shown


def test_piped_stdin_kinds(tmp_path: Path, pipe_ends: tuple[int, int, tuple[int, int]]) -> None:
    read_end, _, _ = pipe_ends
    assert piped_stdin(read_end)
    with open(tmp_path / "f", "w+b") as handle:
        assert piped_stdin(handle.fileno())
    with open(os.devnull, "rb") as null:
        assert not piped_stdin(null.fileno())
    assert not piped_stdin(9999)  # closed


def test_syscall_rules(pipe_ends: tuple[int, int, tuple[int, int]]) -> None:
    read_end, _, stdin_id = pipe_ends
    me = os.getpid()
    other = os.open(os.devnull, os.O_RDONLY)
    table = [
        (0, [read_end, 0, 0], True),             # read(stdin)
        (0, [other, 0, 0], False),               # read of another file
        (23, [read_end + 1, 0, 0, 0], True),     # select, highest fd watched is stdin
        (23, [read_end + 5, 0, 0, 0], False),
        (230, [0, 0, 0, 0], False),              # clock_nanosleep: sleeping, not reading
        (288, [read_end, 0, 0], False),          # accept4
    ]
    for number, args, expected in table:
        padded = args + [0] * (6 - len(args))
        assert syscall_reads(me, number, padded, stdin_id, X86) is expected, (number, args)
    os.close(other)


def test_prompt_is_the_last_line_printed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.write_bytes(b"banner\r\n\x1b[1mName:\x1b[0m ")
    assert prompt_of(str(out), None) == "Name: "
    out.write_bytes(b"done\n\n")
    assert prompt_of(str(out), None) == "done"
    assert prompt_of(str(tmp_path / "missing"), None) == ""


@given(st.text(max_size=300), st.integers(min_value=1, max_value=64))
def test_reads_in_pieces_lose_and_repeat_nothing(text: str, size: int) -> None:
    data = text.encode()
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"bashfleet-read-{os.getpid()}"
    path.write_bytes(data)
    try:
        offset, pieces = 0, []
        for _ in range(len(data) + 2):
            got = read_new(str(path), offset, size, None, final=False)
            if got.end == offset and not got.more:
                break
            pieces.append(got.raw)
            offset = got.end
            if got.end == offset and got.more and not got.raw:
                break
        rest = read_new(str(path), offset, 1 << 20, None, final=True)
        assert b"".join(pieces) + rest.raw == data
    finally:
        path.unlink()


def test_raw_bytes_are_redacted_too() -> None:
    from bashfleet.worker.engine.jobs.interactive import redact_bytes  # noqa: PLC0415
    from bashfleet.worker.engine.output.sanitize import secret_pattern  # noqa: PLC0415

    pattern = secret_pattern(("hunter2-signing-key",))
    raw = b"\x1b[31mkey=hunter2-signing-key\xff\x1b[0m\r\n"
    shown = redact_bytes(raw, pattern)
    assert b"hunter2" not in shown and shown.startswith(b"\x1b[31mkey=") and b"\xff" in shown
    assert redact_bytes(raw, None) == raw
