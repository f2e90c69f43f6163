"""A real OCI registry and real images for the image tests, with nothing from outside.

`Registry`: Debian's `docker-registry` (distribution v2) on 127.0.0.1, a free port, TLS
from a certificate made here (its own CA, SAN IP:127.0.0.1), htpasswd auth (bcrypt),
storage in a temporary directory; started and ended by its pid; ready when an HTTPS
GET of /v2/ answers 401 (it asks for credentials), never after a bare sleep.

`image_layout()`: the images the tests pull, made on this machine (mmdebstrap from the
machine's own apt sources, umoci) once per recipe and kept under IMAGES_CACHE between
runs, behind a file lock so two sessions do not make them twice:

    debian   Debian bookworm minbase (bash), Env PATH, Cmd bash
    nobash   dash alone as /bin/sh (and a /bin/bash symlink to a path the image
             lacks but the host has: the shell is looked up inside the image)
    user     debian with USER 1000, WORKDIR /work, ENV GREETING=hello
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bashfleet.worker.engine.images.image_meta import host_platform
from bashfleet.worker.settings import Settings

#: Where the test images are kept between runs; bump RECIPE when the recipe changes.
IMAGES_CACHE = Path("/var/tmp/bashfleet-test-images")
RECIPE = "v1"
#: Seconds the registry gets to answer.
READY_TIMEOUT_S = 20.0
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def free_port() -> int:
    """A port nothing listens on now, on 127.0.0.1."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def run(*argv: str, cwd: Path | None = None) -> str:
    """Run a tool; its stdout; AssertionError with its stderr when it fails."""
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise AssertionError(f"{argv[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


class Registry:
    """One docker-registry process with TLS and basic auth (see the module's docstring)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.username = "bashfleet"
        self.password = secrets.token_urlsafe(16)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """`host:port`, as image references name it."""
        return f"127.0.0.1:{self.port}"

    @property
    def ca_cert(self) -> Path:
        """The CA certificate that signs the registry's (self-signed: it is its own)."""
        return self.base / "certs" / "ca.crt"

    @property
    def certs_dir(self) -> Path:
        """A directory of CA certificates (`*.crt`), as skopeo's --cert-dir wants."""
        return self.base / "certs"

    @property
    def auth_file(self) -> Path:
        """A Docker config.json with the right credentials (Settings.registry_auth_file)."""
        return self.base / "auth.json"

    def write_auth_file(self, path: Path, password: str | None = None) -> Path:
        """A config.json for this registry (another password: a wrong one)."""
        token = base64.b64encode(f"{self.username}:{password or self.password}".encode())
        path.write_text(json.dumps({"auths": {self.url: {"auth": token.decode()}}}))
        path.chmod(0o600)
        return path

    def settings(self, state_dir: Path, **more: Any) -> Settings:
        """Worker settings that pull from this registry with its credentials."""
        return Settings(state_dir=state_dir, registry_auth_file=self.auth_file,
                        registry_certs_dir=self.certs_dir, **more)

    def start(self) -> Registry:
        """Make its certificate, password file and config; start it; wait until ready."""
        (self.base / "data").mkdir(parents=True, exist_ok=True)
        self.certs_dir.mkdir(parents=True, exist_ok=True)
        key = self.base / "registry.key"
        run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
            "-out", str(self.ca_cert), "-days", "2", "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1")
        (self.base / "htpasswd").write_text(
            run("htpasswd", "-Bbn", self.username, self.password))
        self.write_auth_file(self.auth_file)
        config = self.base / "config.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "version": 0.1, "log": {"level": "info"},
            "storage": {"filesystem": {"rootdirectory": str(self.base / "data")},
                        "delete": {"enabled": True}},
            "http": {"addr": self.url, "secret": secrets.token_hex(16),
                     "tls": {"certificate": str(self.ca_cert), "key": str(key)}},
            "auth": {"htpasswd": {"realm": "bashfleet-tests",
                                  "path": str(self.base / "htpasswd")}},
        }))
        with open(self.base / "registry.log", "ab") as log:
            self.proc = subprocess.Popen(
                ["docker-registry", "serve", str(config)], stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        deadline = time.monotonic() + READY_TIMEOUT_S
        delay = 0.02
        while not self._asks_for_credentials(context):
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"docker-registry exited: {self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"docker-registry not ready: {self.log()}")
            time.sleep(delay)  # polling a condition, with a deadline
            delay = min(delay * 1.5, 0.2)

    def _asks_for_credentials(self, context: ssl.SSLContext) -> bool:
        try:
            urllib.request.urlopen(f"https://{self.url}/v2/", context=context, timeout=2)
        except urllib.error.HTTPError as exc:
            return exc.code == 401
        except OSError:
            return False
        return False

    def log(self) -> str:
        """What it logged (the end of it)."""
        with contextlib.suppress(OSError):
            return (self.base / "registry.log").read_text(errors="replace")[-4000:]
        return ""

    def layer_downloads(self) -> int:
        """How many layers were served whole: GETs of a blob answered 200 with more than
        64 KiB (a config, a few hundred bytes, is fetched at every copy)."""
        count = 0
        for line in self.log_lines():
            words = line.split('" 200 ')
            if '"GET /v2/' in line and "/blobs/sha256:" in line and len(words) == 2:
                size = words[1].split()[0]
                count += size.isdigit() and int(size) > 64 * 1024
        return count

    def log_lines(self) -> list[str]:
        with contextlib.suppress(OSError):
            return (self.base / "registry.log").read_text(errors="replace").splitlines()
        return []

    def stop(self) -> None:
        """End it by its pid (SIGTERM, then SIGKILL), and wait for it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def push(self, layout: Path, tag: str, name: str, *, docker_format: bool = False) -> str:
        """Copy `layout:tag` to this registry as `name` (with `docker_format`, as a Docker
        v2s2 manifest, as Docker Hub's images are); the reference."""
        ref = f"{self.url}/{name}"
        form = ["--format", "v2s2"] if docker_format else []
        run("skopeo", "copy", "--quiet", *form, "--dest-creds",
            f"{self.username}:{self.password}", "--dest-cert-dir", str(self.certs_dir),
            f"oci:{layout}:{tag}", f"docker://{ref}")
        return ref


# -------------------------------------------------------------------- test images


def image_layout() -> Path:
    """The OCI layout holding the test images (tags debian, nobash, user), made once per
    recipe on this machine and kept between runs."""
    done = IMAGES_CACHE / RECIPE / "oci"
    if (done / "index.json").exists():
        return done
    IMAGES_CACHE.mkdir(parents=True, exist_ok=True)
    with open(IMAGES_CACHE / f"{RECIPE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be making them
        if not (done / "index.json").exists():
            _make_images(IMAGES_CACHE / RECIPE)
    return done


def _make_images(target: Path) -> None:
    """Make the layout in a fresh directory, then rename it into place (whole or not
    at all)."""
    work = IMAGES_CACHE / f"{RECIPE}.tmp-{uuid.uuid4().hex}"
    work.mkdir()
    try:
        layout = work / "oci"
        run("umoci", "init", "--layout", str(layout))
        _debian(work, layout)
        _nobash(work, layout)
        run("umoci", "config", "--image", f"{layout}:debian", "--tag", "user",
            "--config.user", "1000", "--config.workingdir", "/work",
            "--config.env", "GREETING=hello")
        shutil.rmtree(work / "bundle", ignore_errors=True)
        (work / "bookworm.tar").unlink(missing_ok=True)
        if target.exists():
            shutil.rmtree(target)
        work.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _debian(work: Path, layout: Path) -> None:
    """Debian bookworm minbase from the machine's own apt sources."""
    tarball = work / "bookworm.tar"
    run("mmdebstrap", "--quiet", "--variant=minbase", "bookworm", str(tarball))
    bundle = _new_image(work, layout, "debian")
    run("tar", "-C", str(bundle / "rootfs"), "--numeric-owner", "-xpf", str(tarball))
    _finish(work, layout, "debian", "bash")


def _nobash(work: Path, layout: Path) -> None:
    """A root with dash (and the libraries it loads) as /bin/sh, and no bash."""
    bundle = _new_image(work, layout, "nobash")
    root = bundle / "rootfs"
    dash = Path(os.path.realpath("/usr/bin/dash"))
    for path in [dash, *_libraries(dash)]:
        copy = root / str(path).lstrip("/")
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(path), copy)
    (root / "bin").mkdir(exist_ok=True)
    (root / "bin" / "sh").symlink_to(f"/{dash.relative_to('/')}")
    # The host has /usr/bin/bash; the image does not: a shell looked up on the host
    # would wrongly find bash here.
    (root / "bin" / "bash").symlink_to("/usr/bin/bash")
    (root / "tmp").mkdir(mode=0o1777)
    _finish(work, layout, "nobash", "sh")


def _libraries(binary: Path) -> list[Path]:
    """The shared libraries a binary loads, and its loader (from ldd)."""
    found = []
    for line in run("ldd", str(binary)).splitlines():
        words = line.split()
        path = words[2] if "=>" in words and len(words) > 2 else words[0]
        if path.startswith("/"):
            found.append(Path(path))
    return found


def _new_image(work: Path, layout: Path, tag: str) -> Path:
    """An empty image `tag` in the layout, unpacked into a bundle to fill."""
    bundle = work / "bundle"
    shutil.rmtree(bundle, ignore_errors=True)
    run("umoci", "new", "--image", f"{layout}:{tag}")
    run("umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle))
    return bundle


def _finish(work: Path, layout: Path, tag: str, shell: str) -> None:
    """Repack the bundle as the image's one layer; set its config."""
    run("umoci", "repack", "--image", f"{layout}:{tag}", str(work / "bundle"))
    run("umoci", "config", "--image", f"{layout}:{tag}", "--os", "linux",
        "--architecture", host_platform().architecture, "--config.env", PATH_ENV,
        "--config.cmd", shell)


def pushed_images(registry: Registry) -> dict[str, str]:
    """The test images pushed to `registry`: their references by tag."""
    layout = image_layout()
    return {tag: registry.push(layout, tag, f"bashfleet/{name}")
            for tag, name in (("debian", "debian:bookworm"), ("nobash", "nobash:1"),
                              ("user", "user:1"))}


@contextlib.contextmanager
def running_registry(base: Path) -> Iterator[Registry]:
    """A registry for a `with` block, always ended."""
    registry = Registry(base)
    try:
        yield registry.start()
    finally:
        registry.stop()
