"""Network policies (`bashfleet.worker.wire.network`), the rules a workspace gets
(`bashfleet.worker.engine.network.network.ruleset`) and the guard's parsers
(`bashfleet.worker.engine.isolate.netguard`): pure, no namespace made."""

from __future__ import annotations

import errno
import socket
import ssl
import struct
import threading

import pytest
from pydantic import ValidationError

from bashfleet.worker.engine.isolate import netguard
from bashfleet.worker.engine.network import network
from bashfleet.worker.wire.models import WorkspaceRecord, WorkspaceSpec
from bashfleet.worker.wire.network import NetworkPolicy, parse, parse_text


@pytest.mark.parametrize(("text", "mode", "allow"), [
    ("none", "none", ()),
    ("egress", "egress", ()),
    ("HOST", "host", ()),
    ("allow=pypi.org,*.PythonHosted.org.,10.1.2.3/24", "allow",
     ("pypi.org", "*.pythonhosted.org", "10.1.2.0/24")),
    ("allow: a.com b.com a.com", "allow", ("a.com", "b.com")),
])
def test_spellings(text: str, mode: str, allow: tuple[str, ...]) -> None:
    policy = parse_text(text)
    assert (policy.mode, policy.allow) == (mode, allow)
    assert parse_text(str(policy)) == policy  # its spelling reads back


@pytest.mark.parametrize("text", ["", "bogus", "allow=", "allow=no_such!name", "egress=a.com",
                                  "allow=*.*.a.com", "allow=-a.com", "allow=a..com"])
def test_bad_spellings_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_text(text)


def test_a_list_is_for_allow_only() -> None:
    with pytest.raises(ValidationError):
        NetworkPolicy(mode="egress", allow=("a.com",))


def test_older_callers_bools() -> None:
    assert WorkspaceSpec(network=False).network == NetworkPolicy(mode="none")
    assert WorkspaceSpec(network=True).network == NetworkPolicy(mode="egress")
    assert WorkspaceSpec().network is None
    # A record kept by an older worker: True was the host's namespace.
    old = WorkspaceRecord(id="w0123456789abcde", host="h", path="/w", fresh=True,
                          out_dir="/o", isolation="process", network=True,
                          ttl_s=1, created_at=0)
    assert old.network.mode == "host"
    assert parse({"mode": "allow", "allow": ["a.com"]}) == parse_text("allow=a.com")


@pytest.mark.parametrize(("name", "listed"), [
    ("pypi.org", True), ("PyPI.org.", True), ("files.pythonhosted.org", True),
    ("a.b.pythonhosted.org", True), ("pythonhosted.org", False),
    ("evilpythonhosted.org", False), ("pypi.org.evil.com", False), ("xpypi.org", False),
])
def test_names_match_exactly_or_under_a_wildcard(name: str, listed: bool) -> None:
    assert netguard.name_allowed(name, ("pypi.org", "*.pythonhosted.org")) is listed


def test_the_guards_address_rules() -> None:
    rules = netguard.Rules({"domains": ["a.com"], "cidrs": ["203.0.113.0/24", "10.9.0.0/16"],
                            "fleet": ["203.0.113.7/32"], "allowed_private": ["100.64.1.0/24"]})
    assert rules.target_ok("a.com", 443) and not rules.target_ok("b.com", 443)
    assert rules.target_ok("203.0.113.5", 80) and not rules.target_ok("198.51.100.5", 80)
    assert not rules.target_ok("203.0.113.7", 80)  # the fleet's, listed or not
    # A listed name on HTTP's and TLS's ports only (a CONNECT or a Host: with another
    # port named any service of its host); a listed CIDR's address on any port.
    assert rules.target_ok("a.com", 80)
    assert not any(rules.target_ok("a.com", port) for port in (22, 6379, 8080, 8443))
    assert rules.target_ok("203.0.113.5", 22) and rules.target_ok("10.9.1.1", 6379)
    # A listed name resolving somewhere private (DNS rebinding) is not connected...
    for address in ("127.0.0.1", "169.254.169.254", "192.168.1.1", "10.1.1.1"):
        assert not rules.address_ok(address), address
    # ...unless the range is listed or allowed by the operator.
    assert rules.address_ok("10.9.1.1") and rules.address_ok("100.64.1.9")
    assert rules.address_ok("93.184.216.34")


def _client_hello(name: str) -> bytes:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_the_guard_reads_the_name_a_connection_is_for() -> None:
    assert netguard.parse_head(_client_hello("files.example.org"), 443) == (
        "tls", "files.example.org", 443)
    assert netguard.parse_head(b"CONNECT a.com:8443 HTTP/1.1\r\nHost: a.com\r\n\r\n", 443) == (
        "connect", "a.com", 8443)
    assert netguard.parse_head(b"GET / HTTP/1.1\r\nHost: A.com:8080\r\n\r\n", 80) == (
        "http", "a.com", 8080)
    assert netguard.parse_head(b"GET http://b.org/x HTTP/1.1\r\nHost: c.org\r\n\r\n", 80) == (
        "http", "b.org", 80)
    assert netguard.parse_head(b"GET / HTTP/1.0\r\n\r\n", 80) == ("http", None, 80)
    assert netguard.parse_head(b"\x16\x03\x01\x00\x05junk", 443) == ("tls", None, 443)
    assert netguard.parse_head(b"SSH-2.0-OpenSSH\r\n", 22)[1] is None


class _StopError(Exception):
    """Ends a guard loop a test drives."""


class _Listener:
    """A listening socket whose accepts are given: a connection, or an error to raise."""

    def __init__(self, *outcomes: socket.socket | Exception) -> None:
        self.outcomes = list(outcomes)

    def accept(self) -> tuple[socket.socket, None]:
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome, None


def test_the_guards_proxy_accepts_again_after_a_failed_accept() -> None:
    """Out of descriptors for a moment (accept fails with EMFILE): the proxy goes on
    accepting; here its next connection finds every slot taken and is closed at once."""
    mine, theirs = socket.socketpair()
    guard = object.__new__(netguard.Guard)
    listener = _Listener(OSError(errno.EMFILE, "Too many open files"), theirs, _StopError())
    guard.proxy = listener  # type: ignore[assignment]
    guard.slots = threading.BoundedSemaphore(1)
    guard.slots.acquire()
    with pytest.raises(_StopError):
        guard.serve_proxy()
    mine.settimeout(5)
    assert mine.recv(1) == b""
    mine.close()


def test_the_guards_dns_answers() -> None:
    query = netguard.build_query("Some.Name.test")
    name, qtype, end = netguard.query_name(query)
    assert (name, qtype, end) == ("some.name.test", 1, len(query))
    refused = netguard.refusal(query, end)
    ident, flags, qd, an = struct.unpack("!HHHH", refused[:8])
    assert ident == struct.unpack("!H", query[:2])[0] and flags & 0xF == 3  # NXDOMAIN
    assert (qd, an) == (1, 0) and refused[12:] == query[12:end]
    answer = (refused[:2] + struct.pack("!HHHHH", 0x8180, 1, 1, 0, 0) + query[12:end]
              + b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 30, 4) + socket.inet_aton("192.0.2.7"))
    assert netguard.answer_addresses(answer) == ["192.0.2.7"]
    assert netguard.answer_addresses(b"\x00" * 5) == []
    with pytest.raises(ValueError):
        netguard.query_name(b"\x00" * 12 + b"\x05ab")


def test_the_guard_reads_a_logged_packet() -> None:
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40, 0, 0, 64, 6, 0,
                     socket.inet_aton("10.250.0.2"), socket.inet_aton("203.0.113.9"))
    tcp = struct.pack("!HH", 40000, 22) + b"\x00" * 16
    assert netguard.packet_target(ip + tcp) == "203.0.113.9:22/tcp"
    payload = struct.pack("=HH", 4 + len(ip + tcp), 9) + ip + tcp
    message = struct.pack("=IHHII", 20 + len(payload), 4 << 8, 0, 0, 0) + b"\x02\x00\x00\x07" \
        + payload
    assert netguard.log_targets(message) == ["203.0.113.9:22/tcp"]


def test_the_rules_of_each_policy() -> None:
    link = network.link_of("10.250.0.0/16", 5)
    assert (link.iface, link.host_ip, link.ws_ip) == ("bfw5", "10.250.0.21", "10.250.0.22")
    assert network.capacity("10.250.0.0/16") == 16384
    egress = network.ruleset(network.Rules(NetworkPolicy(), link, fleet=("203.0.113.7/32",),
                                           resolvers=("192.0.2.53",),
                                           allowed_private=("10.1.2.0/24",)))
    assert "ip daddr @denied4 goto refuse" in egress and "10.1.2.0/24" in egress
    assert "ct count over 512" in egress and "dnat ip to 192.0.2.53:53" in egress
    # Refusals under egress are logged too (to the worker's reader, not the guard's
    # group), at a rate the kernel caps.
    assert "limit rate 50/second burst 50 packets log group 8" in egress
    assert "log group 7" not in egress and egress.startswith("table inet bashfleet\ndelete")
    allow = network.ruleset(network.Rules(parse_text("allow=a.com,198.51.100.0/24"), link),
                            replace=False)
    assert not allow.startswith("table inet bashfleet\ndelete")
    # The guard's ports are unprivileged: it needs no CAP_NET_BIND_SERVICE.
    assert "log group 7" in allow and "dnat ip to 10.250.0.22:1999" in allow
    assert "th dport 53 dnat ip to 10.250.0.22:1053" in allow
    assert min(network.GUARD_PORT, network.GUARD_DNS_PORT) >= 1024
    assert "198.51.100.0/24" in allow and "a.com" not in allow
    assert "ip daddr @denied4" not in allow  # everything not listed is refused


def test_the_host_table_matches_workspaces_links_only() -> None:
    """Every rule of the host's table names a link (`bfw*`) as the way a packet comes
    in or goes out: nothing else the host forwards (a container bridge) is matched."""
    table = network.host_ruleset()
    rules = [line.strip() for line in table.splitlines()
             if line.startswith("        ") and not line.strip().startswith("type ")]
    assert len(rules) == 7
    assert all('iifname "bfw*"' in rule or 'oifname "bfw*"' in rule for rule in rules), rules


@pytest.mark.parametrize(("answer", "stderr", "why"), [
    ("error: its proxy cannot listen on 10.250.0.2:1999: Address already in use", "",
     "its proxy cannot listen on 10.250.0.2:1999: Address already in use"),
    ("", "nsenter: cannot open /proc/9/ns/net: No such file or directory\n",
     "nsenter: cannot open /proc/9/ns/net: No such file or directory"),
    ("", "Traceback (most recent call last):\n  File x\nKeyError: 'mark'\n",
     "Traceback (most recent call last): / File x / KeyError: 'mark'"),
    ("", "", "no answer within 20s"),
])
def test_why_a_guard_did_not_start(answer: str, stderr: str, why: str) -> None:
    assert network.guard_failure(answer, stderr) == why
