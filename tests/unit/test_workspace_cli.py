"""The pure parts of `bashfleet workspace` and `bashfleet cp`: which side of `cp` is a
workspace's, the options' parsing, and the table a person reads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bashfleet.client.cli import workspaces as workspace_cli
from bashfleet.client.cli.workspaces import Place, parse_place, workspace_table
from bashfleet.worker.wire.models import WorkspaceView

WS = "w0123456789abcde"


@pytest.mark.parametrize(
    ("text", "place"),
    [
        (f"{WS}:src", Place("src", WS)),
        (f"{WS}:/abs/path", Place("/abs/path", WS)),
        (f"{WS}:", Place(".", WS)),
        ("./local", Place("./local")),
        (f"./{WS}:x", Place(f"./{WS}:x")),  # a slash before the colon: a local path
        ("host:path", Place("host:path")),  # not a workspace id
        ("w012:x", Place("w012:x")),
        ("C:/x", Place("C:/x")),
    ],
)
def test_parse_place(text: str, place: Place) -> None:
    assert parse_place(text) == place


@given(st.text(min_size=1).filter(lambda text: ":" not in text))
def test_a_path_without_a_colon_is_local(text: str) -> None:
    assert parse_place(text) == Place(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (45, "45s"), (119.4, "119s"), (150, "2m"), (3600, "60m"), (7200, "2h"),
     (9000, "2h30m"), (86400, "24h"), (3 * 86400, "3d")],
)
def test_duration(seconds: float, text: str) -> None:
    assert workspace_cli._duration(seconds) == text


@pytest.mark.parametrize(
    ("count", "text"),
    [(None, "-"), (0, "0B"), (1023, "1023B"), (1024, "1.0KiB"), (5 * 1024**2, "5.0MiB"),
     (3 * 1024**3, "3.0GiB"), (4096 * 1024**3, "4096.0GiB")],
)
def test_size(count: int | None, text: str) -> None:
    assert workspace_cli._size(count) == text


@pytest.mark.parametrize(
    ("pairs", "limits"),
    [
        (None, {}),
        (["memory_mb=512", "cpus=1.5"], {"memory_mb": 512, "cpus": 1.5}),
        (["procs=10", "procs=20"], {"procs": 20}),
    ],
)
def test_limits(pairs: list[str] | None, limits: dict[str, float]) -> None:
    assert workspace_cli._limits(pairs) == limits


@pytest.mark.parametrize(
    ("pairs", "said"),
    [(["foo=1"], "no limit 'foo'"), (["procs=many"], "takes a number"),
     (["procs"], "takes NAME=VALUE"), (["=1"], "takes NAME=VALUE")],
)
def test_bad_limits_say_what_is_wrong(pairs: list[str], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        workspace_cli._limits(pairs)


def view(**fields: object) -> WorkspaceView:
    base: dict[str, object] = {
        "id": WS, "host": "h1", "path": f"/ws/{WS}", "isolation": "process", "network": "egress",
        "ttl_s": 3600.0, "created_at": 1000.0, "expires_at": 4600.0,
    }
    return WorkspaceView.model_validate({**base, **fields})


def test_the_table_says_when_each_expires_and_what_it_holds() -> None:
    table = workspace_table(
        [view(), view(id="wfedcba987654321", network="allow=pypi.org", session="s1", tags={"b": "2",
              "a": "1"}, expires_at=None, disk_bytes=2048, processes=3)],
        now=1000.0, counted=True,
    ).splitlines()
    assert table[0].split() == ["ID", "HOST", "PATH", "ISOLATION", "NETWORK", "EXPIRES",
                                "SESSION", "TAGS", "DISK", "PROCS"]
    assert table[1].split() == [WS, "h1", f"/ws/{WS}", "process", "egress", "in", "60m", "-",
                                "-", "-", "-"]
    assert table[2].split()[3:5] == ["process", "allow=pypi.org"]
    assert table[2].split()[-5:] == ["s1", "a=1", "b=2", "2.0KiB", "3"]
