"""bash's command line: a command that fits one argv string is `-c COMMAND`; a longer one
is read from a descriptor holding its exact bytes."""

from __future__ import annotations

import os

from bashfleet.worker.engine.isolate.command_line import (
    ARGUMENT_MAX,
    COMMAND_FD,
    CommandLine,
    reader,
)


def test_a_command_that_fits_is_the_c_argument() -> None:
    command = "x" * ARGUMENT_MAX
    line = CommandLine(["bash", "-l"], command)
    assert (line.argv, line.fd) == (["bash", "-l", "-c", command], None)


def test_a_longer_command_is_read_from_a_descriptor() -> None:
    command = "é" * (ARGUMENT_MAX // 2 + 1)  # fits in characters, not in bytes
    line = CommandLine(["/bin/bash"], command, fd_in_child=COMMAND_FD)
    try:
        assert line.fd is not None
        assert line.argv == ["/bin/bash", "-c", reader(COMMAND_FD), "/bin/bash"]
        assert os.pread(line.fd, 2 * ARGUMENT_MAX, 0) == command.encode()
        assert os.lseek(line.fd, 0, os.SEEK_CUR) == 0, "bash reads it from the start"
    finally:
        line.close()
    assert line.fd is None


def test_a_process_list_names_a_command_read_from_a_descriptor() -> None:
    from bashfleet.worker.engine.isolate.command_line import read_from_descriptor  # noqa: PLC0415
    from bashfleet.worker.engine.procs import shown_args  # noqa: PLC0415

    line = CommandLine(["bash"], "x" * (ARGUMENT_MAX + 1), fd_in_child=COMMAND_FD)
    try:
        assert read_from_descriptor(line.argv[2])
        assert shown_args(line.argv) == [
            "bash", "-c", "<its command, past 128 KiB, read from a descriptor>"]
    finally:
        line.close()
    assert not read_from_descriptor("IFS= read -r -d '' -u 3 x; echo hi")
    assert shown_args(["bash", "-c", "echo hi"]) == ["bash", "-c", "echo hi"]
