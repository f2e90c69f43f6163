"""What an image is, decided without running a tool: references, platforms, manifests,
configs, the shell a root filesystem offers, and which held images to collect.

Everything here is pure (or reads only inside a root filesystem it is given), so the
store (`bashfleet.worker.engine.images.images`) stays a sequence of tool runs and renames, and these
decisions are tested by tables and properties.

A reference is checked before any tool sees it: a registry reference only (never a
transport such as `dir:/etc`, which would read the host), no whitespace, no leading
`-` (it would become a flag), at most 1024 characters. The grammar is the registry's
own (distribution's `reference` package): `[domain[:port]/]path[:tag][@sha256:hex]`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import stat
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bashfleet.worker.wire.errors import ErrorKind, ToolError
from bashfleet.worker.wire.models import ImageInfo

#: Longest reference taken (a registry allows 255 for the name; tags and digests add).
MAX_REF_LENGTH = 1024
#: Where an unqualified name lives (`debian` is `docker.io/library/debian`).
DEFAULT_DOMAIN = "docker.io"
#: Symlinks followed, at most, resolving a path inside an image (the kernel's own limit).
MAX_SYMLINKS = 40

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|-+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"sha256:[0-9a-f]{64}"
_REFERENCE = re.compile(
    rf"^(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?$"
)
_DIGEST_ONLY = re.compile(rf"^{_DIGEST}$")

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"

Shell = Literal["bash", "sh"]


class ImageError(ToolError):
    """An image could not be found, pulled, built, unpacked or removed: `kind` says
    why (`invalid`: a malformed reference or context, or an image in use; `not_found`:
    no such image or tag; `unavailable`: the registry unreachable or refusing this
    host's credentials, or a tool missing)."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(kind, message)


# ---------------------------------------------------------------------- references


@dataclass(frozen=True)
class ImageRef:
    """A checked registry reference, in its canonical spelling."""

    domain: str
    """The registry (`docker.io`, `127.0.0.1:5000`)."""
    path: str
    """The repository within it (`library/debian`)."""
    tag: str | None
    digest: str | None
    """`sha256:...` when the reference pins one."""

    @property
    def name(self) -> str:
        """`domain/path`: the repository, without tag or digest."""
        return f"{self.domain}/{self.path}"

    @property
    def canonical(self) -> str:
        """`domain/path[:tag][@digest]`: the one spelling of every way to write it."""
        tag = f":{self.tag}" if self.tag else ""
        digest = f"@{self.digest}" if self.digest else ""
        return f"{self.name}{tag}{digest}"

    def pinned(self, digest: str) -> str:
        """The transport reference of one manifest of this repository (what is copied:
        the tag cannot move between resolving it and copying it)."""
        return f"docker://{self.name}@{digest}"

    @property
    def transport(self) -> str:
        """What skopeo is given: always the registry transport, never another."""
        return f"docker://{self.canonical}"


def check_text(ref: object) -> str:
    """A reference's text, refused (`invalid`) when it could be anything but a name:
    not a string, empty, longer than MAX_REF_LENGTH, with whitespace or a control
    character, or starting with `-` (it would reach a tool as a flag)."""
    if not isinstance(ref, str) or not ref:
        raise ImageError("invalid", "an image reference is required")
    shown = ref[:80] + ("..." if len(ref) > 80 else "")
    if len(ref) > MAX_REF_LENGTH:
        raise ImageError("invalid", f"image reference too long ({len(ref)} characters, "
                         f"at most {MAX_REF_LENGTH}): {shown!r}")
    if any(ch.isspace() or not ch.isprintable() for ch in ref):
        raise ImageError("invalid", f"image reference with whitespace or a control "
                         f"character: {shown!r}")
    if ref.startswith("-"):
        raise ImageError("invalid", f"image reference starting with '-': {shown!r}")
    return ref


def parse_ref(ref: object) -> ImageRef:
    """A reference as the registry reads it (`debian` is `docker.io/library/debian:latest`);
    ImageError `invalid`, saying what is wrong, for anything else."""
    text = check_text(ref).removeprefix("docker://")
    found = _REFERENCE.match(text)
    if found is None:
        raise ImageError("invalid", f"not an image reference: {text[:80]!r} (expected "
                         "[registry/]name[:tag][@sha256:digest], lower-case name)")
    domain, path = found["domain"], found["path"]
    if domain is not None and not _is_domain(domain):
        domain, path = None, f"{domain}/{path}"  # `user/repo`: a path, on Docker Hub
    if domain is None:
        domain = DEFAULT_DOMAIN
    if domain == DEFAULT_DOMAIN and "/" not in path:
        path = f"library/{path}"
    if not _REFERENCE.match(path):
        raise ImageError("invalid", f"not an image reference: {text[:80]!r}")
    tag = found["tag"] or (None if found["digest"] else "latest")
    return ImageRef(domain, path, tag, found["digest"])


def _is_domain(first: str) -> bool:
    """The first component names a registry (distribution's rule): it has a dot or a
    port, or is `localhost`, or has an upper-case letter (no path component may)."""
    return "." in first or ":" in first or first == "localhost" or first != first.lower()


def is_digest(text: str) -> bool:
    """`sha256:` and 64 lower-case hex digits."""
    return bool(_DIGEST_ONLY.match(text))


def digest_hex(digest: str) -> str:
    """The hex part of a sha256 digest (what names files); ValueError for another."""
    if not is_digest(digest):
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return digest.removeprefix("sha256:")


def digest_of(data: bytes) -> str:
    """The sha256 digest of some bytes, as a registry writes it."""
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


# ----------------------------------------------------------------------- platforms


@dataclass(frozen=True)
class Platform:
    """An OS and architecture as OCI names them (`linux`, `amd64`, variant `v8`)."""

    os: str
    architecture: str
    variant: str | None = None


#: `platform.machine()` -> (OCI architecture, variant).
_MACHINES = {
    "x86_64": ("amd64", None), "amd64": ("amd64", None), "aarch64": ("arm64", None),
    "arm64": ("arm64", None), "armv7l": ("arm", "v7"), "armv6l": ("arm", "v6"),
    "i686": ("386", None), "i386": ("386", None), "ppc64le": ("ppc64le", None),
    "s390x": ("s390x", None), "riscv64": ("riscv64", None),
}


def host_platform(machine: str | None = None) -> Platform:
    """This host's platform, which every pull asks for explicitly."""
    name = machine or platform.machine()
    architecture, variant = _MACHINES.get(name, (name, None))
    return Platform("linux", architecture, variant)


def choose_manifest(raw: bytes, wanted: Platform) -> tuple[str, str | None]:
    """(the digest of the manifest to pull, the digest of the index it was chosen
    from or None) from what the registry answered for a reference: an index (a
    multi-platform list) gives its entry for `wanted`, a manifest its own digest.
    ImageError `not_found` when the index has no entry for this platform."""
    top = digest_of(raw)
    document = _json_object(raw, "manifest")
    if document.get("mediaType") not in (OCI_INDEX, DOCKER_LIST) and "manifests" not in document:
        return top, None
    entries = [m for m in document.get("manifests", []) if isinstance(m, dict)]
    for entry in entries:
        found = entry.get("platform") or {}
        if (found.get("os") == wanted.os and found.get("architecture") == wanted.architecture
                and (wanted.variant is None or found.get("variant") in (None, wanted.variant))):
            return checked_digest(entry.get("digest")), top
    offered = sorted({f"{(e.get('platform') or {}).get('os')}/"
                      f"{(e.get('platform') or {}).get('architecture')}" for e in entries})
    raise ImageError("not_found", f"no {wanted.os}/{wanted.architecture} image in it "
                     f"(it offers {', '.join(offered) or 'none'})")


# ------------------------------------------------------------------------- configs


@dataclass(frozen=True)
class ImageConfig:
    """What a workspace takes from an image's config: its environment, working
    directory and user (as the image spells them)."""

    env: tuple[str, ...] = ()
    workdir: str = ""
    user: str = ""


def layers_of(manifest: bytes) -> tuple[str, list[tuple[str, int]]]:
    """(config digest, [(layer digest, size)]) of an image manifest."""
    document = _json_object(manifest, "manifest")
    config = document.get("config") or {}
    layers = [(checked_digest(layer.get("digest")), int(layer.get("size", 0)))
              for layer in document.get("layers", []) if isinstance(layer, dict)]
    return checked_digest(config.get("digest")), layers


def checked_digest(value: object) -> str:
    """A digest a document names (a registry's, a layout's): sha256 only, the store's
    files are named by it; ImageError `invalid` for another."""
    if not isinstance(value, str) or not is_digest(value):
        raise ImageError("invalid", f"unsupported digest in the image's manifest: "
                         f"{str(value)[:80]!r} (only sha256)")
    return value


def parse_config(raw: bytes) -> ImageConfig:
    """The parts of an OCI (or Docker) image config a workspace uses; absent fields are
    empty, malformed ones refused (`invalid`)."""
    document = _json_object(raw, "image config")
    config = document.get("config")
    config = {} if config is None else config
    if not isinstance(config, dict):
        raise ImageError("invalid", "malformed image config: `config` is not an object")
    env = config.get("Env") or []
    if not isinstance(env, list) or not all(isinstance(item, str) for item in env):
        raise ImageError("invalid", "malformed image config: `Env` is not a list of text")
    return ImageConfig(tuple(env), str(config.get("WorkingDir") or ""),
                       str(config.get("User") or ""))


def _json_object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        document = json.loads(raw)
    except ValueError:
        raise ImageError("invalid", f"malformed {what}: not JSON") from None
    if not isinstance(document, dict):
        raise ImageError("invalid", f"malformed {what}: not a JSON object")
    return document


# -------------------------------------------------------------------------- shells


def resolve_within(root: Path, path: str) -> Path | None:
    """Where `path` leads inside the root filesystem `root`, symlinks followed as the
    image's own processes would see them: an absolute target starts again at `root`,
    `..` stops at it. None when a component is missing or the links loop. The host's
    own files are never reached (no path is handed to the OS to resolve)."""
    parts = deque(path.split("/"))
    current: list[str] = []
    links = 0
    while parts:
        part = parts.popleft()
        if part in ("", "."):
            continue
        if part == "..":
            if current:
                current.pop()
            continue
        candidate = root.joinpath(*current, part)
        try:
            info = os.lstat(candidate)
        except OSError:
            return None
        if stat.S_ISLNK(info.st_mode):
            links += 1
            if links > MAX_SYMLINKS:
                return None
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = []
            parts.extendleft(reversed(target.split("/")))
            continue
        current.append(part)
    return root.joinpath(*current)


def shell_of(root: Path) -> Shell:
    """`bash` when the image has an executable `/bin/bash` (a regular file with an
    execute bit, reached through the image's own symlinks), else `sh`."""
    found = resolve_within(root, "/bin/bash")
    if found is None:
        return "sh"
    try:
        info = os.lstat(found)
    except OSError:
        return "sh"
    return "bash" if stat.S_ISREG(info.st_mode) and info.st_mode & 0o111 else "sh"


# ---------------------------------------------------------------------- collection


def last_used(info: ImageInfo) -> float:
    """When an image was last used (its pull, when never since)."""
    return info.last_used_at if info.last_used_at is not None else info.pulled_at


def to_collect(
    infos: Sequence[ImageInfo], *, now: float, max_age_s: float, max_bytes: int,
    in_use: Iterable[str], min_age_s: float = 0.0,
) -> list[ImageInfo]:
    """Which held images go, least recently used first: never one a workspace uses
    (`in_use`: digests) nor one used within `min_age_s` (a workspace being made with it
    has no record yet); those unused for `max_age_s`, then the least recently used of
    the rest until all of them take at most `max_bytes`."""
    busy = set(in_use)
    candidates = sorted(
        (info for info in infos
         if info.digest not in busy and now - last_used(info) >= min_age_s),
        key=lambda info: (last_used(info), info.digest),
    )
    remaining = sum(info.size_bytes for info in infos)
    chosen: list[ImageInfo] = []
    for info in candidates:
        if now - last_used(info) > max_age_s or remaining > max_bytes:
            chosen.append(info)
            remaining -= info.size_bytes
    return chosen
