"""A snapshot's layer through a real registry (Debian's docker-registry with TLS and basic
auth on 127.0.0.1: `registry.py`), with real skopeo and GNU tar, as root: every owner,
mode, extended attribute, whiteout, link and hole comes back as it went; a registry
down, a wrong password, a layer that is no snapshot or a hostile archive leave nothing
behind."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from privilege import needs_root

from bashfleet.worker.engine.images.image_meta import digest_of, parse_ref
from bashfleet.worker.engine.snapshots import snapshot_registry as snapshots
from bashfleet.worker.engine.snapshots.snapshot_registry import RegistryError
from bashfleet.worker.settings import Settings

from .registry import Registry, free_port, run

pytestmark = [
    pytest.mark.timeout(300),
    needs_root("a layer's owners and whiteouts need root"),
]

MTIME_NS = 1_700_000_000_123_456_789
#: Names that only C-quoting carries through a listing whole.
ODD_NAMES = [b"a name with spaces", b'quote"and\\backslash', b"new\nline", b"latin1-\xe9\xff"]


@pytest.fixture
def settings(image_registry: Registry, tmp_path: Path) -> Settings:
    return image_registry.settings(
        tmp_path / "state", snapshot_registry=f"{image_registry.url}/bashfleet/snapshots")


def _ref(settings: Settings, name: str) -> str:
    ref = snapshots.snapshot_ref(settings, name)
    assert ref is not None
    return ref


# ------------------------------------------------------------------- a layer by hand


def make_layer(layer: Path) -> None:
    """An overlay upper layer as a snapshot holds it: the subdirectories of a workspace's
    layer, files of several owners, setuid, a whiteout, an opaque directory, extended
    attributes, hard links, symlinks, a sparse file, a FIFO, a sticky empty directory."""
    layer.mkdir(mode=0o755)
    for name in ("root", "top.usr", "top.etc", "home", "tmp", "vartmp", "work"):
        (layer / name).mkdir()
    _file(layer / "root/owned-by-root", b"root\n", 0, 0, 0o644)
    _file(layer / "home/user-file", b"user\n" * 100, 1000, 1000, 0o600)
    _file(layer / "work/nobody", b"nobody", 65534, 65534, 0o640)
    _file(layer / "top.usr/setuid", b"\x7fELF pretend", 0, 0, 0o4755)
    _file(layer / "top.usr/setgid", b"g", 0, 50, 0o2711)
    os.mknod(layer / "top.etc/deleted", stat.S_IFCHR, os.makedev(0, 0))  # a whiteout
    opaque = layer / "top.etc/opaque"
    opaque.mkdir(mode=0o750)
    os.setxattr(opaque, "trusted.overlay.opaque", b"y")
    os.setxattr(layer / "top.etc", "trusted.overlay.impure", b"y")
    _file(opaque / "inside", b"new", 0, 0, 0o644)
    os.setxattr(layer / "home/user-file", "user.x", b"some value\x00with a nul")
    os.link(layer / "home/user-file", layer / "work/hardlink-to-user-file")
    (layer / "root/abs-link").symlink_to("/etc/passwd")  # inside a workspace: its own
    (layer / "top.usr/rel-link").symlink_to("../top.etc/opaque/inside")
    os.lchown(layer / "top.usr/rel-link", 1000, 1000)
    with open(layer / "work/sparse", "wb") as handle:
        handle.seek(8 * 1024 * 1024)
        handle.write(b"end")
    os.mkfifo(layer / "tmp/fifo", 0o620)
    (layer / "tmp/sticky").mkdir()
    os.chmod(layer / "tmp/sticky", 0o1777)  # noqa: S103 (a workspace's /tmp is)
    for odd in ODD_NAMES:
        _file(Path(os.fsdecode(bytes(layer / "work") + b"/" + odd)), odd, 0, 0, 0o644)
    for folder, dirs, files in os.walk(layer, topdown=False):
        for name in (*dirs, *files):
            os.utime(os.path.join(folder, name), ns=(MTIME_NS, MTIME_NS),
                     follow_symlinks=False)
    os.utime(layer, ns=(MTIME_NS, MTIME_NS))


def _file(path: Path, data: bytes, uid: int, gid: int, mode: int) -> None:
    path.write_bytes(data)
    os.chown(path, uid, gid)
    os.chmod(path, mode)


def listing(root: Path) -> dict[str, dict[str, Any]]:
    """Everything a layer is, path by path: type, mode, owner, size, content, device,
    extended attributes, link target, mtime, and which paths share an inode."""
    found: dict[str, dict[str, Any]] = {}
    inodes: dict[tuple[int, int], list[str]] = {}
    for folder, dirs, files in os.walk(root):
        for name in ["", *dirs, *files] if folder == str(root) else [*dirs, *files]:
            path = os.path.join(folder, name) if name else folder
            relative = os.path.relpath(path, root)
            info = os.lstat(path)
            inodes.setdefault((info.st_dev, info.st_ino), []).append(relative)
            found[relative] = _entry(path, info)
    for paths in inodes.values():
        for relative in paths:
            found[relative]["links"] = sorted(paths)
    return found


def _entry(path: str, info: os.stat_result) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "type": stat.S_IFMT(info.st_mode), "mode": oct(stat.S_IMODE(info.st_mode)),
        "uid": info.st_uid, "gid": info.st_gid, "mtime_ns": info.st_mtime_ns,
        "xattrs": {name: os.getxattr(path, name, follow_symlinks=False)
                   for name in sorted(os.listxattr(path, follow_symlinks=False))},
    }
    if stat.S_ISREG(info.st_mode):
        with open(path, "rb") as handle:
            entry["sha256"] = hashlib.file_digest(handle, "sha256").hexdigest()
        entry["size"] = info.st_size
    elif stat.S_ISLNK(info.st_mode):
        entry["target"] = os.readlink(path)
    elif stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
        entry["rdev"] = (os.major(info.st_rdev), os.minor(info.st_rdev))
    return entry


def leftovers(folder: Path, *keep: str) -> list[str]:
    """What a directory holds besides `keep` (a pull's scratch left behind would show)."""
    return sorted(name for name in os.listdir(folder) if name not in keep)


# ------------------------------------------------------------------ push and pull


def test_a_layer_comes_back_exactly_as_it_was_pushed(settings: Settings,
                                                     tmp_path: Path) -> None:
    layer = tmp_path / "snap" / "layer"
    layer.parent.mkdir()
    make_layer(layer)
    ref = _ref(settings, "exact")
    pushed = snapshots.push(layer, ref, settings, annotations={"base": "debian", "n": "1"})
    dest = tmp_path / "other-host" / "layer"
    dest.parent.mkdir()
    pulled = snapshots.pull(ref, dest, settings)
    assert pulled == pushed and pulled.startswith("sha256:")
    assert listing(dest) == listing(layer)
    assert os.lstat(dest / "work/sparse").st_blocks * 512 < 1024 * 1024  # holes kept
    assert leftovers(layer.parent, "layer") == [] and leftovers(dest.parent, "layer") == []


def test_the_registry_holds_a_snapshot_artifact(settings: Settings, image_registry: Registry,
                                                tmp_path: Path) -> None:
    layer = tmp_path / "layer"
    layer.mkdir()
    (layer / "f").write_text("x")
    ref = _ref(settings, "artifact")
    digest = snapshots.push(layer, ref, settings, annotations={"base": "debian"})
    flags = ["--authfile", str(image_registry.auth_file), "--cert-dir",
             str(image_registry.certs_dir)]
    raw = run("skopeo", "inspect", "--raw", *flags, f"docker://{ref}").encode()
    manifest = json.loads(raw)
    assert digest_of(raw) == digest
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert manifest["artifactType"] == "application/vnd.bashfleet.snapshot.v1"
    assert manifest["config"]["mediaType"] == "application/vnd.bashfleet.snapshot.config.v1+json"
    assert [layer["mediaType"] for layer in manifest["layers"]] == [
        "application/vnd.bashfleet.snapshot.layer.v1.tar+zstd"]
    config = json.loads(run("skopeo", "inspect", "--config", "--raw", *flags, f"docker://{ref}"))
    assert config == {"annotations": {"base": "debian"}, "tag": "artifact"}


def test_pulling_twice_is_fine_and_never_replaces_a_layer(settings: Settings,
                                                          tmp_path: Path) -> None:
    layer = tmp_path / "layer"
    make_layer(layer)
    ref = _ref(settings, "twice")
    digest = snapshots.push(layer, ref, settings)
    first, second = tmp_path / "first", tmp_path / "second"
    assert snapshots.pull(ref, first, settings) == digest
    assert snapshots.pull(ref, second, settings) == digest
    assert listing(first) == listing(second) == listing(layer)
    (first / "work" / "changed").write_text("kept")
    with pytest.raises(RegistryError) as caught:
        snapshots.pull(ref, first, settings)
    assert caught.value.kind == "invalid" and "exists already" in caught.value.message
    assert (first / "work" / "changed").read_text() == "kept"
    assert leftovers(tmp_path, "layer", "first", "second", "state") == []


def test_pull_by_digest(settings: Settings, tmp_path: Path) -> None:
    layer = tmp_path / "layer"
    layer.mkdir()
    (layer / "f").write_text("x")
    ref = _ref(settings, "by-digest")
    digest = snapshots.push(layer, ref, settings)
    pinned = f"{ref.rpartition(':')[0]}@{digest}"
    assert snapshots.pull(pinned, tmp_path / "dest", settings) == digest
    assert (tmp_path / "dest" / "f").read_text() == "x"


def test_delete(settings: Settings, tmp_path: Path) -> None:
    layer = tmp_path / "layer"
    layer.mkdir()
    ref, other = _ref(settings, "to-delete"), _ref(settings, "same-content")
    snapshots.push(layer, ref, settings)
    snapshots.push(layer, other, settings)  # the same layer: a manifest of its own
    assert snapshots.delete(ref, settings) is True
    assert snapshots.delete(ref, settings) is False
    with pytest.raises(RegistryError) as caught:
        snapshots.pull(ref, tmp_path / "dest", settings)
    assert caught.value.kind == "not_found"
    assert not os.path.lexists(tmp_path / "dest")
    snapshots.pull(other, tmp_path / "dest", settings)  # untouched by the delete


def test_push_refuses_what_is_no_layer_or_no_tag(settings: Settings, tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="no snapshot layer directory") as caught:
        snapshots.push(tmp_path / "missing", _ref(settings, "x"), settings)
    assert caught.value.kind == "invalid"
    (tmp_path / "layer").mkdir()
    with pytest.raises(RegistryError, match="to a tag, not a digest"):
        snapshots.push(tmp_path / "layer", f"127.0.0.1:1/s@sha256:{'0' * 64}", settings)
    with pytest.raises(RegistryError, match="no directory"):
        snapshots.pull(_ref(settings, "x"), tmp_path / "no" / "dest", settings)


# ------------------------------------------------------------------------ failures


def test_a_registry_down_is_named_and_leaves_nothing(settings: Settings,
                                                     tmp_path: Path) -> None:
    down = settings.model_copy(update={"snapshot_registry": f"127.0.0.1:{free_port()}/s"})
    ref = _ref(down, "down")
    layer = tmp_path / "layer"
    make_layer(layer)
    for attempt in (lambda: snapshots.push(layer, ref, down),
                    lambda: snapshots.pull(ref, tmp_path / "dest", down),
                    lambda: snapshots.delete(ref, down)):
        with pytest.raises(RegistryError) as caught:
            attempt()
        message = caught.value.message
        assert caught.value.kind == "unavailable", message
        assert ref.split("/")[0] in message and "connection refused" in message, message
        assert "\n" not in message and len(message) < 800
    assert leftovers(tmp_path, "layer", "state") == []


def test_wrong_credentials_are_refused_without_showing_them(
    settings: Settings, image_registry: Registry, tmp_path: Path
) -> None:
    wrong = image_registry.write_auth_file(tmp_path / "wrong.json", "not-the-password-42")
    refused = settings.model_copy(update={"registry_auth_file": wrong})
    layer = tmp_path / "layer"
    layer.mkdir()
    with pytest.raises(RegistryError) as caught:
        snapshots.push(layer, _ref(refused, "refused"), refused)
    assert caught.value.kind == "unavailable"
    assert "credentials" in caught.value.message and image_registry.url in caught.value.message
    assert "not-the-password-42" not in caught.value.message
    assert json.loads(wrong.read_text())["auths"][image_registry.url]["auth"] \
        not in caught.value.message


def test_an_image_is_no_snapshot(settings: Settings, image_registry: Registry,
                                 tmp_path: Path) -> None:
    archive = _tar([_regular("f", b"x")])
    ref = _push_by_hand(image_registry, tmp_path, "image", archive,
                        layer_type="application/vnd.oci.image.layer.v1.tar+zstd",
                        config_type="application/vnd.oci.image.config.v1+json")
    with pytest.raises(RegistryError, match="is no snapshot") as caught:
        snapshots.pull(ref, tmp_path / "dest", settings)
    assert caught.value.kind == "invalid"
    assert leftovers(tmp_path, "state", "by-hand") == []


def test_a_layer_whose_digest_does_not_match_is_refused(tmp_path: Path) -> None:
    layer = tmp_path / "layer"
    layer.mkdir()
    blob = tmp_path / "blob"
    blob.write_bytes(b"not really a tar")
    layout = tmp_path / "layout"
    snapshots._write_layout(layout, blob, b"{}")
    (stored,) = [p for p in (layout / "blobs/sha256").iterdir() if p.stat().st_size == 16]
    stored.write_bytes(b"NOT really a tar")  # same size, other bytes
    wanted = parse_ref("127.0.0.1:1/s:x")
    with pytest.raises(RegistryError, match="does not match the digest") as caught:
        snapshots._layer_of(layout, wanted)
    assert caught.value.kind == "invalid"


def test_a_full_disk_leaves_nothing(settings: Settings, tmp_path: Path) -> None:
    layer = tmp_path / "layer"
    layer.mkdir()
    (layer / "random").write_bytes(os.urandom(2 * 1024 * 1024))  # incompressible
    ref = _ref(settings, "big")
    snapshots.push(layer, ref, settings)
    small = tmp_path / "small"
    small.mkdir()
    with _tmpfs(small, "3m"):
        with pytest.raises(RegistryError) as caught:
            snapshots.pull(ref, small / "dest", settings)
        assert caught.value.kind == "unavailable"
        assert "MiB free in" in caught.value.message, caught.value.message
        assert leftovers(small) == []


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[None]:
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                           str(path)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)


# ---------------------------------------------------------------- hostile layers


def _regular(name: str, data: bytes = b"evil") -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _special(name: str, kind: bytes, target: str = "", device: tuple[int, int] = (0, 0)
             ) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, target, 0o777
    info.devmajor, info.devminor = device
    return info, None


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    """A zstd-compressed tar of `members`, written by Python (a registry writer's own)."""
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w", format=tarfile.PAX_FORMAT) as archive:
        archive.addfile(_special("./", tarfile.DIRTYPE)[0])
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return subprocess.run(["zstd", "-q", "-c"], input=plain.getvalue(), capture_output=True,
                          check=True).stdout


def _push_by_hand(registry: Registry, tmp_path: Path, tag: str, archive: bytes, *,
                  layer_type: str = snapshots.LAYER_MEDIA_TYPE,
                  config_type: str = snapshots.CONFIG_MEDIA_TYPE) -> str:
    """Push `archive` as a one-layer manifest, with skopeo and no help from the module."""
    layout = tmp_path / "by-hand" / tag
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes, media_type: str) -> dict[str, Any]:
        (blobs / digest_of(data).removeprefix("sha256:")).write_bytes(data)
        return {"mediaType": media_type, "digest": digest_of(data), "size": len(data)}

    manifest = json.dumps({"schemaVersion": 2, "mediaType": snapshots.OCI_MANIFEST,
                           "config": put(b"{}", config_type),
                           "layers": [put(archive, layer_type)]}).encode()
    entry = put(manifest, snapshots.OCI_MANIFEST)
    entry["annotations"] = {"org.opencontainers.image.ref.name": tag}
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
    ref = registry.push(layout, tag, f"bashfleet/snapshots:{tag}")
    shutil.rmtree(tmp_path / "by-hand")
    return ref


Hostile = Callable[[Path], list[tuple[tarfile.TarInfo, bytes | None]]]

#: Archives aimed at `outside` (a directory three levels above where tar unpacks: a
#: pull's tree is `<dests>/.dest.pull-<hex>/tree`, so `../../../outside` reaches it).
HOSTILE: dict[str, Hostile] = {
    "dot-dot": lambda outside: [_regular("../evil"), _regular("ok/../../evil")],
    "absolute": lambda outside: [_regular(f"{outside}/evil")],
    "through-a-symlink": lambda outside: [_special("a", tarfile.SYMTYPE, str(outside)),
                                          _regular("a/evil")],
    "through-a-relative-symlink": lambda outside: [
        _special("a", tarfile.SYMTYPE, "../../../outside"), _regular("a/evil")],
    "through-a-symlink-chain": lambda outside: [
        _special("b", tarfile.SYMTYPE, str(outside)), _special("a", tarfile.SYMTYPE, "b"),
        _regular("a/evil")],
    "symlink-replaced-directory": lambda outside: [
        _special("a", tarfile.DIRTYPE), _special("a", tarfile.SYMTYPE, str(outside)),
        _regular("a/evil")],
    "hard-link-out": lambda outside: [
        _special("h", tarfile.LNKTYPE, f"{outside}/target"),
        _special("g", tarfile.LNKTYPE, "../../../outside/target")],
    "device": lambda outside: [_special("mem", tarfile.CHRTYPE, device=(1, 1))],
}


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the pull's destination, which a hostile layer aims at."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "target").write_text("must stay")
    return path


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_layer_is_refused_and_writes_nothing(
    case: str, settings: Settings, image_registry: Registry, tmp_path: Path, outside: Path
) -> None:
    ref = _push_by_hand(image_registry, tmp_path, case, _tar(HOSTILE[case](outside)))
    dests = tmp_path / "dests"
    dests.mkdir()
    with pytest.raises(RegistryError, match="refused to unpack") as caught:
        snapshots.pull(ref, dests / "dest", settings)
    assert caught.value.kind == "invalid"
    assert leftovers(dests) == []
    assert leftovers(outside) == ["target"] and (outside / "target").read_text() == "must stay"
    assert os.stat(outside / "target").st_nlink == 1
    assert not (tmp_path / "evil").exists() and not Path("/evil").exists()


@pytest.mark.parametrize("case", sorted(set(HOSTILE) - {"symlink-replaced-directory",
                                                       "device"}))
def test_tar_alone_keeps_a_hostile_layer_inside_too(case: str, tmp_path: Path,
                                                    outside: Path) -> None:
    """The second guard: the extraction the module runs, given the archive without the
    member checks, still writes nothing outside its directory."""
    blob = tmp_path / "blob"
    blob.write_bytes(_tar(HOSTILE[case](outside)))
    tree = tmp_path / "dests" / "pull" / "tree"
    tree.mkdir(parents=True)
    # It fails (a member skipped, a link refused) or, for an absolute name, unpacks it
    # under `tree`: either way, inside.
    subprocess.run(snapshots.extract_argv(blob, "zstd", tree), capture_output=True,
                   check=False)
    assert leftovers(outside) == ["target"] and (outside / "target").read_text() == "must stay"
    assert os.stat(outside / "target").st_nlink == 1
    assert not (tmp_path / "evil").exists() and not Path("/evil").exists()
