"""A snapshot's layer between hosts, through the fleet's OCI registry
(`Settings.snapshot_registry`): pushed once as one compressed archive, pulled once by
each host that forks it.

    snapshot_ref(settings, snap_id)               -> `<prefix>:<snap_id>`, or None
    push(layer_dir, ref, settings, annotations=)  -> the manifest's digest
    pull(ref, dest, settings)                     -> the manifest's digest
    delete(ref, settings)                         -> False when the registry lacked it

What travels is an OCI image manifest used as an artifact (a registry keeps it as any
image; no runtime takes it for one, its config and layer being of types of ours):

    manifest  application/vnd.oci.image.manifest.v1+json,
              artifactType application/vnd.bashfleet.snapshot.v1
    config    application/vnd.bashfleet.snapshot.config.v1+json:
              {"annotations": {...}, "tag": "<the tag it was pushed as>"}
    layer     application/vnd.bashfleet.snapshot.layer.v1.tar+zstd

OCI's artifact manifest (`application/vnd.oci.artifact.manifest.v1+json`) is not used:
Debian's docker-registry (distribution 2.8) answers MANIFEST_INVALID to it, and skopeo
1.9 cannot read it from a layout. The image manifest above it takes as pushed, digest
unchanged. The tag is in the config so that no two references share a manifest: the
registry deletes by manifest, which would untag every reference to it.

The archive is GNU tar's (Python's tarfile carries no extended attributes), in POSIX
format: numeric owners, modes with setuid bits, mtimes to the nanosecond, the extended
attributes of an overlay layer (`trusted.overlay.*`: opaque directories and the like;
`user.*`; `security.capability`), ACLs, whiteouts (character devices 0:0), hard links,
symlinks as they are, sparse files with their holes. Compressed by zstd: on 50 MB of
Python's standard library on a 2-core machine, `zstd -T0 -3` made the archive in 0.16 s
(14.8 MB) and unpacked it in 0.15 s, gzip -6 took 1.48 s (15.3 MB) and 0.28 s (deflate
is single-threaded and costlier per byte; `bench/bench_snapshot_registry.py` measures
both again).

A pull unpacks what a registry writer sent, who is not trusted. Nothing is written
outside a fresh 0700 directory beside `dest`, which becomes `dest` by one rename, or is
removed whole on any failure:

1. The manifest must be a snapshot's (the media types above), and the layer must have
   the digest and size the manifest names (and the manifest the digest a pinned
   reference names).
2. Before anything is extracted, the member list *as the extracting tar reads it*
   (`tar --list --verbose`, C-quoted names: no second parser whose reading could differ
   from the extractor's) is checked: every name relative, without `..`, `.` or empty
   components; no name twice; every member's parent an earlier directory member (so no
   member is written through a symlink, or under a file); only regular files,
   directories, symlinks, hard links, FIFOs and whiteouts; a hard link to an earlier
   member that is no directory; a relative symlink target that does not climb above the
   layer. An absolute symlink target is kept as the layer holds it: it resolves within
   a workspace's root, never the host's.
3. tar's own guards stay on: names lose a leading `/` and members with `..` are skipped
   (no `--absolute-names`), and a symlink whose target is absolute or has `..` is a
   placeholder file until the end of the extraction, so no later member goes through
   it. (Not `--keep-old-files`: it would leave the layer directory's own owner, mode
   and mtime unrestored; no member replaces another, step 2 refuses a name twice.)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bashfleet.worker.engine.images import image_tools as tools
from bashfleet.worker.engine.images.image_meta import (
    ImageError,
    ImageRef,
    checked_digest,
    digest_of,
    parse_ref,
)
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.errors import ErrorKind, ToolError

__all__ = ["RegistryError", "delete", "pull", "push", "snapshot_ref"]

ARTIFACT_TYPE = "application/vnd.bashfleet.snapshot.v1"
CONFIG_MEDIA_TYPE = "application/vnd.bashfleet.snapshot.config.v1+json"
LAYER_MEDIA_TYPE = "application/vnd.bashfleet.snapshot.layer.v1.tar+zstd"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
#: The layer types a pull takes, with the program tar decompresses each with.
DECOMPRESSORS = {LAYER_MEDIA_TYPE: "zstd",
                 "application/vnd.bashfleet.snapshot.layer.v1.tar+gzip": "gzip"}
#: What a push compresses with (tar runs it; all cores, zstd's default level).
COMPRESSOR = "zstd -T0 -3"
#: The extended attributes archived and restored (others, e.g. an SELinux label of the
#: pushing host, are not the layer's).
XATTRS = ("user.*", "trusted.overlay.*", "security.capability")
#: The tag inside this module's temporary OCI layouts.
LAYOUT_TAG = "snapshot"
#: A snapshot id as a tag (the registry's grammar).
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")  # fullmatch: `$` passes a `\n`
#: Member types a snapshot layer holds (`tar --list` spelling): regular file, directory,
#: symlink, hard link, FIFO, character device (whiteouts only).
_TYPES = frozenset("-dlhpc")
_QUOTED = r'"(?:[^"\\]|\\.)*"'
#: One line of `tar --list --verbose --numeric-owner --quoting-style=c`.
_LISTED = re.compile(
    rf"^(?P<type>\S)[-rwxsStT]{{9}}[*+.]? +\d+/\d+ +(?P<size>\d+|\d+, *\d+) [^\"]* "
    rf"(?P<name>{_QUOTED})(?: (?P<how>->|link to) (?P<target>{_QUOTED}))?$")
_ESCAPES = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11}


class RegistryError(ToolError):
    """A snapshot's layer could not be pushed, pulled or deleted: `invalid` (a malformed
    reference or destination, or what the registry holds is no snapshot or an unsafe
    one), `not_found` (the registry has no such snapshot), `unavailable` (the registry
    unreachable or refusing this host's credentials, a tool missing or failing)."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(kind, message)


def snapshot_ref(settings: Settings, snap_id: str) -> str | None:
    """Where snapshot `snap_id` lives in the fleet's registry (`<prefix>:<snap_id>`);
    None when this host has no snapshot registry. RegistryError `invalid` for an id that
    is no tag, or a prefix that makes no reference."""
    if settings.snapshot_registry is None:
        return None
    if not _TAG.fullmatch(snap_id):
        raise RegistryError("invalid", f"snapshot id {snap_id[:80]!r} cannot be a registry "
                            "tag (letters, digits, `_`, `.`, `-`, at most 128)")
    with _as_snapshot_error():
        return parse_ref(f"{settings.snapshot_registry}:{snap_id}").canonical


# --------------------------------------------------------------------------- push


def push(layer_dir: Path, ref: str, settings: Settings, *,
         annotations: Mapping[str, str] = {}) -> str:
    """Archive `layer_dir` whole into one layer, push it as `ref` (a tag) with
    `annotations` in its config; the manifest's digest (`sha256:...`)."""
    wanted = _reference(ref)
    if wanted.digest is not None:
        raise RegistryError("invalid", f"a snapshot is pushed to a tag, not a digest: {ref}")
    if layer_dir.is_symlink() or not layer_dir.is_dir():
        raise RegistryError("invalid", f"no snapshot layer directory at {layer_dir}")
    config = _config(wanted, annotations)
    with _as_snapshot_error(), _scratch(layer_dir, "push") as work:
        blob = _archive(layer_dir, work / "layer", settings)
        _write_layout(work / "layout", blob, config)
        digest_file = work / "digest"
        tools.capture([tools.tool("skopeo"), "copy", "--quiet", "--retry-times", "2",
                       "--preserve-digests", "--digestfile", str(digest_file),
                       *tools.registry_flags(settings, wanted.domain, "dest-"), "--",
                       f"oci:{work / 'layout'}:{LAYOUT_TAG}", wanted.transport],
                      f"pushing snapshot {wanted.canonical} to the registry {wanted.domain}",
                      settings, tools.LONG_TIMEOUT_S, noun="snapshot")
        return checked_digest(digest_file.read_text("utf-8").strip())


def _config(wanted: ImageRef, annotations: Mapping[str, str]) -> bytes:
    """The config blob: the annotations, and the tag (one manifest per reference)."""
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()):
        raise RegistryError("invalid", "snapshot annotations are text keys and text values")
    return json.dumps({"annotations": dict(annotations), "tag": wanted.tag},
                      sort_keys=True).encode()


def _archive(layer_dir: Path, blob: Path, settings: Settings) -> Path:
    """The layer directory as one compressed POSIX tar (see the module's docstring)."""
    tools.tool("zstd")  # tar would say only that its compressor failed
    tools.capture([tools.tool("tar"), "--create", f"--file={blob}",
                   f"--use-compress-program={COMPRESSOR}", "--format=posix",
                   "--pax-option=delete=atime,delete=ctime", "--sort=name", "--sparse",
                   *_TAR_ATTRIBUTES, f"--directory={layer_dir}", "."],
                  f"archiving the snapshot layer {layer_dir}", settings,
                  tools.LONG_TIMEOUT_S, env=_tar_env())
    return blob


_TAR_ATTRIBUTES = ("--numeric-owner", "--acls", "--xattrs",
                   *(f"--xattrs-include={pattern}" for pattern in XATTRS))


def _tar_env() -> dict[str, str]:
    """tar's environment: listings in the C locale (bytes past ASCII quoted as octal)."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"}


def _write_layout(layout: Path, blob: Path, config: bytes) -> str:
    """An OCI layout of one snapshot manifest (tag LAYOUT_TAG): the layer `blob` (moved
    in), `config`; the manifest's digest."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    layer = _file_digest(blob)
    os.rename(blob, blobs / layer.removeprefix("sha256:"))
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": ARTIFACT_TYPE,
        "config": _put(blobs, config, CONFIG_MEDIA_TYPE),
        "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": layer,
                    "size": (blobs / layer.removeprefix("sha256:")).stat().st_size}],
    }).encode()
    entry = {**_put(blobs, manifest, OCI_MANIFEST),
             "annotations": {"org.opencontainers.image.ref.name": LAYOUT_TAG}}
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}', encoding="utf-8")
    (layout / "index.json").write_text(json.dumps(
        {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry]}), encoding="utf-8")
    return str(entry["digest"])


def _put(blobs: Path, data: bytes, media_type: str) -> dict[str, str | int]:
    """Store a small blob; its descriptor."""
    digest = digest_of(data)
    (blobs / digest.removeprefix("sha256:")).write_bytes(data)
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def _file_digest(path: Path) -> str:
    with open(path, "rb") as handle:
        return f"sha256:{hashlib.file_digest(handle, 'sha256').hexdigest()}"


# --------------------------------------------------------------------------- pull


def pull(ref: str, dest: Path, settings: Settings) -> str:
    """Copy snapshot `ref` from the registry and unpack its layer as `dest` (which must
    not exist; its parent must), every owner, mode, extended attribute and whiteout as
    pushed; the manifest's digest. Whole or not at all (see the module's docstring)."""
    wanted = _reference(ref)
    _check_dest(dest)
    with _as_snapshot_error(), _scratch(dest, "pull") as work:
        layout = work / "layout"
        tools.capture([tools.tool("skopeo"), "copy", "--quiet", "--retry-times", "2",
                       "--preserve-digests",
                       *tools.registry_flags(settings, wanted.domain, "src-"), "--",
                       wanted.transport, f"oci:{layout}:{LAYOUT_TAG}"],
                      f"pulling snapshot {wanted.canonical} from the registry "
                      f"{wanted.domain}", settings, tools.LONG_TIMEOUT_S, noun="snapshot")
        digest, blob, program = _layer_of(layout, wanted)
        check_members(_listing(blob, program, settings), wanted.canonical)
        tree = work / "tree"
        tree.mkdir(mode=0o700)
        _unpack(blob, program, tree, settings, wanted.canonical)
        _place(tree, dest)
        return digest


def extract_argv(blob: Path, program: str, tree: Path) -> list[str]:
    """tar unpacking a layer into `tree` as root: owners by number, modes with their
    setuid bits, the extended attributes of XATTRS, ACLs, devices (its own guards on:
    see the module's docstring, step 3)."""
    return [tools.tool("tar"), "--extract", f"--file={blob}",
            f"--use-compress-program={program}", f"--directory={tree}", "--same-owner",
            "--same-permissions", *_TAR_ATTRIBUTES]


def _unpack(blob: Path, program: str, tree: Path, settings: Settings, what: str) -> None:
    """Extract the checked layer; a failure says how much room was left (tar reports a
    full disk as a short write)."""
    try:
        tools.capture(extract_argv(blob, program, tree), f"unpacking snapshot {what}",
                      settings, tools.LONG_TIMEOUT_S, env=_tar_env())
    except ImageError as exc:
        free = shutil.disk_usage(tree).free
        raise RegistryError(exc.kind, f"{exc.message} ({free / 2**20:.1f} MiB free in "
                            f"{tree.parent.parent})") from None


def _check_dest(dest: Path) -> None:
    if os.path.lexists(dest):
        raise RegistryError("invalid", f"{dest} exists already: a snapshot is pulled into a "
                            "new directory")
    if not dest.parent.is_dir():
        raise RegistryError("invalid", f"no directory {dest.parent} to pull a snapshot into")


def _layer_of(layout: Path, wanted: ImageRef) -> tuple[str, Path, str]:
    """(the manifest's digest, the layer blob, its decompressor) of the snapshot a
    layout holds, every digest checked; RegistryError `invalid` when it is no snapshot."""
    blobs = layout / "blobs" / "sha256"
    try:
        entry = json.loads((layout / "index.json").read_bytes())["manifests"][0]
        digest = checked_digest(entry["digest"])
        raw = (blobs / digest.removeprefix("sha256:")).read_bytes()
        manifest = json.loads(raw)
        kind, config = manifest["mediaType"], manifest["config"]["mediaType"]
        layers = manifest["layers"]
        media = [layer["mediaType"] for layer in layers]
        layer, size = checked_digest(layers[0]["digest"]), int(layers[0]["size"])
    except (OSError, ValueError, LookupError, TypeError, ImageError):
        raise RegistryError("invalid", f"{wanted.canonical} is no snapshot: its manifest "
                            "is malformed") from None
    if digest_of(raw) != digest or wanted.digest not in (None, digest):
        raise RegistryError("invalid", f"{wanted.canonical}: the registry answered a "
                            f"manifest of another digest ({digest_of(raw)})")
    if (kind != OCI_MANIFEST or config != CONFIG_MEDIA_TYPE or len(media) != 1
            or media[0] not in DECOMPRESSORS):
        raise RegistryError("invalid", f"{wanted.canonical} is no snapshot (config "
                            f"{str(config)[:80]}, layers {', '.join(map(str, media))[:160]})")
    blob = blobs / layer.removeprefix("sha256:")
    if not blob.is_file() or blob.stat().st_size != size or _file_digest(blob) != layer:
        raise RegistryError("invalid", f"{wanted.canonical}: its layer does not match the "
                            f"digest its manifest names ({layer})")
    return digest, blob, DECOMPRESSORS[media[0]]


def _listing(blob: Path, program: str, settings: Settings) -> list[str]:
    """The members of an archive as GNU tar reads them, one line each."""
    out = tools.capture([tools.tool("tar"), "--list", "--verbose", "--numeric-owner",
                         "--quoting-style=c", f"--use-compress-program={program}",
                         f"--file={blob}"], "listing a snapshot's layer", settings,
                        tools.LONG_TIMEOUT_S, env=_tar_env())
    return [line for line in out.decode("latin-1").split("\n") if line]


def _place(tree: Path, dest: Path) -> None:
    """Rename the unpacked layer into place (at once: `dest` is whole or absent)."""
    try:
        os.rename(tree, dest)
    except OSError as exc:
        raise RegistryError("invalid", f"{dest} appeared while the snapshot was pulled: "
                            f"{exc.strerror}") from None


# ---------------------------------------------------------------- member checks


@dataclass(frozen=True)
class Member:
    """One member of a layer archive, as `tar --list --verbose` shows it."""

    kind: str
    """`-` file, `d` directory, `l` symlink, `h` hard link, `p` FIFO, `c` character
    device (others are refused)."""
    name: str
    size: str
    """Bytes, or `major,minor` for a device."""
    target: str | None
    """A symlink's target or a hard link's member."""


def parse_listing(line: str) -> Member:
    """One line of the listing; RegistryError `invalid` for one it cannot read."""
    found = _LISTED.match(line)
    if found is None:
        raise RegistryError("invalid", f"unreadable member in the layer: {line[:160]!r}")
    how, target = found["how"], found["target"]
    if (found["type"] == "l") != (how == "->") or (found["type"] == "h") != (how == "link to"):
        raise RegistryError("invalid", f"unreadable member in the layer: {line[:160]!r}")
    return Member(found["type"], _unquote(found["name"]), found["size"].replace(" ", ""),
                  None if target is None else _unquote(target))


def _unquote(quoted: str) -> str:
    """A C-quoted name as the file system's text (bytes past ASCII as surrogates)."""
    def byte(found: re.Match[str]) -> str:
        if found[1]:
            return chr(int(found[1], 8))
        return chr(_ESCAPES.get(found[2], ord(found[2])))
    text = re.sub(r"\\(?:([0-7]{1,3})|(.))", byte, quoted[1:-1])
    return os.fsdecode(text.encode("latin-1"))


def check_members(lines: Sequence[str], what: str) -> None:
    """Refuse (RegistryError `invalid`, naming the member) a layer whose extraction
    could reach outside its directory or make what no layer holds (the rules of the
    module's docstring, step 2)."""
    dirs: set[str] = {""}  # the layer itself, whether or not it is a member
    others: set[str] = set()
    seen: set[str] = set()
    for line in lines:
        member = parse_listing(line)
        path = _member_path(member.name, member.kind, what)
        if path in seen:
            _refuse(what, member.name, "appears twice")
        seen.add(path)
        if path and path.rpartition("/")[0] not in dirs:
            _refuse(what, member.name, "is not under a directory of the layer")
        _check_kind(member, path, others, what)
        (dirs if member.kind == "d" else others).add(path)


def _member_path(name: str, kind: str, what: str) -> str:
    """A member's path relative to the layer (`""`: the layer itself)."""
    if name.startswith("/"):
        _refuse(what, name, "is absolute")
    text = "" if name in (".", "./") else name.removeprefix("./")
    if text.endswith("/"):
        if kind != "d":
            _refuse(what, name, "ends with / but is no directory")
        text = text[:-1]
    if text and any(part in ("", ".", "..") for part in text.split("/")):
        _refuse(what, name, "has an empty, `.` or `..` component")
    if not text and kind != "d":
        _refuse(what, name, "is the layer itself but no directory")
    return text


def _check_kind(member: Member, path: str, others: set[str], what: str) -> None:
    if member.kind not in _TYPES:
        _refuse(what, member.name, f"is of a type no layer holds ({member.kind})")
    if member.kind == "c" and member.size != "0,0":
        _refuse(what, member.name, f"is a device ({member.size}), not a whiteout (0,0)")
    if member.kind == "h" and (member.target is None or member.target.removeprefix("./")
                               not in others):
        _refuse(what, member.name, "is a hard link to no earlier file of the layer")
    if member.kind == "l" and member.target is not None and _climbs_out(path, member.target):
        _refuse(what, member.name, f"is a symlink out of the layer ({member.target[:80]})")


def _climbs_out(path: str, target: str) -> bool:
    """A relative symlink target that, read from the link's directory, goes above the
    layer (an absolute target stays: it resolves within a workspace's root)."""
    if target.startswith("/"):
        return False
    depth = path.count("/")  # the link's directory's depth below the layer
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


def _refuse(what: str, name: str, why: str) -> None:
    raise RegistryError("invalid", f"{what}: refused to unpack: member {name[:160]!r} {why}")


# ------------------------------------------------------------------------- delete


def delete(ref: str, settings: Settings) -> bool:
    """Delete snapshot `ref` from the registry (its manifest: the registry's own garbage
    collection frees the blobs); False when the registry has no such snapshot."""
    wanted = _reference(ref)
    try:
        with _as_snapshot_error():
            tools.capture([tools.tool("skopeo"), "delete", "--retry-times", "2",
                           *tools.registry_flags(settings, wanted.domain), "--",
                           wanted.transport],
                          f"deleting snapshot {wanted.canonical} from the registry "
                          f"{wanted.domain}", settings, noun="snapshot")
    except RegistryError as exc:
        if exc.kind == "not_found":
            return False
        raise
    return True


# ------------------------------------------------------------------------ helpers


def _reference(ref: str) -> ImageRef:
    with _as_snapshot_error():
        return parse_ref(ref)


@contextlib.contextmanager
def _as_snapshot_error() -> Iterator[None]:
    """The image tools' errors (the runner, the reference checks) as RegistryError."""
    try:
        yield
    except ImageError as exc:
        raise RegistryError(exc.kind, exc.message) from None


@contextlib.contextmanager
def _scratch(beside: Path, what: str) -> Iterator[Path]:
    """A fresh 0700 directory beside `beside` (same file system: a rename away),
    removed whole when the block ends, however it ends."""
    path = beside.parent / f".{beside.name}.{what}-{uuid.uuid4().hex}"
    if ":" in str(path):  # skopeo's `oci:<path>:<tag>` would end the path there
        raise RegistryError("invalid", f"a snapshot cannot travel through {beside.parent}: "
                            "its path has a `:`")
    try:
        path.mkdir(mode=0o700)
    except OSError as exc:
        raise RegistryError("unavailable", f"cannot make a directory beside {beside}: "
                            f"{exc.strerror}") from None
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
