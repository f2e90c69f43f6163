"""Output: bounded memory for huge outputs, exact counts, sanitizing, streams, spill, limits."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bashfleet.worker import ByteTail, CharCap, Middle, Policy, TailLines
from bashfleet.worker.engine.output import truncate
from bashfleet.worker.engine.output.sanitize import sanitize
from bashfleet.worker.wire.models import Truncation

from .engine_helpers import (
    KILL,
    Engine,
    PeakRss,
    _engine_fixture,  # noqa: F401 - fixture
    _janitor_fixture,  # noqa: F401 - fixture
    spill_files,
)

GIB = 1024 * 1024 * 1024
MIB = 1024 * 1024


@pytest.mark.slow
def test_one_gib_of_output_with_bounded_memory(engine: Engine) -> None:
    # 512 Mi lines of "y\n": exactly one GiB.
    with PeakRss() as rss:
        result = engine.run(f"yes | head -c {GIB}", timeout_s=120)
    try:
        assert result.exit_code == 0, result
        assert rss.growth <= 64 * MIB, f"RSS grew by {rss.growth / MIB:.1f} MiB"

        assert result.spill is not None
        assert result.spill.stdout_path is not None
        assert os.stat(result.spill.stdout_path).st_size == GIB
        assert result.spill.stdout_bytes == GIB

        info = result.stdout_truncation
        assert info is not None
        assert (info.total_bytes, info.total_lines) == (GIB, GIB // 2)
        assert info.truncated
        assert info.limit == "lines"
        assert (info.shown_lines, info.shown_bytes) == (2000, 4000)
        assert info.shown_ranges == ((GIB // 2 - 1999, GIB // 2),)
        assert result.stdout == "y\n" * 2000
        assert result.stderr == ""
    finally:
        # A GiB is too much to leave to pytest's retention of old tmp dirs.
        if result.spill is not None and result.spill.stdout_path is not None:
            Path(result.spill.stdout_path).unlink(missing_ok=True)


def test_invalid_utf8_and_nul_bytes(engine: Engine) -> None:
    result = engine.run(
        r"printf 'a\xff\xfeb\x00c\n'; printf '\033[31mred\033[0m\r\n'; "
        r"printf 'caf\xc3\xa9 \xe2\x82\n' >&2"
    )
    assert result.exit_code == 0
    assert result.stdout == "a\ufffd\ufffdbc\nred\n"
    assert result.stderr == "caf\u00e9 \ufffd\n"
    assert "\x00" not in result.stdout


def test_megabytes_of_random_binary_output(engine: Engine) -> None:
    # Past the whole-read limit, through the windowed path: still no crash, valid text.
    result = engine.run("head -c 3000000 /dev/urandom; echo; echo END")
    assert result.exit_code == 0
    assert result.stdout.endswith("\nEND\n")
    assert "\x00" not in result.stdout
    result.stdout.encode("utf-8")  # a str that encodes: no lone surrogates
    info = result.stdout_truncation
    assert info is not None
    assert info.total_bytes == 3000000 + 5
    assert info.truncated


def test_ten_megabyte_single_line(engine: Engine) -> None:
    size = 10_000_000
    result = engine.run(f"head -c {size} /dev/zero | tr '\\0' 'x'")
    assert result.exit_code == 0
    info = result.stdout_truncation
    assert info is not None
    assert info.partial_line
    assert info.truncated
    assert info.limit == "bytes"
    assert (info.total_bytes, info.total_lines, info.shown_lines) == (size, 1, 1)
    assert 0 < info.shown_bytes <= 50 * 1024
    assert len(result.stdout) == info.shown_bytes
    assert set(result.stdout) == {"x"}


def test_combined_streams_interleave_in_order(engine: Engine) -> None:
    policy = Policy(streams="combined", on_timeout="kill")
    result = engine.run("echo 1; echo 2 >&2; echo 3; echo 4 >&2", policy=policy)
    assert result.combined
    assert result.stdout == "1\n2\n3\n4\n"
    assert result.stderr == ""
    assert result.stderr_truncation is None


def test_separate_streams_stay_apart(engine: Engine) -> None:
    result = engine.run("echo 1; echo 2 >&2; echo 3; echo 4 >&2")
    assert not result.combined
    assert (result.stdout, result.stderr) == ("1\n3\n", "2\n4\n")
    assert result.stdout_truncation is not None
    assert result.stderr_truncation is not None
    assert result.stdout_truncation.total_lines == 2
    assert result.stderr_truncation.total_bytes == 4


def _spill_files(engine: Engine, call_id: str) -> list[Path]:
    return spill_files(engine.settings, call_id)


def test_spill_removed_when_nothing_was_cut(engine: Engine) -> None:
    result = engine.run("seq 10; echo oops >&2")
    assert result.spill is None
    assert result.stdout_truncation is not None
    assert not result.stdout_truncation.truncated
    assert _spill_files(engine, result.call_id) == []


def test_spill_kept_when_cut(engine: Engine) -> None:
    expected = subprocess.run(["seq", "5000"], capture_output=True, check=True).stdout
    result = engine.run("seq 5000; echo err >&2")
    assert result.stdout_truncation is not None
    assert result.stdout_truncation.truncated
    assert result.stdout_truncation.limit == "lines"
    assert result.stdout == "".join(f"{n}\n" for n in range(3001, 5001))
    spill = result.spill
    assert spill is not None
    assert spill.host == "test"
    assert spill.stdout_path and spill.stderr_path
    assert Path(spill.stdout_path).read_bytes() == expected
    assert Path(spill.stderr_path).read_bytes() == b"err\n"
    assert (spill.stdout_bytes, spill.stderr_bytes) == (len(expected), 4)
    # Where the other tests look for spill files that must not be there.
    assert _spill_files(engine, result.call_id) == sorted(
        [Path(spill.stdout_path), Path(spill.stderr_path)]
    )


def test_a_kept_spill_file_is_read_by_the_next_call_of_its_workspace(engine: Engine) -> None:
    """The `Full output:` path a dialect shows is in the workspace's output directory,
    at the same path in its calls' view: the model's next call in the same session
    reads it (read-only: it cannot rewrite what it is shown)."""
    workspace = engine.workspace()
    cut = engine.run("seq 5000", workspace=workspace.id)
    assert cut.spill is not None and cut.spill.stdout_path is not None
    assert Path(cut.spill.stdout_path).parent == Path(workspace.out_dir)

    read = engine.run(f"wc -l < {cut.spill.stdout_path}; tail -n 1 {cut.spill.stdout_path}; "
                      f"echo x >> {cut.spill.stdout_path} || echo read-only",
                      workspace=workspace.id)
    assert read.error is None
    assert read.stdout == "5000\n5000\nread-only\n"
    assert Path(cut.spill.stdout_path).stat().st_size == cut.spill.stdout_bytes


def test_spill_kept_when_only_stderr_was_cut(engine: Engine) -> None:
    result = engine.run("echo out; seq 5000 >&2")
    assert result.stderr_truncation is not None and result.stderr_truncation.truncated
    assert result.spill is not None
    assert result.spill.stderr_path is not None
    assert Path(result.spill.stderr_path).stat().st_size == result.spill.stderr_bytes


def test_spill_not_kept_when_cut_output_is_under_spill_min_bytes(engine: Engine) -> None:
    # As the pipe dialect: the spill file only past 50 KB; `seq 5000` (23,893 bytes) is cut
    # by lines.
    policy = KILL.model_copy(update={"spill_min_bytes": 50 * 1024})
    result = engine.run("seq 5000", policy=policy)
    assert result.stdout_truncation is not None and result.stdout_truncation.truncated
    assert result.spill is None
    assert _spill_files(engine, result.call_id) == []

    bigger = engine.run("seq 20000", policy=policy)  # 108,894 bytes
    assert bigger.spill is not None
    assert bigger.spill.stdout_bytes == 108_894


def test_lifted_tail_limit(engine: Engine) -> None:
    lifting = KILL.model_copy(update={"lift_head_tail": True})
    result = engine.run("seq 100 | tail -n 3", policy=lifting)
    assert result.stdout == "98\n99\n100\n"
    # The command ran without its `tail`: the stream held all hundred lines.
    assert result.stdout_truncation is not None
    assert result.stdout_truncation.total_lines == 100

    head = engine.run("seq 100 | head -n 2", policy=lifting)
    assert head.stdout == "1\n2\n"
    assert head.stdout_truncation is not None
    assert head.stdout_truncation.total_lines == 100

    both = engine.run("seq 100 | head -n 10 | tail -n 2", policy=lifting)
    assert both.stdout == "9\n10\n"


def test_unlifted_pipe_runs_as_written(engine: Engine) -> None:
    result = engine.run("seq 100 | tail -n 3")
    assert result.stdout == "98\n99\n100\n"
    assert result.stdout_truncation is not None
    assert result.stdout_truncation.total_lines == 3


def test_explicit_head_and_tail_limits(engine: Engine) -> None:
    assert engine.run("seq 100", head=2).stdout == "1\n2\n"
    assert engine.run("seq 100", tail=2).stdout == "99\n100\n"
    assert engine.run("seq 100", head=10, tail=3).stdout == "8\n9\n10\n"


# Past the whole-read limit (1 MiB), shaping reads windows of the spill file; what it
# shows must be what the pure cut shows for the whole text, with the same counts.
BIG_SEQ = 300_000  # 1,988,895 bytes


@pytest.mark.parametrize(
    "policy",
    [
        TailLines(),
        TailLines(max_lines=10_000_000, max_bytes=50 * 1024),
        ByteTail(),
        CharCap(),
        Middle(),
    ],
    ids=["tail-lines", "tail-bytes", "byte-tail", "char-cap", "middle"],
)
def test_windowed_shaping_matches_the_whole_cut(engine: Engine, policy: Truncation) -> None:
    whole = subprocess.run(["seq", str(BIG_SEQ)], capture_output=True, check=True).stdout
    assert len(whole) > 1024 * 1024
    expected = truncate.apply(sanitize(whole), policy)
    result = engine.run(
        f"seq {BIG_SEQ}", policy=KILL.model_copy(update={"truncation": policy})
    )
    assert result.stdout == expected.text
    assert result.stdout_truncation == expected.info
