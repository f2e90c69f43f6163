"""The compose stack's worker image (deploy/Dockerfile), built and run under podman.

No Docker engine and no Docker Hub here, so:

- The base, `python:3.11-slim` on Docker Hub, is stood in for by Debian bookworm
  (mmdebstrap from the machine's own apt sources, as registry.py makes its images) with
  python3, pip and venv, imported into the test's own podman storage under the name the
  Dockerfile asks for (`docker.io/library/python:3.11-slim`): the Dockerfile is built
  as it is. Like the real base, its pip installs into the system (Debian's
  EXTERNALLY-MANAGED marker is left out: the real base, a Python built from source,
  has none) and `python` is Python 3. The machine's own CA certificates go in too:
  this machine reaches PyPI through a proxy that signs with them.
- podman runs with runc (crun refuses this host's hybrid cgroups) and cgroupfs (PID 1
  here is not systemd), its storage under /opt and its run state under /run, never
  under /var: other fleets' workers may run on this machine, and an overlay mounted
  under /var is what their host view once could not idmap.
- podman-compose 1.0.3 mishandles `network_mode: none`, so the worker service of
  docker-compose.yml is run with `podman run` and the options that service gives
  (`run_options`, read from the file at every run, so the two never drift apart).

The container runs without the image's HEALTHCHECK (podman schedules it with systemd
timers; systemd is not this machine's init) and on the host's network (the test's
Redis and registry listen on 127.0.0.1; see test_compose_worker.py).

The image is built once per source tree: its tag is a hash of the Dockerfile and of
every file its COPY lines take, and a tag already in the storage is used as it is
(the storage is kept between runs, behind a file lock, as registry.py keeps its
images).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from .registry import IMAGES_CACHE, Registry, _finish, _new_image, image_layout, run

ROOT = Path(__file__).resolve().parents[2]
#: podman's storage and run state, kept off /var (see the module's docstring).
PODMAN_HOME = Path("/opt/bashfleet-test-podman")
PODMAN_RUN = Path("/run/bashfleet-test-podman")
#: The name the Dockerfile's FROM line resolves to.
BASE_NAME = "docker.io/library/python:3.11-slim"
#: Bump when the base's recipe changes.
BASE_RECIPE = "v1"
IMAGE_REPO = "localhost/bashfleet-compose-test"
#: Seconds a podman command gets (a first build downloads Debian packages and wheels).
BUILD_TIMEOUT_S = 1500.0
#: What the tests add to every container: the limits podman needs given on this host.
ULIMITS = ("--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096")


class PodmanError(AssertionError):
    """A podman command failed: its arguments and the end of its stderr."""


def podman_base_args() -> list[str]:
    """podman's global options for the test's own storage."""
    return [
        "podman", "--root", str(PODMAN_HOME / "storage"), "--runroot", str(PODMAN_RUN),
        "--tmpdir", str(PODMAN_RUN / "libpod"), "--storage-driver", "overlay",
        "--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file",
    ]


def podman(*args: str, timeout: float = 120.0, check: bool = True) -> str:
    """Run podman on the test's storage; its stdout (PodmanError when it fails)."""
    env = {**os.environ, "TMPDIR": str(PODMAN_HOME / "tmp")}
    (PODMAN_HOME / "tmp").mkdir(parents=True, exist_ok=True)
    done = subprocess.run([*podman_base_args(), *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env=env, stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise PodmanError(f"podman {' '.join(args[:3])} failed ({done.returncode}): "
                          f"{done.stderr[-3000:]}")
    return done.stdout


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Held while the base or the image is made: two sessions never make them twice."""
    IMAGES_CACHE.mkdir(parents=True, exist_ok=True)
    with open(IMAGES_CACHE / "compose-worker.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def image_exists(name: str) -> bool:
    return subprocess.run(
        [*podman_base_args(), "image", "exists", name], capture_output=True, check=False,
        timeout=60, stdin=subprocess.DEVNULL,
    ).returncode == 0


# ------------------------------------------------------------------------------ the base


def base_tarball() -> Path:
    """Debian bookworm with Python 3 as the real base has it (see the module's
    docstring), made once and kept under IMAGES_CACHE."""
    tarball = IMAGES_CACHE / f"compose-base-{BASE_RECIPE}.tar"
    if tarball.exists():
        return tarball
    partial = tarball.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    hook = ('rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED'
            ' && cp /usr/local/share/ca-certificates/*.crt "$1"/usr/local/share/ca-certificates/'
            ' 2>/dev/null; chroot "$1" update-ca-certificates >/dev/null')
    done = subprocess.run(
        ["mmdebstrap", "--quiet", "--variant=minbase", "--format=tar",
         "--include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates",
         f"--customize-hook={hook}", "bookworm", str(partial)],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise PodmanError(f"mmdebstrap failed ({done.returncode}): {done.stderr[-3000:]}")
    partial.rename(tarball)
    return tarball


def ensure_base() -> None:
    """The base in podman's storage under the Dockerfile's name."""
    if image_exists(BASE_NAME):
        return
    podman("import", "--change", "ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:"
           "/sbin:/bin", "--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["python3"]',
           str(base_tarball()), BASE_NAME, timeout=BUILD_TIMEOUT_S)


# ----------------------------------------------------------------------------- the image


def copied_sources(dockerfile: str) -> list[str]:
    """What a Dockerfile's COPY lines take from the build context (each line's words
    but its last, the destination; `--from` and other flags left out)."""
    found: list[str] = []
    for line in dockerfile.splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            found += [w for w in words[1:-1] if not w.startswith("--")]
    return found


def _source_files(tree: Path) -> list[Path]:
    """The files the Dockerfile copies from `tree`, relative, sorted; caches left out."""
    files: list[Path] = []
    for name in copied_sources((tree / "deploy/Dockerfile").read_text()):
        top = tree / name
        if top.is_file():
            files.append(Path(name))
            continue
        for path in sorted(top.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files.append(path.relative_to(tree))
    return sorted(files)


def source_digest(tree: Path) -> str:
    """What the image is made of: the base's recipe, the Dockerfile and its sources."""
    digest = hashlib.sha256(BASE_RECIPE.encode())
    for rel in [Path("deploy/Dockerfile"), *_source_files(tree)]:
        digest.update(str(rel).encode() + b"\0" + (tree / rel).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build_image(tree: Path, scratch: Path) -> str:
    """The worker image of the source tree `tree` (built unless already held); its
    name. The build context holds only what the Dockerfile copies."""
    name = f"{IMAGE_REPO}:{source_digest(tree)}"
    with locked():
        if image_exists(name):
            return name
        ensure_base()
        context = scratch / f"context-{name.rsplit(':', 1)[1]}"
        shutil.rmtree(context, ignore_errors=True)
        for rel in [Path("deploy/Dockerfile"), *_source_files(tree)]:
            (context / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(tree / rel, context / rel)
        # The build's RUN steps reach Debian's mirror and PyPI through the host's
        # network (there is no other here); docker format keeps the HEALTHCHECK.
        podman("build", "--pull=never", "--network", "host", "--format", "docker",
               *ULIMITS, "-f", str(context / "deploy/Dockerfile"), "-t", name, str(context),
               timeout=BUILD_TIMEOUT_S)
        shutil.rmtree(context, ignore_errors=True)
        _prune()
    return name


def _prune() -> None:
    """Leave out the images of source trees built more than a day ago (each is a
    layer of its own over the shared ones), and layers nothing names any more. One in
    use by a container is kept (podman refuses it)."""
    old = podman("images", "--filter", f"reference={IMAGE_REPO}", "--filter", "until=24h",
                 "--format", "{{.Repository}}:{{.Tag}}").split()
    if old:
        podman("rmi", *old, check=False)
    podman("image", "prune", "--force", check=False)


# ------------------------------------------------------------- an image without devices


def nodev_image(registry: Registry) -> str:
    """The test's Debian image (registry.py's `debian`) without its device files,
    pushed to `registry`; the reference. The compose file gives the worker no
    CAP_MKNOD, so it cannot unpack an image that has them (mmdebstrap's roots do;
    images built by Docker have an empty /dev). Made once, kept under IMAGES_CACHE."""
    done = IMAGES_CACHE / f"compose-nodev-{BASE_RECIPE}"
    layout = done / "oci"
    if not (layout / "index.json").exists():
        with locked():
            if not (layout / "index.json").exists():
                _make_nodev(done)
    return registry.push(layout, "nodev", "bashfleet/nodev:1")


def _make_nodev(done: Path) -> None:
    work = done.with_name(done.name + f".tmp-{os.urandom(4).hex()}")
    work.mkdir()
    try:
        layout = work / "oci"
        run("umoci", "init", "--layout", str(layout))
        bundle = _new_image(work, layout, "nodev")
        shutil.rmtree(bundle / "rootfs")
        run("umoci", "raw", "unpack", "--image", f"{image_layout()}:debian",
            str(bundle / "rootfs"))
        run("find", str(bundle / "rootfs" / "dev"), "-mindepth", "1", "(", "-type", "b",
            "-o", "-type", "c", "-o", "-type", "p", ")", "-delete")
        _finish(work, layout, "nodev", "bash")
        shutil.rmtree(bundle)
        shutil.rmtree(done, ignore_errors=True)
        work.rename(done)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ----------------------------------------------------------- the compose service's options


#: Keys of a compose worker service and what running it here does with them.
HANDLED = {
    "image": "replaced by the image built here",
    "command": "the container's command",
    "environment": "--env-file (the values the test's own)",
    "volumes": "named volumes: podman volumes of the test's own; host paths bound as given",
    "cap_drop": "--cap-drop", "cap_add": "--cap-add", "security_opt": "--security-opt",
    "stop_grace_period": "--stop-timeout",
    "depends_on": "the test starts Redis first",
    "restart": "left out: a test's container never restarts",
}


def is_bind(source: str) -> bool:
    """A volume's source is a path of the host (else a named volume)."""
    return source.startswith(("/", "./", "../", "~"))


def _seconds(text: str) -> int:
    """`30s`, `1m` (compose's durations, the forms the file uses) in seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def run_options(service: Mapping[str, Any], volumes: Mapping[str, str]) -> list[str]:
    """`podman run` options for a compose service's security and lifetime settings
    (`volumes`: the podman volume of each named volume). Every key the service has must
    be known here (a new one in the file fails the test that uses this, rather than
    being silently dropped)."""
    unknown = sorted(set(service) - set(HANDLED))
    if unknown:
        raise ValueError(f"the compose service has settings run_options does not know: "
                         f"{unknown}")
    options: list[str] = []
    for cap in service.get("cap_drop", []):
        options += ["--cap-drop", str(cap)]
    for cap in service.get("cap_add", []):
        options += ["--cap-add", str(cap)]
    for opt in service.get("security_opt", []):
        options += ["--security-opt", str(opt)]
    for spec in service.get("volumes", []):
        source, _, target = str(spec).partition(":")
        options += ["--volume", f"{source if is_bind(source) else volumes[source]}:{target}"]
    if "stop_grace_period" in service:
        options += ["--stop-timeout", str(_seconds(str(service["stop_grace_period"])))]
    return options


def compose_service(name: str) -> dict[str, Any]:
    """A service of docker-compose.yml, its `<<` merges resolved (yaml does that)."""
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service: dict[str, Any] = data["services"][name]
    return service


class WorkerContainer:
    """One worker container of the compose file's worker service, ended by its id."""

    def __init__(self, image: str, service: str, base: Path, env: Mapping[str, str],
                 mounts: Mapping[Path, str]) -> None:
        self.image = image
        self.service = compose_service(service)
        self.base = base
        self.env = env
        self.mounts = mounts
        self.id: str | None = None
        self.volumes: list[str] = []

    @property
    def command(self) -> list[str]:
        return [str(part) for part in self.service["command"]]

    @property
    def host(self) -> str:
        return str(self.service["environment"]["BASHFLEET_HOST"])

    def start(self) -> WorkerContainer:
        """Run it (ended again, with its volumes, if it does not start)."""
        try:
            return self._start()
        except BaseException:
            self.remove()
            raise

    def _start(self) -> WorkerContainer:
        tag = os.urandom(4).hex()
        named = {}
        for spec in self.service.get("volumes", []):
            source = str(spec).split(":", 1)[0]
            if is_bind(source):
                # As Docker does for a bind whose source is missing (podman refuses it).
                Path(source).mkdir(parents=True, exist_ok=True)
                continue
            volume = f"bf-compose-test-{source}-{tag}"
            podman("volume", "create", volume)
            self.volumes.append(volume)
            named[source] = volume
        env_file = self.base / f"worker-{tag}.env"
        fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.writelines(f"{key}={value}\n" for key, value in self.env.items())
        mounts = [f"--volume={src}:{dst}:ro" for src, dst in self.mounts.items()]
        # --network host: the test's Redis and registry listen on the host's 127.0.0.1
        # (the registry's certificate names that address, image references too).
        # --no-healthcheck: podman runs the image's HEALTHCHECK from systemd timers, and
        # systemd is not this machine's init.
        # --cidfile: its id even when it is made but fails to start (then removed).
        cidfile = self.base / f"worker-{tag}.cid"
        try:
            podman("run", "--detach", "--cidfile", str(cidfile), "--network", "host",
                   "--no-healthcheck", *ULIMITS, "--env-file", str(env_file),
                   *run_options(self.service, named), *mounts, self.image, *self.command)
        finally:
            # The container has its environment: the file (the fleet's key) is not kept.
            env_file.unlink()
            if cidfile.exists():
                self.id = cidfile.read_text().strip() or None
        return self

    def logs(self) -> str:
        if self.id is None:
            return ""
        done = subprocess.run([*podman_base_args(), "logs", self.id], capture_output=True,
                              text=True, timeout=60, check=False, stdin=subprocess.DEVNULL)
        return (done.stdout + done.stderr)[-6000:]

    def exec(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """A command in the container, as its root (the worker's account)."""
        assert self.id is not None
        return subprocess.run([*podman_base_args(), "exec", self.id, *argv],
                              capture_output=True, text=True, timeout=60, check=False,
                              stdin=subprocess.DEVNULL)

    def remove(self) -> None:
        """End the container (a clean stop first, as compose's `down` would, so the
        worker ends its workspaces) and its volumes."""
        if self.id is not None:
            with contextlib.suppress(PodmanError, subprocess.TimeoutExpired):
                podman("stop", "--time", "30", self.id, timeout=90)
            podman("rm", "--force", "--volumes", self.id, timeout=90, check=False)
            self.id = None
        for volume in self.volumes:
            podman("volume", "rm", "--force", volume, check=False)
        self.volumes = []
