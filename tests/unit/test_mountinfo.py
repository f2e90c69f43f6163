"""Which mount holds a path (`mountinfo.holding`), and the hint a root worker gives at
start when its workspaces' layers are on ext4 (`layer_fs.plain_layers_hint`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bashfleet.worker.engine import mountinfo
from bashfleet.worker.engine.snapshots import layer_fs
from bashfleet.worker.settings import Settings

MOUNTINFO = """\
22 1 0:21 / / rw,relatime - ext4 /dev/vda rw
23 22 0:22 / /run rw,nosuid - tmpfs tmpfs rw
24 23 0:23 /bashfleet/ids /run/bashfleet/ids rw - tmpfs tmpfs rw
25 22 8:1 /volumes/state/_data /srv/state rw - xfs /dev/sdb1 rw
26 22 0:24 / /srv/own\\040dir rw - tmpfs tmpfs rw
27 22 0:25 / /srv/state/layers rw - btrfs /dev/sdc rw
28 22 0:26 / /run rw - tmpfs tmpfs rw
this line is garbled
"""


@pytest.mark.parametrize(
    ("path", "point", "root", "fs_type"),
    [
        ("/", "/", "/", "ext4"),
        ("/var/lib/bashfleet", "/", "/", "ext4"),
        ("/srv/state", "/srv/state", "/volumes/state/_data", "xfs"),
        ("/srv/state/workspace-state/w1", "/srv/state", "/volumes/state/_data", "xfs"),
        ("/srv/statefoo", "/", "/", "ext4"),  # a prefix of the name is not a parent
        ("/srv/state/layers/upper", "/srv/state/layers", "/", "btrfs"),
        ("/srv/own dir/x", "/srv/own dir", "/", "tmpfs"),  # octal escapes read back
        ("/run/user/0", "/run", "/", "tmpfs"),  # the later /run hides the earlier
        ("/run/bashfleet/ids", "/run/bashfleet/ids", "/bashfleet/ids", "tmpfs"),
    ],
)
def test_the_deepest_mount_holding_a_path_is_found(
    path: str, point: str, root: str, fs_type: str
) -> None:
    assert mountinfo.holding(MOUNTINFO, path) == mountinfo.MountEntry(point, root, fs_type)


def test_no_mount_listed_holds_nothing() -> None:
    assert mountinfo.holding("", "/var") is None
    assert mountinfo.holding("25 22 8:1 / /srv rw - xfs /dev/sdb1 rw\n", "/var") is None


def test_the_later_of_two_mounts_on_one_point_is_the_one_seen() -> None:
    text = "1 0 0:1 / /a rw - ext4 /dev/a rw\n2 1 0:2 / /a rw - xfs /dev/b rw\n"
    entry = mountinfo.holding(text, "/a/b")
    assert entry is not None and entry.fs_type == "xfs"


_segment = st.text(alphabet="abc", min_size=1, max_size=3)
_paths = st.lists(_segment, max_size=4).map(lambda parts: "/" + "/".join(parts))


@given(path=_paths, points=st.lists(_paths, max_size=6))
def test_the_mount_found_is_the_longest_listed_point_that_holds_the_path(
    path: str, points: list[str]
) -> None:
    text = "".join(f"{n} 1 0:{n} / {point} rw - fs{n} dev rw\n"
                   for n, point in enumerate(["/", *points]))
    entry = mountinfo.holding(text, path)
    assert entry is not None
    holders = [p for p in ["/", *points]
               if p in ("/", path) or path.startswith(p + "/")]
    assert entry.point in holders
    assert len(entry.point) == max(len(p) for p in holders)


def _settings(tmp_path: Path, **extra: object) -> Settings:
    return Settings(state_dir=tmp_path / "state", **extra)  # type: ignore[arg-type]


def _mounted_as(path: Path, fs_type: str) -> str:
    return f"1 0 0:1 / / rw - xfs /dev/a rw\n2 1 0:2 / {path} rw - {fs_type} /dev/b rw\n"


def test_a_root_worker_with_layers_on_ext4_is_told_of_the_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 0)
    settings = _settings(tmp_path)
    # The workspaces' directory is not made yet: the file system it will be made on.
    hint = layer_fs.plain_layers_hint(settings, _mounted_as(tmp_path.resolve(), "ext4"))
    assert hint is not None
    assert "BASHFLEET_LAYER_IMAGE_GB" in hint and str(settings.workspaces_dir) in hint


@pytest.mark.parametrize(
    ("fs_type", "euid", "image_gb"),
    [
        ("xfs", 0, None),  # extents shared, inodes reused: nothing to say
        ("btrfs", 0, None),
        ("ext4", 1000, None),  # not root: an image it could not mount
        ("ext4", 0, 8),  # asked for the image: `prepare` says what it did
    ],
)
def test_no_hint_where_the_image_would_not_help_or_was_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fs_type: str, euid: int,
    image_gb: int | None,
) -> None:
    monkeypatch.setattr("os.geteuid", lambda: euid)
    settings = _settings(tmp_path, layer_image_gb=image_gb)
    assert layer_fs.plain_layers_hint(settings, _mounted_as(tmp_path.resolve(), fs_type)) is None
