"""The integrations' pure rules: the SWE-ReX server's pexpect matching, command quoting
and exit statuses, zip uploads (the options every integration shares:
test_integrations_backend.py). No framework is needed: these modules load SWE-ReX only
when the server runs."""

from __future__ import annotations

import re
import stat
import zipfile
from pathlib import Path

import pytest

from bashfleet.client.integrations.swerex_server import (
    command_text,
    earliest_match,
    status_of,
    unzip_with_modes,
)
from bashfleet.worker.wire.models import CallResult


@pytest.mark.parametrize(("patterns", "text", "expected"), [
    (["PS1"], "out\nPS1", (0, "out\n")),
    ([">>> ", "PS1"], "x>>> yPS1", (0, "x")),
    ([">>> ", "PS1"], "xPS1 >>> ", (1, "x")),
    (["a", "ab"], "zab", (0, "z")),              # a tie: the earlier pattern
    (["EXIT(\\d+)END"], "EXIT7END", (0, "")),   # regular expressions, as pexpect's
    (["nope"], "text", None),
])
def test_earliest_match_is_pexpects_choice(patterns: list[str], text: str,
                                           expected: tuple[int, str] | None) -> None:
    found = earliest_match([re.compile(p, re.DOTALL) for p in patterns], text)
    if expected is None:
        assert found is None
    else:
        assert found is not None
        assert (found[0], text[:found[1].start()]) == expected


@pytest.mark.parametrize(("command", "shell", "text"), [
    (["echo", "-n", "hello world"], False, "echo -n 'hello world'"),
    (["echo", "a'b"], True, "echo 'a'\"'\"'b'"),
    ("echo hi | wc -c", True, "echo hi | wc -c"),
    ("ls", False, "ls"),
    ("my program", False, "'my program'"),   # one program's name, as subprocess has it
])
def test_command_text_follows_subprocess(command: str | list[str], shell: bool,
                                         text: str) -> None:
    assert command_text(command, shell) == text


@pytest.mark.parametrize(("fields", "status"), [
    ({"exit_code": 0}, 0), ({"exit_code": 3}, 3), ({"signal": 9}, -9), ({}, None),
])
def test_status_of_is_subprocess_returncode(fields: dict[str, int], status: int | None) -> None:
    assert status_of(CallResult(call_id="c", host="h", **fields)) == status


def test_unzip_keeps_modes_and_stays_inside(tmp_path: Path) -> None:
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as made:
        tool = zipfile.ZipInfo("bin/tool")
        tool.external_attr = (stat.S_IFREG | 0o755) << 16
        made.writestr(tool, "#!/bin/sh\n")
        made.writestr("doc.txt", "d")
        escape = zipfile.ZipInfo("../outside.txt")
        escape.external_attr = (stat.S_IFREG | 0o777) << 16
        made.writestr(escape, "x")
    unzip_with_modes(archive, tmp_path / "tree")
    assert (tmp_path / "tree" / "bin" / "tool").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "tree" / "doc.txt").read_text() == "d"
    assert not (tmp_path / "outside.txt").exists()
    assert (tmp_path / "tree" / "outside.txt").read_text() == "x"  # zipfile drops `..`


