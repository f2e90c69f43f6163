"""Images on a host, with real parts: a real registry (TLS, basic auth) on 127.0.0.1,
real skopeo, umoci and buildah, images made on this machine (`registry.py`)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bashfleet.worker.engine.images import images
from bashfleet.worker.engine.images.image_meta import ImageError, digest_of, parse_ref
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import ImageInfo, WorkspaceRecord

from .registry import (
    Registry,
    free_port,
    image_layout,
    pushed_images,
    run,
    running_registry,
)

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A fresh state directory: an empty image store."""
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    return path


def _lines() -> tuple[list[str], images.Progress]:
    said: list[str] = []
    return said, said.append


def _pulls(said: list[str]) -> int:
    """How many pulls a progress log shows (each says `pulling <ref>` once)."""
    return sum(1 for line in said if line.startswith("pulling "))


# ---------------------------------------------------------------------------- pulls


def test_pull_by_tag_unpacks_the_image_as_it_is(
    image_registry: Registry, registry_images: dict[str, str], state: Path
) -> None:
    settings = image_registry.settings(state)
    said, progress = _lines()
    info, root = images.ensure(registry_images["debian"], settings, progress)
    assert info.digest.startswith("sha256:") and info.ref == registry_images["debian"]
    assert (root / "etc" / "debian_version").read_text().startswith("12")
    assert info.shell == "bash" and info.env[0].startswith("PATH=/usr/local/sbin")
    assert info.size_bytes > 50_000_000 and info.host == settings.host
    assert root == state / "images" / "rootfs" / info.digest.removeprefix("sha256:")
    # The image's own ids and special bits, none shifted: chage is root:shadow, setgid.
    chage = os.lstat(root / "usr" / "bin" / "chage")
    assert (chage.st_uid, chage.st_gid) == (0, 42) and chage.st_mode & stat.S_ISGID
    assert os.lstat(root / "usr" / "bin" / "passwd").st_mode & stat.S_ISUID
    for private in (state / "images", state / "images" / "rootfs"):
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert any("Copying blob" in line for line in said)


def test_pull_by_digest_and_a_second_pull_is_a_cache_hit_without_the_registry(
    tmp_path: Path, state: Path
) -> None:
    with running_registry(tmp_path / "own-registry") as registry:
        ref = pushed_images(registry)["debian"]
        settings = registry.settings(state)
        info, _ = images.ensure(ref, settings)
        by_digest = f"{registry.url}/bashfleet/debian@{info.digest}"
        said, progress = _lines()
        same, _ = images.ensure(by_digest, settings, progress)
        assert same.digest == info.digest and _pulls(said) == 0
    # The registry is gone: what the host holds is answered all the same.
    again, root = images.ensure(ref, settings)
    assert again.digest == info.digest and root.is_dir()
    assert images.ensure(by_digest, settings)[0].ref == by_digest
    with pytest.raises(ImageError) as caught:
        images.ensure(ref, settings, refresh=True)  # asking the registry: it is down
    assert caught.value.kind == "unavailable" and "connection refused" in caught.value.message


def test_a_held_image_is_answered_without_writing_its_reference_again(
    image_registry: Registry, registry_images: dict[str, str], state: Path
) -> None:
    settings = image_registry.settings(state)
    ref = registry_images["debian"]
    info, _ = images.ensure(ref, settings)
    ref_file = images.Store(settings).ref_file(parse_ref(ref).canonical)
    before = ref_file.stat()
    assert json.loads(ref_file.read_text())["digest"] == info.digest
    again, _ = images.ensure(ref, settings)
    after = ref_file.stat()
    assert again.digest == info.digest
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    # A file that names another digest is written again: what the reference names
    # here is what it was last resolved to.
    ref_file.write_text(json.dumps({"ref": parse_ref(ref).canonical,
                                    "digest": "sha256:" + "0" * 64}))
    images.ensure(ref, settings, refresh=True)
    assert json.loads(ref_file.read_text())["digest"] == info.digest


def test_pull_by_digest_never_pulled_by_tag(
    image_registry: Registry, registry_images: dict[str, str], state: Path, tmp_path: Path
) -> None:
    first = images.ensure(registry_images["nobash"], image_registry.settings(tmp_path / "o"))[0]
    ref = f"{image_registry.url}/bashfleet/nobash@{first.digest}"
    info, root = images.ensure(ref, image_registry.settings(state))
    assert info.digest == first.digest and info.shell == "sh" and (root / "bin" / "sh").is_symlink()


def test_a_docker_format_image_is_held_by_its_registry_digest(
    image_registry: Registry, state: Path
) -> None:
    ref = image_registry.push(image_layout(), "user", "bashfleet/docker-format:1",
                              docker_format=True)
    settings = image_registry.settings(state)
    raw = run("skopeo", "inspect", "--raw", "--authfile", str(image_registry.auth_file),
              "--cert-dir", str(image_registry.certs_dir), f"docker://{ref}")
    assert "vnd.docker.distribution.manifest.v2" in raw
    info, root = images.ensure(ref, settings)
    # Pinned by what the registry serves, though skopeo stored it as an OCI manifest.
    assert info.digest == digest_of(raw.encode())
    assert (info.user, info.workdir) == ("1000", "/work") and (root / "etc").is_dir()
    assert images.ensure(f"{image_registry.url}/bashfleet/docker-format@{info.digest}",
                         settings)[0].digest == info.digest
    assert images.sweep(settings)  # its blobs are named by it: none goes
    blobs = state / "images" / "blobs" / "sha256"
    assert len(list(blobs.iterdir())) == 3  # its manifest (as stored), config, layer
    assert images.remove(ref, settings, set()) and images.sweep(settings)
    assert list(blobs.iterdir()) == []


def test_an_image_without_bash_falls_back_to_sh_and_config_fields_are_read(
    image_registry: Registry, registry_images: dict[str, str], state: Path
) -> None:
    settings = image_registry.settings(state)
    nobash, _ = images.ensure(registry_images["nobash"], settings)
    assert nobash.shell == "sh"  # its /bin/bash points at a path only the host has
    user, _ = images.ensure(registry_images["user"], settings)
    assert (user.user, user.workdir, user.shell) == ("1000", "/work", "bash")
    assert "GREETING=hello" in user.env


def test_concurrent_ensures_in_threads_pull_once(
    image_registry: Registry, registry_images: dict[str, str], state: Path
) -> None:
    settings = image_registry.settings(state)
    said: list[str] = []
    lock = threading.Lock()

    def progress(line: str) -> None:
        with lock:
            said.append(line)

    results: list[ImageInfo] = []
    errors: list[BaseException] = []

    def pull() -> None:
        try:
            results.append(images.ensure(registry_images["debian"], settings, progress)[0])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=pull) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert errors == [] and len(results) == 4
    assert len({info.digest for info in results}) == 1
    assert _pulls(said) == 1


_PULL_SCRIPT = """
import sys
from pathlib import Path
from bashfleet.worker.settings import Settings
from bashfleet.worker.engine.images import images
settings = Settings(state_dir=Path(sys.argv[1]), registry_auth_file=Path(sys.argv[2]),
                    registry_certs_dir=Path(sys.argv[3]))
info, root = images.ensure(sys.argv[4], settings, lambda line: print(line, flush=True))
print("DIGEST", info.digest)
"""


def test_concurrent_ensures_in_two_processes_pull_once(
    image_registry: Registry, registry_images: dict[str, str], state: Path
) -> None:
    argv = [sys.executable, "-c", _PULL_SCRIPT, str(state), str(image_registry.auth_file),
            str(image_registry.certs_dir), registry_images["debian"]]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    said = [line for out, _ in outputs for line in out.splitlines()]
    assert _pulls(said) == 1
    assert len({line for line in said if line.startswith("DIGEST")}) == 1


def test_an_interrupted_pull_leaves_nothing_half_made(
    image_registry: Registry, registry_images: dict[str, str], state: Path
) -> None:
    settings = image_registry.settings(state)

    def interrupt(line: str) -> None:
        if line.startswith("unpacking"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        images.ensure(registry_images["debian"], settings, interrupt)
    assert images.held(settings) == []
    assert list((state / "images" / "rootfs").iterdir()) == []
    assert list((state / "images" / "tmp").iterdir()) == []
    downloads = image_registry.layer_downloads()
    _, root = images.ensure(registry_images["debian"], settings)
    assert (root / "etc" / "debian_version").exists()
    # The blobs it had copied were kept: the second pull downloaded none again.
    assert image_registry.layer_downloads() == downloads


# --------------------------------------------------------------------------- errors


def test_a_wrong_password_is_a_clear_error_without_the_password(
    image_registry: Registry, registry_images: dict[str, str], state: Path, tmp_path: Path
) -> None:
    wrong = "not-the-" + image_registry.password
    auth = image_registry.write_auth_file(tmp_path / "wrong.json", password=wrong)
    settings = image_registry.settings(state).model_copy(update={"registry_auth_file": auth})
    with pytest.raises(ImageError) as caught:
        images.ensure(registry_images["debian"], settings)
    error = caught.value
    assert error.kind == "unavailable"
    assert "refused this host's credentials" in error.message
    assert registry_images["debian"] in error.message
    assert wrong not in error.message and image_registry.password not in error.message
    assert images.held(settings) == []


def test_a_missing_tag_or_repository_is_not_found(
    image_registry: Registry, state: Path
) -> None:
    settings = image_registry.settings(state)
    for ref in (f"{image_registry.url}/bashfleet/debian:no-such-tag",
                f"{image_registry.url}/bashfleet/no-such-repo:1"):
        with pytest.raises(ImageError) as caught:
            images.ensure(ref, settings)
        assert caught.value.kind == "not_found" and ref in caught.value.message


def test_an_unreachable_registry_is_unavailable(state: Path) -> None:
    with pytest.raises(ImageError) as caught:
        images.ensure(f"127.0.0.1:{free_port()}/x/y:1", _settings(state))
    assert caught.value.kind == "unavailable" and "connection refused" in caught.value.message


def _settings(state: Path) -> Settings:
    return Settings(state_dir=state)


@pytest.mark.parametrize("ref", ["-oops", "a b", "dir:/etc", "x" * 1025, "Upper:1"])
def test_a_bad_reference_is_refused_before_any_tool_runs(
    ref: str, state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # any tool run would fail otherwise
    with pytest.raises(ImageError) as caught:
        images.ensure(ref, _settings(state))
    assert caught.value.kind == "invalid"


def test_a_host_without_a_tool_names_its_debian_package(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ImageError) as caught:
        images.ensure("127.0.0.1:1/x/y:1", _settings(state))
    assert caught.value.kind == "unavailable" and "`skopeo`" in caught.value.message


# --------------------------------------------------------------------------- builds


@pytest.fixture
def context(tmp_path: Path, registry_images: dict[str, str]) -> Path:
    """A build context under an allowed root: a Dockerfile on the Debian test image."""
    folder = tmp_path / "allowed" / "ctx"
    folder.mkdir(parents=True)
    (folder / "Dockerfile").write_text(
        f"FROM {registry_images['debian']}\n"
        "RUN apt-get update && apt-get install -y --no-install-recommends hello "
        "&& rm -rf /var/lib/apt/lists/*\n"
        "COPY note.txt /etc/note.txt\n"
        "RUN cat /proc/self/uid_map > /etc/uid_map && touch /etc/made-by-run\n"
        "ENV BUILT=yes\nWORKDIR /srv\n")
    (folder / "note.txt").write_text("first\n")
    return folder


@pytest.fixture
def build_settings(image_registry: Registry, state: Path, tmp_path: Path) -> Iterator[Settings]:
    """Settings that build under `tmp_path`; buildah's storage emptied afterwards (its
    overlay driver leaves mounts: the sweep detaches them)."""
    settings = image_registry.settings(state, workspace_allow=(str(tmp_path),))
    try:
        yield settings
    finally:
        assert images.sweep(settings, buildah=True)
        assert not (state / "images" / "buildah").exists()
        assert str(state) not in Path("/proc/self/mountinfo").read_text()


def test_a_dockerfile_is_built_once_per_content(
    build_settings: Settings, context: Path, state: Path
) -> None:
    settings = build_settings
    said, progress = _lines()
    info, root = images.build(str(context), settings, progress)
    # apt-get inside the build reached Debian's mirror from buildah's chroot.
    assert (root / "usr" / "bin" / "hello").exists()
    assert (root / "etc" / "note.txt").read_text() == "first\n"
    # RUN steps ran as root in a user namespace: an unprivileged id on the host. What
    # they made is root's in the image all the same.
    first, count = settings.build_ids
    assert (root / "etc" / "uid_map").read_text().split() == ["0", str(first), str(count)]
    made = os.lstat(root / "etc" / "made-by-run")
    assert (made.st_uid, made.st_gid) == (0, 0)
    assert "BUILT=yes" in info.env and info.workdir == "/srv" and info.shell == "bash"
    assert info.ref == f"build:{context}" and info.refs == [f"build:{context}"]
    assert (state / "images" / "buildah" / "vfs" / "root").is_dir()  # storage: the store's
    said.clear()
    again, same_root = images.build(str(context), settings, progress)
    assert again.digest == info.digest and same_root == root and said == []
    (context / "note.txt").write_text("second\n")
    changed, changed_root = images.build(str(context), settings)
    assert changed.digest != info.digest
    assert (changed_root / "etc" / "note.txt").read_text() == "second\n"


def test_a_trusted_build_runs_as_the_hosts_root_on_overlay(
    build_settings: Settings, registry_images: dict[str, str], tmp_path: Path, state: Path
) -> None:
    folder = tmp_path / "trusted"
    folder.mkdir()
    (folder / "Dockerfile").write_text(f"FROM {registry_images['nobash']}\n"
                                       # dash alone: builtins only
                                       "RUN read -r ids < /proc/self/uid_map; "
                                       "echo $ids > /uid_map\n")
    settings = build_settings.model_copy(update={"build_as_root": True})
    info, root = images.build(str(folder), settings)
    assert (root / "uid_map").read_text().split() == ["0", "0", "4294967295"]
    assert info.shell == "sh" and (state / "images" / "buildah" / "overlay").is_dir()


def test_a_build_context_outside_the_allowed_roots_is_refused(
    context: Path, state: Path, tmp_path: Path
) -> None:
    settings = _settings(state).model_copy(update={"workspace_allow": (str(tmp_path / "x"),)})
    with pytest.raises(ImageError) as caught:
        images.build(str(context), settings)
    assert caught.value.kind == "invalid" and "not under a root" in caught.value.message
    (tmp_path / "x" / "empty").mkdir(parents=True)
    with pytest.raises(ImageError, match="no Dockerfile"):
        images.build(str(tmp_path / "x" / "empty"), settings)


def test_a_failing_build_says_why_and_keeps_nothing(
    build_settings: Settings, registry_images: dict[str, str], tmp_path: Path
) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "Dockerfile").write_text(f"FROM {registry_images['nobash']}\nRUN exit 3\n")
    settings = build_settings
    with pytest.raises(ImageError) as caught:
        images.build(str(folder), settings)
    assert caught.value.kind == "unavailable" and "exit status 3" in caught.value.message
    assert images.held(settings) == []


# ----------------------------------------------------------- held, remove, collect


@pytest.fixture
def two_held(
    image_registry: Registry, registry_images: dict[str, str], state: Path
) -> Iterator[tuple[ImageInfo, ImageInfo]]:
    settings = image_registry.settings(state)
    debian, _ = images.ensure(registry_images["debian"], settings)
    nobash, _ = images.ensure(registry_images["nobash"], settings)
    yield debian, nobash


def _record(state: Path, ws_id: str, image: ImageInfo) -> None:
    """A workspace record naming an image (as the engine writes one)."""
    record = WorkspaceRecord(id=ws_id, host="h", path=f"/w/{ws_id}", fresh=True,
                             out_dir="/o", isolation="process", network=False, ttl_s=60,
                             created_at=1.0, image=image)
    folder = state / "workspace-state"
    folder.mkdir(exist_ok=True)
    (folder / f"{ws_id}.json").write_text(record.model_dump_json())


def test_held_remove_and_in_use(
    image_registry: Registry, two_held: tuple[ImageInfo, ImageInfo], state: Path
) -> None:
    settings = image_registry.settings(state)
    debian, nobash = two_held
    assert {info.digest for info in images.held(settings)} == {debian.digest, nobash.digest}
    _record(state, "w0123456789abcde", nobash)
    busy = images.in_use(settings)
    assert busy == {nobash.digest}
    with pytest.raises(ImageError) as caught:
        images.remove(nobash.ref, settings, busy)
    assert caught.value.kind == "invalid" and "in use" in caught.value.message
    assert images.remove(debian.digest, settings, busy) is True
    assert images.remove(debian.digest, settings, busy) is False
    assert [info.digest for info in images.held(settings)] == [nobash.digest]
    # Its blobs went too; the other image's stayed.
    blobs = {p.name for p in (state / "images" / "blobs" / "sha256").iterdir()}
    assert debian.digest.removeprefix("sha256:") not in blobs
    assert nobash.digest.removeprefix("sha256:") in blobs


def test_collect_takes_the_least_recently_used_and_never_one_in_use(
    image_registry: Registry, two_held: tuple[ImageInfo, ImageInfo], state: Path
) -> None:
    settings = image_registry.settings(state)
    debian, nobash = two_held
    images.touch(debian.digest, settings)  # used after nobash: nobash is the older
    none = images.collect(settings, max_age_s=1e9, max_bytes=1 << 40, in_use=set(),
                          min_age_s=0)
    assert none == []
    one = images.collect(settings, max_age_s=1e9, max_bytes=debian.size_bytes,
                         in_use=set(), min_age_s=0)
    assert [info.digest for info in one] == [nobash.digest]
    spared = images.collect(settings, max_age_s=0, max_bytes=0, in_use={debian.digest},
                            min_age_s=0)
    assert spared == [] and [i.digest for i in images.held(settings)] == [debian.digest]
    recent = images.collect(settings, max_age_s=0, max_bytes=0, in_use=set(),
                            min_age_s=3600)
    assert recent == []  # just used: a workspace may be being made of it
    assert images.collect(settings, max_age_s=0, max_bytes=0, in_use=set(), min_age_s=0)
    assert images.held(settings) == []
    assert list((state / "images" / "blobs" / "sha256").iterdir()) == []
