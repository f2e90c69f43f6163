"""The image tools as the store runs them: skopeo (registries), umoci (unpacking) and
buildah (Dockerfiles): their command lines, one runner, and their failures in words a
user understands.

The tools are the containers project's own, made for the job; no registry protocol
or layer format is written here. Every command line is built from checked parts: a
reference reaches skopeo only as `docker://<checked reference>` after `--`, so no
reference becomes a flag or another transport.

Credentials are the worker's (`registry_auth_file`, a Docker `config.json`, handed to
the tools by path, never on a command line); a tool's message is shown to the user in
one line, with any secret of that file blanked out should a tool ever echo one.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from bashfleet.worker.engine.images.image_meta import ImageError, ImageRef, Platform
from bashfleet.worker.engine.mountinfo import unescape
from bashfleet.worker.settings import Settings

Progress = Callable[[str], None]

#: Seconds a registry gets to answer what a reference names (a manifest: small).
RESOLVE_TIMEOUT_S = 120.0
#: Seconds one pull, unpack or build may take (a large image on a slow link: long).
LONG_TIMEOUT_S = 3600.0
#: Bytes of a tool's stderr kept to explain its failure (the end of it says why).
STDERR_TAIL = 16 * 1024
#: Longest tool message shown to a user.
MAX_REASON = 400
#: umount2's flag: detach now, finish when no longer busy.
MNT_DETACH = 2

#: The Debian package of each tool, named when one is missing.
PACKAGES = {"skopeo": "skopeo", "umoci": "umoci", "buildah": "buildah", "tar": "tar",
            "zstd": "zstd", "gzip": "gzip"}

_NOT_FOUND = ("manifest unknown", "name unknown", "not found", "no such image",
              "repository name not known",
              "image may not exist")  # skopeo delete's words for a tag the registry lacks
_REFUSED = ("unauthorized", "authentication required", "denied", "forbidden",
            "invalid username/password", "incorrect username or password")


def tool(name: str) -> str:
    """The path of a tool; ImageError `unavailable` naming its Debian package when the
    host lacks it."""
    found = shutil.which(name)
    if found is None:
        raise ImageError("unavailable", f"{name} is not installed on this host: install "
                         f"the Debian package `{PACKAGES.get(name, name)}` "
                         f"(apt-get install {PACKAGES.get(name, name)})")
    return found


# ---------------------------------------------------------------- command lines


def registry_flags(settings: Settings, domain: str, prefix: str = "") -> list[str]:
    """The flags that reach `domain` with the worker's credentials and certificates
    (`prefix` `src-` for skopeo copy's source side)."""
    flags: list[str] = []
    if settings.registry_auth_file is not None:
        if not settings.registry_auth_file.is_file():
            raise ImageError("unavailable", "the registry credentials file this host is "
                             f"configured with is missing: {settings.registry_auth_file}")
        flags += [f"--{prefix}authfile", str(settings.registry_auth_file)]
    if settings.registry_certs_dir is not None:
        flags += [f"--{prefix}cert-dir", str(settings.registry_certs_dir)]
    if domain in settings.registry_insecure:
        flags.append(f"--{prefix}tls-verify=false")
    return flags


def inspect_argv(settings: Settings, ref: ImageRef) -> list[str]:
    """What the registry answers for a reference: its manifest or index, raw bytes."""
    return [tool("skopeo"), "inspect", "--raw", "--retry-times", "2",
            *registry_flags(settings, ref.domain), "--", ref.transport]


def copy_argv(settings: Settings, ref: ImageRef, digest: str, *, platform: Platform,
              blobs: Path, layout: Path) -> list[str]:
    """Copy one manifest of `ref`'s repository, for this platform, into an OCI layout
    whose blobs go to the host's shared blob directory (a blob already there is not
    downloaded again)."""
    variant = ["--override-variant", platform.variant] if platform.variant else []
    return [tool("skopeo"), "--override-os", platform.os, "--override-arch",
            platform.architecture, *variant, "copy", "--retry-times", "2",
            *registry_flags(settings, ref.domain, "src-"),
            "--dest-shared-blob-dir", str(blobs), "--", ref.pinned(digest), f"oci:{layout}:image"]


def unpack_argv(layout: Path, rootfs: Path) -> list[str]:
    """Unpack the image of a layout into `rootfs` (as root: its own ids, modes, setuid
    bits and device files, none shifted). `raw unpack`: the root alone, without the
    runtime bundle's mtree manifest (a hash of every file: measured 0.5 s of CPU and
    up to 3 s in all for Debian minbase on this 2-core machine, for nothing we use)."""
    return [tool("umoci"), "raw", "unpack", "--image", f"{layout}:image", str(rootfs)]


#: buildah's storage drivers, each with a storage of its own under the store (a storage
#: made by one driver is refused by the other).
DRIVERS = ("overlay", "vfs")


def build_driver(settings: Settings) -> str:
    """The storage driver of this host's builds. `vfs` when RUN steps run in a user
    namespace: buildah 1.28's overlay fails a COPY into a directory a RUN step changed
    there (EOVERFLOW chmod'ing it); vfs copies the whole root at each step instead
    (measured: 47 s against 11 s for a four-step build on Debian minbase, on this
    machine; builds are cached by content, and a Dockerfile need not be trusted)."""
    return "overlay" if settings.build_as_root else "vfs"


def buildah_argv(storage: Path, driver: str, *args: str) -> list[str]:
    """buildah on its storage under the image store (never /var/lib/containers)."""
    return [tool("buildah"), "--root", str(storage / driver / "root"), "--runroot",
            str(storage / driver / "run"), "--storage-driver", driver, *args]


def bud_args(settings: Settings, context: Path, dockerfile: Path, iidfile: Path,
             more: Sequence[str] = ()) -> list[str]:
    """`buildah bud`'s arguments: chroot isolation (no runtime: crun refuses this host's
    mixed cgroup hierarchy) in a user namespace of `build_ids`, layers kept for the
    next build, the worker's credentials for the base image; `more` from the build's
    namespaces (`build_isolation`)."""
    # --force-rm: a failed step's container goes too (else its overlay stays mounted).
    flags = ["bud", "--isolation", "chroot", "--layers", "--force-rm", "--iidfile", str(iidfile),
             "--file", str(dockerfile), *_build_ids_args(settings), *_registry_args(settings),
             *more]
    return [*flags, "--", str(context)]


def base_args(settings: Settings, ref: ImageRef) -> list[str]:
    """`buildah from`'s arguments that pull a build's base image ahead of the build:
    by the registry transport only (never a local path), with the worker's credentials,
    in the build's id mapping (an image `buildah pull` stores unmapped is one whose `/`
    a mapped RUN step cannot write). The container it makes is removed at once."""
    return ["from", "--quiet", *_build_ids_args(settings), *_registry_args(settings), "--",
            ref.transport]


def _build_ids_args(settings: Settings) -> list[str]:
    if settings.build_as_root:
        return []
    # RUN steps in a user namespace: root inside, an unprivileged id outside.
    first, count = settings.build_ids
    return ["--userns-uid-map", f"0:{first}:{count}", "--userns-gid-map", f"0:{first}:{count}"]


def _registry_args(settings: Settings) -> list[str]:
    flags = []
    if settings.registry_auth_file is not None:
        flags += ["--authfile", str(settings.registry_auth_file)]
    if settings.registry_certs_dir is not None:
        flags += ["--cert-dir", str(settings.registry_certs_dir)]
    return flags


def registries_conf(settings: Settings) -> str | None:
    """A registries.conf that marks the insecure registries (buildah takes TLS
    verification for all registries or none: this file says it per registry); None
    when there are none (the system's own file then applies)."""
    if not settings.registry_insecure:
        return None
    lines = ['unqualified-search-registries = ["docker.io"]', ""]
    for host in settings.registry_insecure:
        lines += ["[[registry]]", f"location = {json.dumps(host)}", "insecure = true", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------- running


def mounts_under(root: Path, mountinfo: str) -> list[str]:
    """The mount points at or under `root` in a /proc/self/mountinfo text, deepest first
    (the order they can be unmounted in)."""
    prefix = os.path.realpath(root)
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            point = unescape(fields[4])
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(set(found), key=lambda point: point.count("/"), reverse=True)


def unmount_under(root: Path) -> None:
    """Detach every mount at or under `root` (what buildah's overlay driver left)."""
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text(encoding="utf-8")
    except OSError:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for point in mounts_under(root, mountinfo):
        libc.umount2(point.encode(), MNT_DETACH)  # failure: rmtree reports what stays


def capture(argv: Sequence[str], what: str, settings: Settings,
            timeout: float = RESOLVE_TIMEOUT_S, *, env: dict[str, str] | None = None,
            noun: str = "image") -> bytes:
    """Run a tool for its output (exact bytes); ImageError from its failure (`noun`:
    what a registry that lacks the reference has no such thing of)."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=timeout, check=False, env=env)
    except subprocess.TimeoutExpired:
        raise ImageError("unavailable", f"{what}: no answer within {timeout:.0f}s") from None
    if done.returncode != 0:
        raise failure(what, done.stderr.decode("utf-8", "replace"), settings, noun=noun)
    return done.stdout


def stream(argv: Sequence[str], what: str, settings: Settings, progress: Progress, *,
           env: dict[str, str] | None = None, timeout: float = LONG_TIMEOUT_S) -> None:
    """Run a tool, its output's lines to `progress` as they come; ImageError from its
    failure. Interrupted (an exception in `progress`, the deadline), the tool is
    killed by its pid and waited for."""
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=errors, env=env, start_new_session=True)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            proc.kill()

        watchdog = threading.Timer(timeout, expire)
        watchdog.start()
        try:
            for line in proc.stdout or ():
                text = line.decode("utf-8", "replace").strip()
                if text:
                    progress(text)
            status = proc.wait()
        finally:
            watchdog.cancel()
            _end(proc)
        if expired.is_set():
            raise ImageError("unavailable", f"{what}: stopped after {timeout:.0f}s")
        if status != 0:
            errors.seek(max(0, errors.seek(0, os.SEEK_END) - STDERR_TAIL))
            raise failure(what, errors.read().decode("utf-8", "replace"), settings)


def _end(proc: subprocess.Popen[bytes]) -> None:
    """Kill a tool still running (by its pid: it is ours) and reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


# ---------------------------------------------------------------------- failures


def failure(what: str, stderr: str, settings: Settings, *, noun: str = "image") -> ImageError:
    """A tool's failure as an ImageError: its kind read from what the tool said (no such
    manifest: `not_found`; anything else, an unreachable or refusing registry included:
    `unavailable`), its reason in one line, with no secret of the credentials file."""
    reason = blank_secrets(one_line(stderr), settings)
    lowered = reason.lower()
    if _LOCAL_DENIAL.search(lowered) and not any(
            mark in _LOCAL_DENIAL.sub("", lowered) for mark in _REFUSED):
        # The tool could not open a file of this host (skopeo run as a user that may not
        # read `/run/containers/<uid>/auth.json`): nothing the registry said.
        return ImageError("unavailable", f"{what}: this host's worker may not use a file "
                          f"of its own that the pull needs (not a refusal of the registry): "
                          f"{reason}")
    if any(mark in lowered for mark in _REFUSED):
        return ImageError("unavailable", f"{what}: the registry refused this host's "
                          f"credentials: {reason}")
    if any(mark in lowered for mark in _NOT_FOUND):
        return ImageError("not_found", f"{what}: no such {noun}: {reason}")
    return ImageError("unavailable", f"{what}: {reason}")


_LOGRUS_MSG = re.compile(r'msg="((?:[^"\\]|\\.)*)"')
#: A tool's words for a local file it may not open, stat or make (`open /run/x: permission
#: denied`), told apart from a registry's `denied`.
_LOCAL_DENIAL = re.compile(r"\b(?:open|stat|lstat|mkdir|read|readlink|create|chmod|rename|"
                           r"remove|unlink)\s+/\S*:\s*permission denied")
#: The escapes of a logged message (Go's quoting): what each stands for.
_ESCAPED = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r"}
_TAR_SUMMARY = re.compile(r"tar: (Exiting with failure status due to previous errors|"
                          r"Error is not recoverable: exiting now)$")


def one_line(stderr: str) -> str:
    """The tool's reason, in one line: the last message it logged (skopeo and buildah
    log `level=fatal msg="..."`), else its last non-blank line (tar's closing summary
    skipped: the error it sums up is the line before)."""
    lines = [line.strip() for line in stderr.splitlines()
             if line.strip() and not _TAR_SUMMARY.search(line)]
    if not lines:
        return "the tool failed without saying why"
    last = lines[-1]
    found = _LOGRUS_MSG.search(last)
    if found:
        last = _ESCAPED.sub(lambda m: _ESCAPES.get(m[1], m[1]), found[1])
    # Its line breaks and tabs (a list of several errors) as spaces: one line, rendered.
    last = " ".join(last.split())
    # skopeo wraps every failure in the name it was parsing: the user knows the name.
    last = re.sub(r'^Error parsing image name "[^"]*": ', "", last)
    last = re.sub(r"^Error: ", "", last)
    return last if len(last) <= MAX_REASON else last[: MAX_REASON - 3] + "..."


def blank_secrets(text: str, settings: Settings) -> str:
    """`text` with every credential of the worker's auth file replaced by `***`."""
    for secret in credential_strings(settings.registry_auth_file):
        text = text.replace(secret, "***")
    return text


def credential_strings(path: Path | None) -> list[str]:
    """Every secret a Docker config.json holds (each `auth`, the password in it, an
    identity or registry token), longest first; none when it cannot be read."""
    if path is None:
        return []
    try:
        auths = json.loads(path.read_text(encoding="utf-8")).get("auths", {})
    except (OSError, ValueError, AttributeError):
        return []
    found: set[str] = set()
    for entry in auths.values() if isinstance(auths, dict) else []:
        if not isinstance(entry, dict):
            continue
        found.update(str(entry[name]) for name in ("auth", "password", "identitytoken",
                                                   "registrytoken") if entry.get(name))
        with contextlib.suppress(ValueError, TypeError):
            _, _, password = base64.b64decode(entry.get("auth", "")).decode().partition(":")
            if password:
                found.add(password)
    return sorted((s for s in found if len(s) >= 3), key=len, reverse=True)
