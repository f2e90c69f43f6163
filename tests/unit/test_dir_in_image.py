"""An image's WORKDIR or HOME made in a workspace's own layer only when the image has
not got it: where it has, the layer holds nothing of it (a copy there showed other
times and link counts than `docker exec`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from privilege import needs_root

from bashfleet.worker.engine import id_slots
from bashfleet.worker.engine.workspaces import disk

pytestmark = needs_root("owners of the layer's directories")

SLOT = id_slots.Slot(index=0, uid=200_000, gid=200_000, fd=-1)


def _image(tmp_path: Path) -> tuple[Path, Path]:
    image, upper = tmp_path / "image", tmp_path / "upper"
    (image / "work" / "src").mkdir(parents=True)
    (image / "root").mkdir()
    (image / "home").mkdir()
    (image / "linked").symlink_to("work")
    upper.mkdir()
    return image, upper


@pytest.mark.parametrize("path", ["/work", "/work/src", "/root", "/work/"])
def test_a_directory_the_image_has_is_not_made_again(tmp_path: Path, path: str) -> None:
    image, upper = _image(tmp_path)
    disk.make_dir_in_image(upper, str(image), path, SLOT)
    assert list(upper.iterdir()) == []


@pytest.mark.parametrize(("path", "made"), [
    ("/home/1000", ["home", "home/1000"]),
    ("/work/src/new/deeper", ["work", "work/src", "work/src/new", "work/src/new/deeper"]),
    ("/opt/app", ["opt", "opt/app"]),
])
def test_a_directory_the_image_lacks_is_made_with_its_owner(
        tmp_path: Path, path: str, made: list[str]) -> None:
    image, upper = _image(tmp_path)
    disk.make_dir_in_image(upper, str(image), path, SLOT, owner=(201_000, 201_000))
    assert sorted(str(p.relative_to(upper)) for p in upper.rglob("*")) == made
    # What the image has is copied up with its owner shifted; what it lacks is `owner`'s.
    leaf = upper / path.strip("/")
    assert (leaf.stat().st_uid, leaf.stat().st_gid) == (201_000, 201_000)
    first = upper / made[0]
    if (image / made[0]).is_dir():
        assert first.stat().st_uid == SLOT.uid + (image / made[0]).stat().st_uid


def test_a_link_on_the_way_is_left_alone(tmp_path: Path) -> None:
    image, upper = _image(tmp_path)
    disk.make_dir_in_image(upper, str(image), "/linked/x", SLOT)
    assert list(upper.iterdir()) == []
