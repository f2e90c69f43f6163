"""Images on this host: pulled from registries or built from Dockerfiles, held once,
unpacked for workspaces to stand on, collected when no workspace uses them.

    ensure(ref, settings)        -> (ImageInfo, rootfs)   pull unless held
    build(context, settings)     -> (ImageInfo, rootfs)   buildah, cached by content
    held(settings)               -> [ImageInfo]
    touch(digest, settings)                               mark it used now
    remove(ref_or_digest, settings, in_use)  -> bool
    collect(settings, max_age_s=, max_bytes=, in_use=) -> [ImageInfo] removed
    in_use(settings)             -> {digest}              what workspace records name

The store, under the state directory, root's only (0700):

    images/blobs/sha256/<hex>    every blob once per host (manifests, configs, layers):
                                 skopeo's shared blob directory, so a layer two images
                                 share is downloaded once
    images/rootfs/<hex>/         the image of manifest <hex> unpacked by umoci as root:
                                 the image's own uids, gids, modes and setuid bits, none
                                 shifted (a workspace mounts it through an idmapped
                                 mount); never written after the rename that makes it
    images/info/<hex>.json       its ImageInfo, written last: the image is held once this
                                 exists (`.used` beside it: its last use, as an mtime)
    images/refs/<key>.json       a reference -> the digest it was pulled as
    images/builds/<key>.json     a build context's content digest -> its image
    images/buildah/              buildah's storage (`bashfleet gc` empties it)
    images/locks/                a lock file per reference, image and build context
    images/tmp/                  pulls and removals under way

A pull is: resolve the reference to the digest of this platform's manifest (one small
registry request), copy that digest (a tag cannot move in between), unpack into
`tmp/`, rename into `rootfs/<hex>`, write the info. Anything interrupted leaves only
`tmp/` (cleared by the next sweep) or blobs no image names yet (swept the same way),
never a half-made image. One pull of an image runs at a time on the host: the others
(threads of this process, other processes) wait on its lock and find it held.

Locks, always taken in this order: a reference's, then an image's (a file lock each,
behind a thread lock, so that threads of one process queue on the thread lock); the
store lock is held shared by every pull and build, and exclusively by the sweep that
removes unnamed blobs and `tmp/` (which never waits for it: it is skipped when a pull
runs, and done at the next `gc`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bashfleet.worker.engine.images import build_isolation
from bashfleet.worker.engine.images import image_tools as tools
from bashfleet.worker.engine.images.image_meta import (
    ImageError,
    ImageRef,
    checked_digest,
    choose_manifest,
    digest_hex,
    digest_of,
    host_platform,
    is_digest,
    layers_of,
    parse_config,
    parse_ref,
    shell_of,
    to_collect,
)
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import ImageInfo
from bashfleet.worker.wire.network import NetworkPolicy

__all__ = [
    "ImageError", "build", "collect", "ensure", "held", "in_use", "remove", "touch",
]

Progress = Callable[[str], None]

#: The reference prefix of an image built from a Dockerfile (`build:<context dir>`).
BUILD_PREFIX = "build:"
#: Names buildah looks for in a build context, in its order.
DOCKERFILES = ("Containerfile", "Dockerfile")


def _quiet(_: str) -> None:
    """No progress wanted."""


@dataclass(frozen=True)
class _Job:
    """What every step of one pull or build needs."""

    settings: Settings
    store: Store
    say: Progress


# ------------------------------------------------------------------------ the store


class Store:
    """The paths of this host's image store (made on first use, 0700)."""

    def __init__(self, settings: Settings) -> None:
        self.root = settings.state_dir / "images"
        for folder in (self.root, self.blobs, self.root / "rootfs", self.root / "info",
                       self.root / "refs", self.root / "builds", self.root / "locks",
                       self.root / "tmp"):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(folder, 0o700)  # never readable by another local user

    @property
    def blobs(self) -> Path:
        """The shared blob directory (`sha256/<hex>` in it)."""
        return self.root / "blobs"

    @property
    def buildah(self) -> Path:
        """buildah's storage."""
        return self.root / "buildah"

    def blob(self, digest: str) -> Path:
        return self.blobs / "sha256" / digest_hex(digest)

    def rootfs(self, digest: str) -> Path:
        return self.root / "rootfs" / digest_hex(digest)

    def info(self, digest: str) -> Path:
        return self.root / "info" / f"{digest_hex(digest)}.json"

    def used(self, digest: str) -> Path:
        return self.root / "info" / f"{digest_hex(digest)}.used"

    def manifest_file(self, digest: str) -> Path:
        """Names the manifest blob as stored: the registry's digest identifies an
        image, but skopeo rewrites a Docker manifest as an OCI one (another digest)."""
        return self.root / "info" / f"{digest_hex(digest)}.manifest"

    def ref_file(self, ref: str) -> Path:
        return self.root / "refs" / f"{_key(ref)}.json"

    def build_file(self, context_digest: str) -> Path:
        return self.root / "builds" / f"{digest_hex(context_digest)}.json"

    def lock(self, kind: str, name: str) -> Path:
        return self.root / "locks" / f"{kind}-{_key(name)}.lock"

    @property
    def store_lock(self) -> Path:
        return self.root / "store.lock"

    def scratch(self) -> Path:
        """A fresh directory under `tmp/` (removed by its maker, or by the next sweep)."""
        path = self.root / "tmp" / uuid.uuid4().hex
        path.mkdir(mode=0o700)
        return path


def _key(text: str) -> str:
    """A file name for any text (a reference, a path): its sha256, shortened."""
    return hashlib.sha256(text.encode()).hexdigest()[:40]


_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold `path`'s lock: against other threads of this process, then other processes."""
    with _thread_locks_guard:
        lock = _thread_locks.setdefault(str(path), threading.Lock())
    with lock, _flocked(path, fcntl.LOCK_EX):
        yield


@contextlib.contextmanager
def _flocked(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # releases the lock


def _write_json(path: Path, data: str) -> None:
    """Write a small file atomically (a reader sees the old one or the new one)."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    temporary.write_text(data, encoding="utf-8")
    os.replace(temporary, path)


# -------------------------------------------------------------------------- ensure


def ensure(ref: str, settings: Settings, progress: Progress | None = None, *,
           refresh: bool = False) -> tuple[ImageInfo, Path]:
    """The image `ref` names, pulled unless this host holds it already: its info and
    the directory that is its `/`. A reference held is answered from the store without
    asking the registry; `refresh` asks the registry where its tag points now. A pull
    of the same reference or image already under way (this process or another) is
    waited for, not repeated. ImageError on failure (nothing half-made is left)."""
    wanted = parse_ref(ref)
    say = progress or _quiet
    store = Store(settings)
    with _exclusive(store.lock("ref", wanted.canonical)):
        digest, index = (None if refresh else _held_digest(store, wanted)), None
        if digest is None:
            digest, index = _resolve(wanted, settings, say)
        # The image's lock also orders this against a removal: what is found here is
        # marked used before the lock goes, so `collect` (which spares the recently
        # used) cannot take it from under the caller.
        with _exclusive(store.lock("image", digest)):
            found = _load(store, digest)
            if found is None:
                with _flocked(store.store_lock, fcntl.LOCK_SH):
                    found = _pull(_Job(settings, store, say), wanted, digest)
            else:
                say(f"{wanted.canonical}: held ({digest})")
            found = _alias(store, wanted.canonical, found)
            if index is not None and wanted.digest == index:
                found = _alias(store, f"{wanted.name}@{index}", found)
            store.used(digest).touch()
    return _as_asked(found, wanted.canonical, store), store.rootfs(digest)


def _held_digest(store: Store, wanted: ImageRef) -> str | None:
    """The digest a reference names on this host, without asking a registry: its pinned
    digest when held, else what it was pulled as before (when still held)."""
    if wanted.digest is not None and _load(store, wanted.digest) is not None:
        return wanted.digest
    digest = _named_by(store, wanted.canonical)
    if digest is not None and _load(store, digest) is not None:
        return digest
    return None


def _named_by(store: Store, ref: str) -> str | None:
    """The digest this host's file of `ref` names (None: no file, or not one)."""
    try:
        digest = json.loads(store.ref_file(ref).read_text("utf-8"))["digest"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return digest if isinstance(digest, str) and is_digest(digest) else None


def _resolve(wanted: ImageRef, settings: Settings, say: Progress) -> tuple[str, str | None]:
    """(the digest of this platform's manifest, the index's digest when the reference
    names a multi-platform index), asked of the registry."""
    say(f"resolving {wanted.canonical}")
    raw = tools.capture(tools.inspect_argv(settings, wanted), wanted.canonical, settings)
    if wanted.digest is not None and digest_of(raw) != wanted.digest:
        raise ImageError("unavailable", f"{wanted.canonical}: the registry answered a "
                         f"manifest of another digest ({digest_of(raw)})")
    try:
        return choose_manifest(raw, host_platform())
    except ImageError as exc:
        raise ImageError(exc.kind, f"{wanted.canonical}: {exc.message}") from None


def _pull(job: _Job, wanted: ImageRef, digest: str) -> ImageInfo:
    """Copy the manifest and the blobs this host lacks, unpack, move into place."""
    platform = host_platform()
    job.say(f"pulling {wanted.canonical} ({digest}, {platform.os}/{platform.architecture})")
    work = job.store.scratch()
    try:
        layout = _layout(work, job.store)
        tools.stream(tools.copy_argv(job.settings, wanted, digest, platform=platform,
                                     blobs=job.store.blobs, layout=layout),
                     wanted.canonical, job.settings, job.say)
        return _unpack_and_keep(job, wanted.canonical, digest, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _layout(work: Path, store: Store) -> Path:
    """An OCI layout in `work` whose blobs are the store's (umoci reads them there)."""
    layout = work / "layout"
    layout.mkdir()
    _point_at_store(layout, store)
    return layout


def _point_at_store(layout: Path, store: Store) -> None:
    """Make a layout's `blobs` the store's (a relative link: the store may move)."""
    shutil.rmtree(layout / "blobs", ignore_errors=True)
    (layout / "blobs").symlink_to(os.path.relpath(store.blobs, layout))


def _unpack_and_keep(job: _Job, ref: str, digest: str, work: Path) -> ImageInfo:
    """Unpack the image of `work/layout`, rename its root into place, then write its
    info (the last step: until then the image is not held)."""
    store = job.store
    job.say(f"unpacking {ref}")
    unpacked = work / "rootfs"
    tools.stream(tools.unpack_argv(work / "layout", unpacked), f"unpacking {ref}",
                 job.settings, job.say)
    target = store.rootfs(digest)
    if target.exists():  # left by a pull that died between the rename and the info
        _discard(target, store)
    os.rename(unpacked, target)
    local = _stored_manifest(work / "layout")
    store.manifest_file(digest).write_text(local, encoding="utf-8")
    info = _describe(ref, digest, local, job.settings, store)
    _write_json(store.info(digest), info.model_dump_json())
    store.used(digest).touch()
    job.say(f"{ref}: {digest}, {info.size_bytes / 1e6:.0f} MB, shell {info.shell}")
    return info


def _stored_manifest(layout: Path) -> str:
    """The digest of the manifest a layout holds (its index's one entry)."""
    try:
        entry = json.loads((layout / "index.json").read_text("utf-8"))["manifests"][0]
        return checked_digest(entry["digest"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        raise ImageError("unavailable", f"no manifest in the copied layout {layout}") from None


def _describe(ref: str, digest: str, local: str, settings: Settings, store: Store
              ) -> ImageInfo:
    """An image's info, from its manifest (as stored: `local`) and config blobs and its
    unpacked root."""
    manifest = store.blob(local).read_bytes()
    config_digest, layers = layers_of(manifest)
    config = parse_config(store.blob(config_digest).read_bytes())
    rootfs = store.rootfs(digest)
    blob_bytes = len(manifest) + sum(size for _, size in layers)
    return ImageInfo(
        ref=ref, digest=digest, host=settings.host,
        size_bytes=blob_bytes + _disk_bytes(rootfs), env=list(config.env),
        workdir=config.workdir, user=config.user, shell=shell_of(rootfs),
        pulled_at=time.time(), refs=[ref],
    )


def _disk_bytes(root: Path) -> int:
    """Bytes a directory tree takes on disk (each hard-linked file once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(folder, name))
                if (info.st_dev, info.st_ino) not in seen:
                    seen.add((info.st_dev, info.st_ino))
                    total += info.st_blocks * 512
    return total


def _alias(store: Store, ref: str, info: ImageInfo) -> ImageInfo:
    """Remember that `ref` names this image here, and list it in the image's info
    (called under the image's lock). The info as it now is."""
    if _named_by(store, ref) != info.digest:
        # Written only when it changes: a workspace made from a held image would
        # otherwise pay an atomic write (a file, an fsync, a rename) on every create.
        _write_json(store.ref_file(ref), json.dumps({"ref": ref, "digest": info.digest}))
    if ref in info.refs:
        return info
    updated = info.model_copy(update={"refs": [*info.refs, ref]})
    _write_json(store.info(info.digest), updated.model_dump_json())
    return updated


def _as_asked(info: ImageInfo, ref: str, store: Store) -> ImageInfo:
    """The info under the reference it was asked by, with its last use."""
    return info.model_copy(update={"ref": ref, "last_used_at": _used_at(store, info.digest)})


# --------------------------------------------------------------------------- build


def build(context_dir: str, settings: Settings, progress: Progress | None = None, *,
          network: NetworkPolicy | None = None) -> tuple[ImageInfo, Path]:
    """The image a Dockerfile (or Containerfile) in `context_dir` builds, made by
    `buildah bud` unless a build of the same content is held (then at once). The
    context must lie under a root this host allows (`workspace_allow`, the workspace
    root): buildah reads it as root. Its RUN steps run in network and PID namespaces
    of their own, the network under `network` (`egress` when None; see
    `build_isolation`). ImageError on failure."""
    say = progress or _quiet
    policy = build_isolation.checked_policy(network, settings)
    context = _checked_context(context_dir, settings)
    dockerfile = next(context / name for name in DOCKERFILES if (context / name).is_file())
    ref = f"{BUILD_PREFIX}{context}"
    store = Store(settings)
    content = context_digest(context)
    with _exclusive(store.lock("build", content)):
        found = _reuse_build(store, content, ref)
        if found is None:
            say(f"building {context} ({content})")
            with _flocked(store.store_lock, fcntl.LOCK_SH):
                found = _build(_Job(settings, store, say), ref, context, dockerfile, policy)
            _write_json(store.build_file(content), json.dumps(
                {"context": str(context), "content": content, "digest": found.digest}))
    return _as_asked(found, ref, store), store.rootfs(found.digest)


def _reuse_build(store: Store, content: str, ref: str) -> ImageInfo | None:
    """The image a context of this content was built into, while this host holds it
    (marked used, and named by `ref`, under its lock)."""
    try:
        digest = json.loads(store.build_file(content).read_text("utf-8"))["digest"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (isinstance(digest, str) and is_digest(digest)):
        return None
    with _exclusive(store.lock("image", digest)):
        found = _load(store, digest)
        if found is not None:
            found = _alias(store, ref, found)
            store.used(digest).touch()
        return found


def _checked_context(context_dir: str, settings: Settings) -> Path:
    """The build context: an existing directory with a Dockerfile, under an allowed root."""
    if not context_dir.startswith("/"):
        raise ImageError("invalid", f"a build context is an absolute path: {context_dir!r}")
    context = Path(os.path.realpath(context_dir))
    allowed = [*map(Path, settings.workspace_allow), settings.workspace_root_dir()]
    roots = [root.resolve() for root in allowed]
    if not any(context.is_relative_to(root) for root in roots):
        raise ImageError("invalid", f"build context {context_dir} is not under a root this "
                         "host allows (BASHFLEET_WORKSPACE_ALLOW, or the workspace root)")
    if not context.is_dir():
        raise ImageError("invalid", f"build context {context_dir} is not a directory")
    if not any((context / name).is_file() for name in DOCKERFILES):
        raise ImageError("invalid", f"no Dockerfile (or Containerfile) in {context_dir}")
    return context


def context_digest(context: Path) -> str:
    """A digest of everything a build reads from its context: each entry's relative path,
    type and mode, a file's bytes, a symlink's target (walked in a fixed order)."""
    total = hashlib.sha256()
    for folder, dirs, files in os.walk(context):
        dirs.sort()
        for name in sorted((*dirs, *files)):
            path = os.path.join(folder, name)
            info = os.lstat(path)
            entry = f"{os.path.relpath(path, context)}\0{info.st_mode:o}\0"
            total.update(entry.encode("utf-8", "surrogateescape"))
            if stat.S_ISLNK(info.st_mode):
                total.update(os.readlink(path).encode("utf-8", "surrogateescape"))
            elif stat.S_ISREG(info.st_mode):
                total.update(_file_digest(path).encode())
    return f"sha256:{total.hexdigest()}"


def _file_digest(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _build(job: _Job, ref: str, context: Path, dockerfile: Path, policy: NetworkPolicy
           ) -> ImageInfo:
    """The bases pulled, buildah bud in the build's namespaces, buildah push into an OCI
    layout, its blobs into the store, unpack."""
    store, settings = job.store, job.settings
    work = store.scratch()
    env = _buildah_env(settings, work)
    try:
        iid = work / "iid"
        driver = tools.build_driver(settings)
        text = dockerfile.read_text("utf-8", errors="replace")
        for base in build_isolation.dockerfile_bases(text):
            try:
                parsed = parse_ref(base)
            except ImageError:
                continue  # not a registry's reference: buildah says what it makes of it
            # In the worker's namespace, with its credentials: never from a RUN step.
            job.say(f"pulling {base} for {context}")
            made = tools.capture(tools.buildah_argv(store.buildah, driver, *tools.base_args(
                settings, parsed)), f"pulling {base} for {context}", settings,
                tools.LONG_TIMEOUT_S, env=env).decode("utf-8", "replace").strip()
            tools.capture(tools.buildah_argv(store.buildah, driver, "rm", "--", made),
                          f"pulling {base} for {context}", settings, env=env)
        with build_isolation.namespaces(policy, settings) as spaces:
            bud = tools.bud_args(settings, context, dockerfile, iid, spaces.bud_flags)
            tools.stream([*spaces.prefix, *tools.buildah_argv(store.buildah, driver, *bud)],
                         f"building {context}", settings, job.say, env=env)
        pushed, digest_file = work / "pushed", work / "digest"
        tools.stream(tools.buildah_argv(
            store.buildah, driver, "push", "--format", "oci", "--digestfile", str(digest_file),
            iid.read_text("utf-8").strip(), f"oci:{pushed}:image"),
            f"exporting the build of {context}", settings, job.say, env=env)
        digest = digest_file.read_text("utf-8").strip()
        _adopt_blobs(pushed, store)
        with _exclusive(store.lock("image", digest)):
            found = _load(store, digest)
            if found is None:
                _point_at_store(pushed, store)
                os.rename(pushed, work / "layout")
                found = _unpack_and_keep(job, ref, digest, work)
            found = _alias(store, ref, found)
            store.used(digest).touch()
            return found
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _buildah_env(settings: Settings, work: Path) -> dict[str, str]:
    """buildah's environment: the worker's, with a registries.conf marking the insecure
    registries when there are any."""
    env = dict(os.environ)
    conf = tools.registries_conf(settings)
    if conf is not None:
        (work / "registries.conf").write_text(conf, encoding="utf-8")
        env["CONTAINERS_REGISTRIES_CONF"] = str(work / "registries.conf")
    return env


def _adopt_blobs(layout: Path, store: Store) -> None:
    """Move a layout's blobs into the store's (a blob held already stays as it is)."""
    source = layout / "blobs" / "sha256"
    (store.blobs / "sha256").mkdir(mode=0o700, exist_ok=True)
    for entry in os.scandir(source):
        target = store.blobs / "sha256" / entry.name
        if not target.exists():
            os.replace(entry.path, target)


# ------------------------------------------------------------------- what is held


def _load(store: Store, digest: str) -> ImageInfo | None:
    """The image of a digest, when it is held (its info and its root both there)."""
    try:
        info = ImageInfo.model_validate_json(store.info(digest).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return info if store.rootfs(digest).is_dir() else None


def _used_at(store: Store, digest: str) -> float | None:
    try:
        return store.used(digest).stat().st_mtime
    except OSError:
        return None


def held(settings: Settings) -> list[ImageInfo]:
    """Every image this host holds, least recently used first."""
    store = Store(settings)
    found = []
    for entry in sorted(os.scandir(store.root / "info"), key=lambda e: e.name):
        digest = f"sha256:{entry.name.removesuffix('.json')}"
        if entry.name.endswith(".json") and is_digest(digest):
            info = _load(store, digest)
            if info is not None:
                found.append(_as_asked(info, info.ref, store))
    return sorted(found, key=lambda info: (info.last_used_at or info.pulled_at, info.digest))


def touch(digest: str, settings: Settings) -> None:
    """Mark an image used now (a workspace was made of it, or asked for it)."""
    with contextlib.suppress(OSError, ValueError):
        Store(settings).used(digest).touch()


def in_use(settings: Settings) -> set[str]:
    """The digests the workspace and snapshot records of this host name (an image in use
    is never removed, nor one a snapshot stands on: one built here could not come back):
    read leniently, so a record of another shape costs nothing."""
    found: set[str] = set()
    for folder in (settings.workspaces_dir, settings.state_dir / "snapshots"):
        with contextlib.suppress(OSError), os.scandir(folder) as listing:
            for entry in listing:
                if entry.name.endswith(".json") and entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
                        image = json.loads(Path(entry.path).read_text("utf-8")).get("image")
                        if isinstance(image, dict) and isinstance(image.get("digest"), str):
                            found.add(image["digest"])
    return found


def find(ref_or_digest: str, settings: Settings) -> ImageInfo | None:
    """A held image by digest, by any reference it was pulled as, or `build:<dir>`."""
    store = Store(settings)
    if is_digest(ref_or_digest):
        return _load(store, ref_or_digest)
    if ref_or_digest.startswith(BUILD_PREFIX):
        return next((i for i in held(settings) if ref_or_digest in i.refs), None)
    digest = _held_digest(store, parse_ref(ref_or_digest))
    return _load(store, digest) if digest is not None else None


# ------------------------------------------------------------------------- removal


def remove(ref_or_digest: str, settings: Settings, in_use: set[str]) -> bool:
    """Remove a held image (its root, its info, the references to it; its blobs at the
    sweep). False when none is held by that name; ImageError `invalid` when a
    workspace uses it."""
    info = find(ref_or_digest, settings)
    if info is None:
        return False
    if info.digest in in_use:
        raise ImageError("invalid", f"image {ref_or_digest} ({info.digest}) is in use by a "
                         "workspace of this host: delete the workspace first")
    _drop(info.digest, Store(settings))
    sweep(settings)
    return True


def _drop(digest: str, store: Store) -> None:
    """Forget an image (info first: from then on it is not held), then remove its root."""
    with _exclusive(store.lock("image", digest)):
        info = _load(store, digest)
        with contextlib.suppress(FileNotFoundError):
            store.info(digest).unlink()
        for sidecar in (store.used(digest), store.manifest_file(digest)):
            with contextlib.suppress(FileNotFoundError):
                sidecar.unlink()
        for ref in info.refs if info else []:
            with contextlib.suppress(FileNotFoundError):
                store.ref_file(ref).unlink()
        if store.rootfs(digest).exists():
            _discard(store.rootfs(digest), store)


def _discard(path: Path, store: Store) -> None:
    """Remove a tree: renamed into `tmp/` first, so it vanishes at once and whole."""
    gone = store.root / "tmp" / f"gone-{uuid.uuid4().hex}"
    os.rename(path, gone)
    shutil.rmtree(gone, ignore_errors=True)


def collect(settings: Settings, *, max_age_s: float, max_bytes: int, in_use: set[str],
            min_age_s: float | None = None) -> list[ImageInfo]:
    """Remove the images `image_meta.to_collect` picks (never one in use, nor one used
    within `min_age_s`, default `retention_min_age_s`), least recently used first; then
    sweep blobs no image names, and buildah's storage when no build runs. The removed."""
    chosen = to_collect(
        held(settings), now=time.time(), max_age_s=max_age_s, max_bytes=max_bytes,
        in_use=in_use,
        min_age_s=settings.retention_min_age_s if min_age_s is None else min_age_s)
    store = Store(settings)
    for info in chosen:
        _drop(info.digest, store)
    sweep(settings, buildah=True)
    return chosen


def sweep(settings: Settings, *, buildah: bool = False) -> bool:
    """Remove blobs no held image names and whatever `tmp/` holds (and buildah's
    storage, with `buildah`), unless a pull or build runs: False then (the next sweep
    does it)."""
    store = Store(settings)
    fd = os.open(store.store_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        for entry in os.scandir(store.root / "tmp"):
            shutil.rmtree(entry.path, ignore_errors=True)
        _sweep_blobs(store, _named_blobs(store))
        _sweep_builds(store)
        if buildah:
            _empty_buildah(store, settings)
        return True
    finally:
        os.close(fd)


def _named_blobs(store: Store) -> set[str]:
    """The hex of every blob a held image names (its manifest, config, layers)."""
    named: set[str] = set()
    for entry in os.scandir(store.root / "info"):
        if not entry.name.endswith(".json"):
            continue
        digest = f"sha256:{entry.name.removesuffix('.json')}"
        with contextlib.suppress(OSError, ValueError, ImageError):
            local = checked_digest(store.manifest_file(digest).read_text("utf-8").strip())
            config, layers = layers_of(store.blob(local).read_bytes())
            named.update(each.removeprefix("sha256:")
                         for each in (local, config, *(layer for layer, _ in layers)))
    return named


def _sweep_blobs(store: Store, named: Iterable[str]) -> None:
    keep = set(named)
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(store.blobs / "sha256"):
            if entry.name not in keep:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


def _sweep_builds(store: Store) -> None:
    """Forget the builds whose image is no longer held (they are built again)."""
    for entry in os.scandir(store.root / "builds"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            digest = json.loads(Path(entry.path).read_text("utf-8"))["digest"]
            if not (isinstance(digest, str) and is_digest(digest) and _load(store, digest)):
                os.unlink(entry.path)


def _empty_buildah(store: Store, settings: Settings) -> None:
    """Empty buildah's storage (its base images and layer cache): through buildah, then
    whatever its overlay driver left mounted (it keeps its own directory bind-mounted),
    then the directory."""
    if not store.buildah.exists():
        return
    drivers = [d for d in tools.DRIVERS if (store.buildah / d).is_dir()]
    for driver in drivers if shutil.which("buildah") else []:
        for args in (("rm", "--all"), ("rmi", "--all", "--force")):
            with contextlib.suppress(ImageError):
                tools.capture(tools.buildah_argv(store.buildah, driver, *args),
                              "emptying buildah's storage", settings)
    tools.unmount_under(store.buildah)
    shutil.rmtree(store.buildah, ignore_errors=True)


def ensure_pinned(info: ImageInfo, settings: Settings) -> tuple[ImageInfo, Path]:
    """The very image `info` pins (a snapshot's base), held or pulled again by digest;
    ImageError `not_found` when it was built here and is gone (it cannot be pulled)."""
    store = Store(settings)
    found = _load(store, info.digest)
    if found is not None:
        store.used(info.digest).touch()
        return found, store.rootfs(info.digest)
    if info.ref.startswith(BUILD_PREFIX):
        raise ImageError("not_found", f"image {info.digest}, built from {info.ref}, is gone "
                         f"from host {settings.host}: build it again")
    return ensure(f"{parse_ref(info.ref).name}@{info.digest}", settings)
