"""A workspace's network guard under the `allow` policy: DNS, HTTP and TLS by name.

Standard library only: the worker starts it as `python -I -S
.../isolate/bootstrap.py netguard CONFIG DENIED_FD READY_FD LOG_FD` in the workspace's network
namespace (`nsenter --net`), as the host's root, outside the workspace's PID and user namespaces
(no call can signal or trace it). It needs no capability but CAP_NET_ADMIN (its marked sockets,
NFLOG): its ports are unprivileged (`network.GUARD_PORT`). It answers `ok` on READY_FD once it
serves, or `error: why`; from then on its stderr is LOG_FD (the worker's). It exits with
the keeper.

    a call ── DNS (any server, port 53) ─ DNAT ──►  guard :1053  listed name? ask the
                                                               host's resolvers : NXDOMAIN
    a call ── TCP 80/443 (any address) ─ DNAT ──►  guard :1999 Host / SNI / CONNECT names
                                                               a listed name? connect it
                                                               (marked socket) : refuse
    a call ── anything else, not a listed CIDR ─►  refused in the kernel (TCP reset), NFLOG
                                                   group 7 ─► guard records it

Every refusal is a JSON line on DENIED_FD (`{"at", "kind", "target"}`; kinds `dns`,
`connect`, `address`), at most RECORDS_PER_S a second (a flood of refusals is counted
in the next line's `more`): the worker publishes them (`bashfleet events --kind denied`).
Its own sockets carry the mark the workspace's rules let out; resolved addresses are
checked like a call's (never the fleet, never a denied range unless listed).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import resource
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

SO_ORIGINAL_DST = 80
NETLINK_NETFILTER = 12
RECORDS_PER_S = 50
#: The ports a listed name is reached on through the guard (HTTP, TLS).
NAME_PORTS = (80, 443)
#: Seconds a client gets to send what names its target; an upstream to connect.
HEAD_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
DNS_TIMEOUT_S = 3.0
MAX_HEAD = 16384
#: DNS queries answered at once (each waits for the host's resolvers on a thread).
DNS_IN_FLIGHT = 64
#: Seconds the proxy waits before accepting again when it could not (out of
#: descriptors or threads: a connection that ends frees some).
ACCEPT_PAUSE_S = 0.05
DENIED_RANGES = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4",
    "240.0.0.0/4",
)


# ------------------------------------------------------------------------ the rules


def name_allowed(name: str, domains: Iterable[str]) -> bool:
    """`name` is listed: exactly, or under a `*.` entry (`*.example.com` covers
    `a.example.com` and `a.b.example.com`, not `example.com` itself)."""
    host = name.strip().lower().rstrip(".")
    for entry in domains:
        if entry.startswith("*."):
            if host.endswith(entry[1:]) and len(host) > len(entry) - 1:
                return True
        elif host == entry:
            return True
    return False


def _within(address: str, nets: Iterable[str]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    for net in nets:
        network = ipaddress.ip_network(net, strict=False)
        if ip.version == network.version and ip in network:
            return True
    return False


class Rules:
    """What this workspace may reach (from the worker's config)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.domains: tuple[str, ...] = tuple(config.get("domains", ()))
        self.cidrs: tuple[str, ...] = tuple(config.get("cidrs", ()))
        self.fleet: tuple[str, ...] = tuple(config.get("fleet", ()))
        self.open: tuple[str, ...] = self.cidrs + tuple(config.get("allowed_private", ()))

    def address_ok(self, address: str) -> bool:
        """An address a listed name resolved to (or a listed CIDR's) may be connected."""
        if _within(address, self.fleet):
            return False
        return _within(address, self.open) or not _within(address, DENIED_RANGES)

    def target_ok(self, name: str, port: int) -> bool:
        """A name (or an address literal) and port a call asked for (its Host header or
        CONNECT line): a listed name on NAME_PORTS only, since a name is let through for
        HTTP and TLS, not any service of its host; an address of a listed CIDR on any
        port, as the workspace reaches it directly."""
        try:
            ipaddress.ip_address(name.strip("[]"))
        except ValueError:
            return port in NAME_PORTS and name_allowed(name, self.domains)
        return _within(name.strip("[]"), self.cidrs) and self.address_ok(name.strip("[]"))


# --------------------------------------------------------------------------- records


class Recorder:
    """Refusals, as JSON lines on a descriptor, at most RECORDS_PER_S a second."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lock = threading.Lock()
        self.second = 0
        self.count = 0
        self.dropped = 0

    def record(self, kind: str, target: str) -> None:
        now = time.time()
        with self.lock:
            if int(now) != self.second:
                self.second, self.count = int(now), 0
            self.count += 1
            if self.count > RECORDS_PER_S:
                self.dropped += 1
                return
            entry: dict[str, Any] = {"at": round(now, 3), "kind": kind, "target": target}
            if self.dropped:
                entry["more"], self.dropped = self.dropped, 0
            with contextlib.suppress(OSError):
                os.write(self.fd, (json.dumps(entry) + "\n").encode())


# ----------------------------------------------------------------------------- DNS


def query_name(packet: bytes) -> tuple[str, int, int]:
    """(name, qtype, end of the question) of a DNS query; ValueError when malformed."""
    if len(packet) < 12:
        raise ValueError("short")
    labels, pos = [], 12
    while True:
        if pos >= len(packet):
            raise ValueError("truncated")
        size = packet[pos]
        if size == 0:
            pos += 1
            break
        if size > 63:
            raise ValueError("compressed question")
        labels.append(packet[pos + 1:pos + 1 + size].decode("ascii", "replace"))
        pos += 1 + size
    if pos + 4 > len(packet):
        raise ValueError("truncated")
    qtype = struct.unpack("!H", packet[pos:pos + 2])[0]
    return ".".join(labels).lower(), qtype, pos + 4


def refusal(packet: bytes, end: int) -> bytes:
    """An NXDOMAIN answer to a query (its question echoed)."""
    ident, flags = struct.unpack("!HH", packet[:4])
    flags = 0x8000 | (flags & 0x7900) | 0x0080 | 3  # QR, opcode and RD kept, RA, NXDOMAIN
    return struct.pack("!HHHHHH", ident, flags, 1, 0, 0, 0) + packet[12:end]


def build_query(name: str, qtype: int = 1) -> bytes:
    ident = int.from_bytes(os.urandom(2), "big")
    labels = b"".join(bytes([len(part)]) + part.encode("ascii") for part in name.split(".")
                      if part)
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + labels + b"\0" \
        + struct.pack("!HH", qtype, 1)


def _skip_name(packet: bytes, pos: int) -> int:
    while True:
        size = packet[pos]
        if size == 0:
            return pos + 1
        if size & 0xC0 == 0xC0:
            return pos + 2
        pos += 1 + size


def answer_addresses(packet: bytes) -> list[str]:
    """The A records of a DNS answer."""
    found: list[str] = []
    try:
        _, _, qd, an = struct.unpack("!HHHH", packet[:8])
        pos = 12
        for _ in range(qd):
            pos = _skip_name(packet, pos) + 4
        for _ in range(an):
            pos = _skip_name(packet, pos)
            rtype, _, _, size = struct.unpack("!HHIH", packet[pos:pos + 10])
            pos += 10
            if rtype == 1 and size == 4:
                found.append(socket.inet_ntoa(packet[pos:pos + 4]))
            pos += size
    except (IndexError, struct.error):
        pass
    return found


class Guard:
    """The guard's sockets and loops."""

    def __init__(self, config: dict[str, Any], recorder: Recorder) -> None:
        self.config = config
        self.rules = Rules(config)
        self.recorder = recorder
        self.mark = int(config["mark"])
        self.resolvers: list[str] = [r for r in config.get("resolvers", ())
                                     if ":" not in r]
        self.slots = threading.BoundedSemaphore(int(config.get("max_connections", 512)))
        self.queries = threading.BoundedSemaphore(DNS_IN_FLIGHT)
        address = str(config["address"])
        self.dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        _bind(self.dns, address, int(config.get("dns_port", 53)), "DNS")
        self.proxy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.proxy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        _bind(self.proxy, address, int(config["port"]), "proxy")
        self.proxy.listen(256)
        self.own = (address, int(config["port"]))

    def _marked(self, kind: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, kind)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, self.mark)
        return sock

    def ask(self, packet: bytes) -> bytes | None:
        """A query's answer from the host's resolvers (None: none answered)."""
        for server in self.resolvers:
            with self._marked(socket.SOCK_DGRAM) as sock:
                sock.settimeout(DNS_TIMEOUT_S)
                try:
                    sock.sendto(packet, (server, 53))
                    while True:
                        data, source = sock.recvfrom(65535)
                        if source[0] == server and data[:2] == packet[:2]:
                            return data
                except OSError:
                    continue
        return None

    def resolve(self, name: str) -> list[str]:
        try:
            ipaddress.ip_address(name.strip("[]"))
            return [name.strip("[]")]
        except ValueError:
            pass
        answer = self.ask(build_query(name))
        return answer_addresses(answer) if answer else []

    # ------------------------------------------------------------------------ DNS

    def serve_dns(self) -> None:
        while True:
            packet, client = self.dns.recvfrom(4096)
            if not self.queries.acquire(blocking=False):
                continue  # a flood: dropped, as a busy resolver drops (the client retries)
            threading.Thread(target=self._dns_one, args=(packet, client), daemon=True).start()

    def _dns_one(self, packet: bytes, client: tuple[str, int]) -> None:
        try:
            self._answer(packet, client)
        finally:
            self.queries.release()

    def _answer(self, packet: bytes, client: tuple[str, int]) -> None:
        try:
            name, _, end = query_name(packet)
        except ValueError:
            return
        answer = None
        if name_allowed(name, self.rules.domains):
            answer = self.ask(packet)
            if answer is None:
                return  # the client retries or times out as with any silent resolver
        else:
            self.recorder.record("dns", name)
            answer = refusal(packet, end)
        with contextlib.suppress(OSError):
            self.dns.sendto(answer, client)

    # ---------------------------------------------------------------------- proxy

    def serve_proxy(self) -> None:
        """Accept connections for as long as the guard lives: a failed accept (no
        descriptor left, a client gone before it) or a thread that cannot start costs
        that one connection, never the loop."""
        while True:
            try:
                conn, _ = self.proxy.accept()
            except OSError:
                time.sleep(ACCEPT_PAUSE_S)
                continue
            if not self.slots.acquire(blocking=False):
                _reset(conn)
                continue
            try:
                threading.Thread(target=self._proxy_one, args=(conn,), daemon=True).start()
            except RuntimeError:
                self.slots.release()
                _reset(conn)
                time.sleep(ACCEPT_PAUSE_S)

    def _proxy_one(self, conn: socket.socket) -> None:
        try:
            self._handle(conn)
        except OSError:
            _reset(conn)
        finally:
            self.slots.release()

    def _handle(self, conn: socket.socket) -> None:
        original = _original_destination(conn)
        conn.settimeout(HEAD_TIMEOUT_S)
        head = _read_head(conn)
        kind, name, port = parse_head(head, original[1] if original != self.own else 443)
        if name is None:
            self.recorder.record("connect", f"{original[0]}:{original[1]}")
            _reset(conn)
            return
        target = f"{name}:{port}"
        if not self.rules.target_ok(name, port):
            self.recorder.record("connect", target)
            why = (f"{name} is not in this workspace's allow list"
                   if port in NAME_PORTS or not name_allowed(name, self.rules.domains)
                   else f"{target}: a listed name is reached on ports 80 and 443 only")
            _refuse(conn, kind, why)
            return
        upstream = self._connect(name, port)
        if upstream is None:
            _refuse(conn, kind, f"{target} could not be reached", status=502)
            return
        with upstream:
            if kind == "connect":
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.sendall(head)
            conn.settimeout(None)
            upstream.settimeout(None)
            _relay(conn, upstream)

    def _connect(self, name: str, port: int) -> socket.socket | None:
        for address in self.resolve(name):
            if not self.rules.address_ok(address):
                self.recorder.record("connect", f"{name}:{port} ({address})")
                continue
            sock = self._marked(socket.SOCK_STREAM)
            sock.settimeout(CONNECT_TIMEOUT_S)
            try:
                sock.connect((address, port))
            except OSError:
                sock.close()
                continue
            return sock
        return None

    # ---------------------------------------------------------------------- NFLOG

    def serve_log(self, sock: socket.socket) -> None:
        while True:
            data = sock.recv(65536)
            for target in log_targets(data):
                self.recorder.record("address", target)


def _bind(sock: socket.socket, address: str, port: int, what: str) -> None:
    try:
        sock.bind((address, port))
    except OSError as exc:
        raise OSError(exc.errno, f"its {what} cannot listen on {address}:{port}: "
                      f"{exc.strerror}") from None


def _original_destination(conn: socket.socket) -> tuple[str, int]:
    raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port = struct.unpack("!H", raw[2:4])[0]
    return socket.inet_ntoa(raw[4:8]), port


def _read_head(conn: socket.socket) -> bytes:
    """What names the target: a TLS ClientHello record, or HTTP headers."""
    head = b""
    while len(head) < MAX_HEAD:
        chunk = conn.recv(MAX_HEAD - len(head))
        if not chunk:
            break
        head += chunk
        if head[:1] == b"\x16":
            if len(head) >= 5 and len(head) >= 5 + struct.unpack("!H", head[3:5])[0]:
                break
        elif b"\r\n\r\n" in head:
            break
    return head


def parse_head(head: bytes, default_port: int) -> tuple[str, str | None, int]:
    """(kind, name, port) a connection's first bytes name: `connect` (an HTTP CONNECT),
    `tls` (the ClientHello's SNI), `http` (Host, or an absolute URI). name None: none."""
    if head[:1] == b"\x16":
        return "tls", sni(head), default_port
    first, _, rest = head.partition(b"\r\n")
    parts = first.split(b" ")
    if len(parts) == 3 and parts[0] == b"CONNECT":
        name, port = _host_port(parts[1].decode("latin-1"), 443)
        return "connect", name, port
    if len(parts) == 3 and parts[1].startswith((b"http://", b"https://")):
        authority = parts[1].split(b"/")[2].decode("latin-1")
        name, port = _host_port(authority, 443 if parts[1].startswith(b"https") else 80)
        return "http", name, port
    for line in rest.split(b"\r\n"):
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == b"host":
            name, port = _host_port(value.strip().decode("latin-1"), default_port)
            return "http", name, port
    return "http", None, default_port


def _host_port(text: str, default: int) -> tuple[str | None, int]:
    host, port = text, default
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest.startswith(":") and rest[1:].isdigit():
            port = int(rest[1:])
    elif text.count(":") == 1:
        host, _, number = text.partition(":")
        if not number.isdigit():
            return None, default
        port = int(number)
    return (host.lower().rstrip(".") or None), port


def sni(record: bytes) -> str | None:
    """The server name of a TLS ClientHello (None: none, or malformed)."""
    try:
        pos = 5
        if record[pos] != 1:  # handshake type: ClientHello
            return None
        pos += 4 + 2 + 32  # handshake header, version, random
        pos += 1 + record[pos]  # session id
        pos += 2 + struct.unpack("!H", record[pos:pos + 2])[0]  # cipher suites
        pos += 1 + record[pos]  # compression methods
        end = pos + 2 + struct.unpack("!H", record[pos:pos + 2])[0]
        pos += 2
        while pos + 4 <= end:
            kind, size = struct.unpack("!HH", record[pos:pos + 4])
            pos += 4
            if kind == 0:  # server_name: list length, type 0 (host_name), length, name
                name_size = struct.unpack("!H", record[pos + 3:pos + 5])[0]
                return record[pos + 5:pos + 5 + name_size].decode("ascii").lower()
            pos += size
    except (IndexError, struct.error, UnicodeDecodeError):
        return None
    return None


def _refuse(conn: socket.socket, kind: str, why: str, status: int = 403) -> None:
    if kind in ("http", "connect"):
        body = f"bashfleet: {why}\n".encode()
        reason = "Forbidden" if status == 403 else "Bad Gateway"
        with contextlib.suppress(OSError):
            conn.sendall(f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                         + body)
        conn.close()
        return
    _reset(conn)


def _reset(conn: socket.socket) -> None:
    """Close with a TCP reset: the client hears a refusal at once."""
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def _relay(one: socket.socket, other: socket.socket) -> None:
    back = threading.Thread(target=_pump, args=(other, one), daemon=True)
    back.start()
    _pump(one, other)
    back.join()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    buffer = bytearray(1 << 16)
    try:
        while True:
            size = source.recv_into(buffer)
            if not size:
                break
            sink.sendall(memoryview(buffer)[:size])
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


# ----------------------------------------------------------------------------- NFLOG


def _attr(kind: int, data: bytes) -> bytes:
    size = 4 + len(data)
    return struct.pack("=HH", size, kind) + data + b"\0" * (-size % 4)


def nflog_socket(group: int) -> socket.socket:
    """A netlink socket bound to NFLOG `group`: packets the rules log, their first bytes."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    try:
        _nflog_bind(sock, group)
    except BaseException:
        sock.close()
        raise
    return sock


def _nflog_bind(sock: socket.socket, group: int) -> None:
    sock.bind((0, 0))
    # NFULA_CFG_CMD: bind the group; NFULA_CFG_MODE: copy 128 bytes of each packet;
    # NFULA_CFG_QTHRESH: each packet sent at once (by default the kernel holds up to 100
    # for a second: a refusal reached its record after the call's result was made).
    for seq, attrs in enumerate((_attr(1, b"\x01"),
                                 _attr(2, struct.pack("!IBB", 128, 2, 0))
                                 + _attr(5, struct.pack("!I", 1))), 1):
        body = struct.pack("!BBH", socket.AF_UNSPEC, 0, group) + attrs
        sock.send(struct.pack("=IHHII", 16 + len(body), (4 << 8) | 1, 0x1 | 0x4, seq, 0) + body)
        reply = sock.recv(4096)
        error = struct.unpack("=i", reply[16:20])[0] if len(reply) >= 20 else 0
        if struct.unpack("=H", reply[4:6])[0] == 2 and error != 0:
            raise OSError(-error, "NFLOG configuration refused")


def log_targets(data: bytes) -> list[str]:
    """`address:port` of each logged packet in a netlink datagram."""
    found = []
    pos = 0
    while pos + 16 <= len(data):
        size, kind = struct.unpack("=IH", data[pos:pos + 6])
        if size < 16:
            break
        if kind == (4 << 8):  # NFULNL_MSG_PACKET
            payload = _payload(data[pos + 20:pos + size])
            if payload:
                target = packet_target(payload)
                if target:
                    found.append(target)
        pos += (size + 3) & ~3
    return found


def _payload(attrs: bytes) -> bytes | None:
    pos = 0
    while pos + 4 <= len(attrs):
        size, kind = struct.unpack("=HH", attrs[pos:pos + 4])
        if size < 4:
            return None
        if kind & 0x7FFF == 9:  # NFULA_PAYLOAD
            return attrs[pos + 4:pos + size]
        pos += (size + 3) & ~3
    return None


def packet_target(packet: bytes) -> str | None:
    """`address:port/proto` an IPv4 or IPv6 packet is for."""
    if packet[:1] and packet[0] >> 4 == 4 and len(packet) >= 20:
        proto, start = packet[9], (packet[0] & 0xF) * 4
        address = socket.inet_ntop(socket.AF_INET, packet[16:20])
    elif packet[:1] and packet[0] >> 4 == 6 and len(packet) >= 40:
        proto, start = packet[6], 40
        address = f"[{socket.inet_ntop(socket.AF_INET6, packet[24:40])}]"
    else:
        return None
    names = {6: "tcp", 17: "udp"}
    if proto in names and len(packet) >= start + 4:
        port = struct.unpack("!H", packet[start + 2:start + 4])[0]
        return f"{address}:{port}/{names[proto]}"
    return f"{address}/{proto}"


# ------------------------------------------------------------------------------ main


def more_descriptors() -> None:
    """The soft RLIMIT_NOFILE raised to the hard one: each connection through the guard
    holds two sockets, so near its cap of connections it holds more than 1024
    descriptors, the soft limit a worker started from a shell often has (and passes on
    to the guard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def main(argv: Sequence[str]) -> int:
    config = json.loads(argv[1])
    denied, ready, log_fd = int(argv[2]), int(argv[3]), int(argv[4])
    try:
        more_descriptors()
        keeper = os.pidfd_open(int(config["keeper"]))
        guard = Guard(config, Recorder(denied))
        logs = nflog_socket(int(config["group"]))
    except OSError as exc:  # the worker shows it: a port taken, a capability missing...
        os.write(ready, f"error: {_why(exc)}".encode())
        return 1
    for target, args in ((guard.serve_dns, ()), (guard.serve_proxy, ()),
                         (guard.serve_log, (logs,))):
        threading.Thread(target=target, args=args, daemon=True).start()
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.write(ready, b"ok")
    os.close(ready)
    # poll(2), never select(2): glibc aborts select() on a descriptor numbered past 1024.
    poller = select.poll()
    poller.register(keeper, select.POLLIN | select.POLLHUP)
    poller.poll()
    return 0  # the workspace ended: its namespace goes with us


def _why(exc: OSError) -> str:
    """An error as the operator reads it (a bind's says which address)."""
    return str(exc.strerror) if exc.strerror else f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":  # pragma: no cover - the worker starts it
    try:
        CODE = main(sys.argv)
    except BaseException:  # no "ok": the worker reads why on stderr
        import traceback

        traceback.print_exc()
        CODE = 1
    os._exit(CODE)
