"""Test networks: a network namespace the test makes, linked to the host by a veth pair,
with servers in it (HTTP, plain TCP, DNS). No traffic leaves this machine: every address
a test connects to is one of these namespaces', routed to its veth.

    host  ── bft<id>h HOST/30 ── veth ── eth0 NS/30 (+ extra addresses)   netns bft<id>
                                           servers: HTTP, TCP, DNS (python3 -c SERVER)

Test modules run two at a time (pytest-xdist), each with namespaces of its own, in the
one routing table of this machine. Two of them must never take the same /30 (the host
would route one module's traffic into the other's namespace), and an extra address that
several modules use (169.254.169.254) is routed to one namespace at a time, for one test
at a time: both are held by file locks shared by every process of the suite (`LOCK_DIR`).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: The servers of a test network, one process: `{"http": [[addr, port]], "tcp": [...],
#: "dns": [addr, {name: address}], "size": bytes of the body of GET /big}`.
SERVER = r"""
import json, socket, struct, sys, threading
cfg = json.loads(sys.argv[1])

def listen(addr, port):
    s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(512)
    return s

def http_one(c, where):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = c.recv(4096)
        if not chunk:
            return c.close()
        data += chunk
    first = data.split(b"\r\n")[0].decode()
    host = ""
    for line in data.split(b"\r\n")[1:]:
        if line.lower().startswith(b"host:"):
            host = line[5:].strip().decode()
    if first.split(" ")[1] == "/big":
        size = int(cfg.get("size", 0))
        c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        chunk = b"\0" * (1 << 20)
        left = size
        while left:
            n = c.send(chunk[:min(left, len(chunk))])
            left -= n
    else:
        body = ("hello from %s host=%s\n" % (where, host)).encode()
        c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    c.close()

def http(addr, port):
    s = listen(addr, port)
    while True:
        c, _ = s.accept()
        threading.Thread(target=http_one, args=(c, "%s:%d" % (addr, port)), daemon=True).start()

def tcp(addr, port):
    s = listen(addr, port)
    while True:
        c, _ = s.accept()
        try:
            c.sendall(b"hello\n")
        except OSError:
            pass
        c.close()

def dns(addr, names):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, 53))
    while True:
        q, peer = s.recvfrom(4096)
        pos, labels = 12, []
        while q[pos]:
            labels.append(q[pos + 1:pos + 1 + q[pos]].decode())
            pos += 1 + q[pos]
        qtype = struct.unpack("!H", q[pos + 1:pos + 3])[0]
        end = pos + 5
        name = ".".join(labels).lower()
        ident = q[:2]
        if name in names and qtype == 1:
            rr = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 30, 4) + socket.inet_aton(names[name])
            out = ident + struct.pack("!HHHHH", 0x8180, 1, 1, 0, 0) + q[12:end] + rr
        elif name in names:
            out = ident + struct.pack("!HHHHH", 0x8180, 1, 0, 0, 0) + q[12:end]
        else:
            out = ident + struct.pack("!HHHHH", 0x8183, 1, 0, 0, 0) + q[12:end]
        s.sendto(out, peer)

threads = [threading.Thread(target=http, args=tuple(a), daemon=True) for a in cfg.get("http", [])]
threads += [threading.Thread(target=tcp, args=tuple(a), daemon=True) for a in cfg.get("tcp", [])]
if cfg.get("dns"):
    threads.append(threading.Thread(target=dns, args=tuple(cfg["dns"]), daemon=True))
for t in threads:
    t.start()
import time
time.sleep(0.3)
print("ready", flush=True)
threading.Event().wait()
"""


#: Where the suite's processes keep the locks of what they route on the host (root's
#: alone: the namespaces are root's to make).
LOCK_DIR = Path("/run/bashfleet-tests")
#: How long a test waits for an extra address another module's test routes (under the
#: suite's timeout of a test), before it fails saying so.
ADDRESS_WAIT_S = 90.0


def _lock(name: str, *, wait_s: float) -> int:
    """An exclusive lock on `name` in LOCK_DIR (its descriptor: closing it unlocks),
    waited for at most `wait_s`; AssertionError when another process keeps it longer."""
    LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(LOCK_DIR / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise AssertionError(
                    f"another test process held {LOCK_DIR / name} for {wait_s:.0f}s") from None
            time.sleep(0.05)  # polling a lock another process holds, with a deadline


def _host_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 networks of every address on this machine's interfaces."""
    done = sh("ip", "-4", "-o", "addr", "show")
    return [ipaddress.IPv4Interface(line.split()[3]).network
            for line in done.stdout.splitlines() if len(line.split()) > 3]


def free_slash30(subnet: str, taken: Sequence[ipaddress.IPv4Network],
                 start: int) -> ipaddress.IPv4Network:
    """The first /30 of `subnet` from the `start`-th on (wrapping) that overlaps none of
    `taken`; AssertionError when every one does."""
    slots = list(ipaddress.IPv4Network(subnet).subnets(new_prefix=30))
    for offset in range(len(slots)):
        slot = slots[(start + offset) % len(slots)]
        if not any(slot.overlaps(other) for other in taken):
            return slot
    raise AssertionError(f"every /30 of {subnet} is in use on this machine")


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a tool (ip); its failure fails the test with what it said."""
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done


@dataclass
class NetNs:
    """A network namespace linked to the host (see the module)."""

    name: str
    host_ip: str
    ns_ip: str
    extra: list[str] = field(default_factory=list)
    servers: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def host_iface(self) -> str:
        return f"{self.name}h"

    def add_address(self, address: str) -> None:
        """Another address of the namespace, routed to it from the host while a test
        that uses the namespace runs (`routed_extras`: the integration tests' conftest)."""
        sh("ip", "-n", self.name, "addr", "add", f"{address}/32", "dev", "eth0")
        self.extra.append(address)

    @contextlib.contextmanager
    def routed_extras(self) -> Iterator[None]:
        """The namespace's extra addresses routed to it from the host, each once no other
        namespace of the suite has it (another module's test is waited for)."""
        held: list[int] = []
        try:
            for address in sorted(self.extra):  # one order for all: no two wait on each other
                held.append(_lock(f"address-{address}", wait_s=ADDRESS_WAIT_S))
                sh("ip", "route", "replace", f"{address}/32", "via", self.ns_ip,
                   "dev", self.host_iface)
            yield
        finally:
            for address in self.extra:
                sh("ip", "route", "del", f"{address}/32", "via", self.ns_ip,
                   "dev", self.host_iface, check=False)
            for fd in held:
                os.close(fd)

    def serve(self, *, http: Sequence[tuple[str, int]] = (), tcp: Sequence[tuple[str, int]] = (),
              dns: tuple[str, dict[str, str]] | None = None, size: int = 0) -> None:
        """Start servers in the namespace and wait until they listen."""
        config = {"http": [list(a) for a in http], "tcp": [list(a) for a in tcp],
                  "dns": [dns[0], dns[1]] if dns else None, "size": size}
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.name, sys.executable, "-c", SERVER, json.dumps(config)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, start_new_session=True)
        self.servers.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "ready":
            raise AssertionError(f"the test network's servers did not start: "
                                 f"{proc.stderr.read() if proc.stderr else ''}")

    def close(self) -> None:
        for proc in self.servers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait(10)
        sh("ip", "link", "del", self.host_iface, check=False)
        sh("ip", "netns", "del", self.name, check=False)


@contextlib.contextmanager
def make_netns(subnet: str) -> Iterator[NetNs]:
    """A test network on a /30 of `subnet` that no interface of this machine has (host
    .1, namespace .2), chosen from a random start: the look and the host address it
    takes are one step for the suite's processes (a lock), so two never share one."""
    name = f"bft{uuid.uuid4().hex[:8]}"
    net = NetNs(name, "", "")
    try:
        sh("ip", "netns", "add", net.name)
        sh("ip", "link", "add", net.host_iface, "type", "veth", "peer", "name", "eth0",
           "netns", net.name)
        picking = _lock("pick-slash30", wait_s=60.0)
        try:
            slot = free_slash30(subnet, _host_networks(), int.from_bytes(os.urandom(2), "big"))
            net.host_ip, net.ns_ip = str(slot.network_address + 1), str(slot.network_address + 2)
            sh("ip", "addr", "add", f"{net.host_ip}/30", "dev", net.host_iface)
        finally:
            os.close(picking)
        sh("ip", "link", "set", net.host_iface, "up")
        sh("ip", "-n", net.name, "addr", "add", f"{net.ns_ip}/30", "dev", "eth0")
        sh("ip", "-n", net.name, "link", "set", "eth0", "up")
        sh("ip", "-n", net.name, "link", "set", "lo", "up")
        sh("ip", "-n", net.name, "route", "add", "default", "via", net.host_ip)
        yield net
    finally:
        net.close()


def reachable(address: str, port: int, timeout: float = 5.0) -> bool:
    """This process (the host) connects to address:port."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def elapsed(start: float) -> float:
    return time.monotonic() - start
