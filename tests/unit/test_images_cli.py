"""The pure parts of `bashfleet images`: its parser, the table a person reads, the one
progress line a terminal shows."""

from __future__ import annotations

import io

from bashfleet.client.cli.arguments import build_parser
from bashfleet.client.cli.images import ProgressLine, image_table
from bashfleet.worker.wire.models import ImageInfo

DIGEST = "sha256:" + "0123456789ab" + "c" * 52


def test_the_verbs_and_their_options_parse() -> None:
    parser = build_parser()
    args = parser.parse_args(["images", "pull", "reg.example/a:1", "--host", "h", "--refresh"])
    assert (args.verb, args.ref, args.host, args.refresh, args.json) == (
        "pull", "reg.example/a:1", "h", True, False)
    assert parser.parse_args(["images", "ls", "--json"]).json
    assert parser.parse_args(["images", "rm", DIGEST]).ref == DIGEST


def test_the_table_shows_host_ref_short_digest_size_shell_user_and_last_use() -> None:
    infos = [ImageInfo.model_validate(fields) for fields in (
        {"ref": "reg.example/a:1", "digest": DIGEST, "host": "h1", "size_bytes": 3 * 1024**2,
         "shell": "sh", "user": "1000", "pulled_at": 100.0},
        {"ref": "reg.example/b:2", "digest": DIGEST, "host": "h2", "size_bytes": 10,
         "pulled_at": 0.0, "last_used_at": 3600.0},
    )]
    lines = image_table(infos, now=3700.0).splitlines()
    assert lines[0].split() == ["HOST", "IMAGE", "DIGEST", "SIZE", "SHELL", "USER", "USED"]
    assert lines[1].split() == ["h1", "reg.example/a:1", "0123456789ab", "3.0MiB", "sh",
                                "1000", "60m", "ago"]
    assert lines[2].split() == ["h2", "reg.example/b:2", "0123456789ab", "10B", "bash",
                                "root", "100s", "ago"]


def test_the_progress_line_is_rewritten_in_place_and_cleared() -> None:
    out = io.StringIO()
    line = ProgressLine(out)
    line.clear()
    assert out.getvalue() == ""  # nothing shown: nothing to clear
    line.show("h: pulling reg.example/a:1")
    line.show("h: " + "x" * 500)
    line.clear()
    text = out.getvalue()
    assert text.count("\r\x1b[K") == 3 and "\n" not in text
    assert max(len(part) for part in text.split("\r\x1b[K")) < 500
