"""The host's side of workspaces' networks (`network.ensure_host`, `network.attach`) on a
machine that also forwards traffic of its own, as a Docker or podman host does for its
containers' bridges: the worker's table touches workspaces' links only.

Everything runs in network namespaces the test makes; the worker's host-side code runs
in one of them (`ip netns exec`), which stands for the host:

    netns ctr (a container)           netns fakehost (the "host")          netns out (the internet)
      eth0 10.88.0.2/24 ── veth ── cbr0 bridge 10.88.0.1/24
                                    up0 198.51.100.1/30 ──────── veth ───── eth0 198.51.100.2/30
                                    bfwN ── veth ── eth0 (netns ws: a workspace, egress)

The worker finds forwarding off there (the test turns it off), as on a host where
Docker or podman starts after the worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from privilege import needs_root

from .netns_helpers import NetNs, sh

pytestmark = needs_root("a root worker's host-side rules")

#: The host table an older worker loaded when it found forwarding off: its last forward
#: rule dropped everything forwarded between two interfaces that were not links.
OLD_HOST_TABLE = """table inet bashfleet
delete table inet bashfleet
table inet bashfleet {
    chain forward {
        type filter hook forward priority filter - 10; policy accept;
        iifname "bfw*" oifname "bfw*" drop
        iifname "bfw*" accept
        oifname "bfw*" ct state established,related accept
        oifname "bfw*" drop
        iifname != "bfw*" oifname != "bfw*" drop
    }
}
"""

#: Connects to each `host:port` argument and prints `target outcome` per line: `ok`,
#: `refused` (a reset, ECONNREFUSED or an ICMP refusal) or `timeout` (dropped).
PROBE = r"""
import errno, socket, sys
for target in sys.argv[1:]:
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2) as s:
            s.settimeout(2)
            outcome = "ok" if s.recv(16) else "refused"
    except (ConnectionRefusedError, ConnectionResetError):
        outcome = "refused"
    except socket.timeout:
        outcome = "timeout"
    except OSError as exc:
        gone = (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EACCES, errno.EPERM)
        outcome = "refused" if exc.errno in gone else f"error:{exc.errno}"
    print(target, outcome)
"""

#: The worker's host-side setup, run in the fake host's namespace: the host table, then
#: an `egress` workspace's link and rules for the keeper pid given; prints the link.
WORKER_SIDE = r"""
import json, sys
from pathlib import Path
from bashfleet.worker.engine import sandbox
from bashfleet.worker.engine.network import network
from bashfleet.worker.settings import Settings
args = json.loads(sys.argv[1])
network.OLD_FORWARDING_MARK = Path(args["mark"])
settings = Settings(state_dir=args["state"], host="test", redis_url="redis://203.0.113.77:6379/0",
                    network_resolvers=("198.51.100.2",))
state = network.apply(args["keeper"], None, network.State(), sandbox.EGRESS, settings)
link = network.link_of(settings.network_pool, state.link)
print(json.dumps({"iface": link.iface, "ws_ip": link.ws_ip, "host_ip": link.host_ip}))
"""


@dataclass
class FakeHost:
    """The namespaces of the module's diagram, by name; what runs in them."""

    host: str
    ctr: str
    out: str
    ws: str
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def run(self, netns: str, *argv: str) -> str:
        return sh("ip", "netns", "exec", netns, *argv).stdout

    def probe(self, netns: str, *targets: str) -> dict[str, str]:
        lines = self.run(netns, sys.executable, "-c", PROBE, *targets).splitlines()
        return dict(line.split() for line in lines)

    def ruleset(self) -> str:
        return self.run(self.host, "nft", "list", "table", "inet", "bashfleet")

    def forwarding(self) -> str:
        return self.run(self.host, "cat", "/proc/sys/net/ipv4/ip_forward").strip()


def _serve(netns: str, port: int, fake: FakeHost) -> None:
    """A TCP server on every address of `netns` that says hello (ready when this returns)."""
    server = NetNs(netns, "", "")
    server.serve(tcp=[("0.0.0.0", port)])  # noqa: S104 - in a namespace the test made
    fake.procs.extend(server.servers)


@pytest.fixture(name="fake")
def _fake_fixture() -> Iterator[FakeHost]:
    tag = uuid.uuid4().hex[:6]
    fake = FakeHost(f"bfh{tag}", f"bfc{tag}", f"bfo{tag}", f"bfs{tag}")
    made: list[str] = []
    try:
        for name in (fake.host, fake.ctr, fake.out, fake.ws):
            sh("ip", "netns", "add", name)
            made.append(name)
        host = ("ip", "-n", fake.host)
        for netns in (fake.host, fake.ctr, fake.out, fake.ws):
            sh("ip", "-n", netns, "link", "set", "lo", "up")
        # A container on a bridge, as Docker's docker0 or podman's podman0.
        sh(*host, "link", "add", "cbr0", "type", "bridge")
        sh(*host, "addr", "add", "10.88.0.1/24", "dev", "cbr0")
        sh(*host, "link", "set", "cbr0", "up")
        sh(*host, "link", "add", "cveth", "type", "veth", "peer", "name", "eth0", "netns", fake.ctr)
        sh(*host, "link", "set", "cveth", "master", "cbr0", "up")
        sh("ip", "-n", fake.ctr, "addr", "add", "10.88.0.2/24", "dev", "eth0")
        sh("ip", "-n", fake.ctr, "link", "set", "eth0", "up")
        sh("ip", "-n", fake.ctr, "route", "add", "default", "via", "10.88.0.1")
        # The host's uplink to "the internet".
        sh(*host, "link", "add", "up0", "type", "veth", "peer", "name", "eth0", "netns", fake.out)
        sh(*host, "addr", "add", "198.51.100.1/30", "dev", "up0")
        sh(*host, "link", "set", "up0", "up")
        sh("ip", "-n", fake.out, "addr", "add", "198.51.100.2/30", "dev", "eth0")
        sh("ip", "-n", fake.out, "link", "set", "eth0", "up")
        sh("ip", "-n", fake.out, "route", "add", "default", "via", "198.51.100.1")
        _serve(fake.out, 7000, fake)
        _serve(fake.ctr, 7000, fake)
        _serve(fake.ws, 7000, fake)
        yield fake
    finally:
        for proc in fake.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait(10)
        for name in made:
            sh("ip", "netns", "del", name, check=False)


def test_the_host_table_touches_no_traffic_but_workspaces(fake: FakeHost, tmp_path: Path) -> None:
    # The container reaches the internet through the host once it forwards...
    sh("ip", "netns", "exec", fake.host, "sysctl", "-qw", "net.ipv4.ip_forward=1")
    assert fake.probe(fake.ctr, "198.51.100.2:7000") == {"198.51.100.2:7000": "ok"}
    # ...and an older worker's table, loaded where it had found forwarding off, silently
    # dropped it (a timeout, no refusal): what a Docker host's containers lost.
    subprocess.run(["ip", "netns", "exec", fake.host, "nft", "-f", "-"], input=OLD_HOST_TABLE,
                   text=True, check=True, timeout=30)
    assert fake.probe(fake.ctr, "198.51.100.2:7000") == {"198.51.100.2:7000": "timeout"}

    # Now: forwarding off again, and the worker's own host setup with a workspace on it.
    sh("ip", "netns", "exec", fake.host, "sysctl", "-qw", "net.ipv4.ip_forward=0")
    mark = tmp_path / "forwarding-was-off"
    mark.touch()  # an older worker's marker: removed, never read
    keeper = subprocess.Popen(["ip", "netns", "exec", fake.ws, "sleep", "600"],
                              start_new_session=True, text=True)
    fake.procs.append(keeper)
    done = subprocess.run(
        ["ip", "netns", "exec", fake.host, sys.executable, "-c", WORKER_SIDE,
         json.dumps({"keeper": keeper.pid, "state": str(tmp_path / "state"),
                     "mark": str(mark)})],
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    link = json.loads(done.stdout)
    assert fake.forwarding() == "1"  # turned on, as podman and Docker do
    table = fake.ruleset()
    assert "bfw" in table
    # Every rule of the table matches a workspace's link as its way in or out, so no
    # other packet is matched by any.
    rules = [line.strip() for line in table.splitlines()
             if line.strip() and not line.strip().startswith(("table", "chain", "type", "}"))]
    assert len(rules) == 7, table
    assert all('iifname "bfw*"' in rule or 'oifname "bfw*"' in rule for rule in rules), table

    # The container's traffic passes again, both ways through the host.
    assert fake.probe(fake.ctr, "198.51.100.2:7000") == {"198.51.100.2:7000": "ok"}
    assert fake.probe(fake.out, "10.88.0.2:7000") == {"10.88.0.2:7000": "ok"}
    assert not mark.exists()
    # The workspace's policy still holds: the internet yes; the container (a private
    # range), the host itself, no; nothing new into the workspace from either.
    found = fake.probe(fake.ws, "198.51.100.2:7000", "10.88.0.2:7000", "198.51.100.1:22",
                       f"{link['host_ip']}:22")
    assert found == {"198.51.100.2:7000": "ok", "10.88.0.2:7000": "refused",
                     "198.51.100.1:22": "refused", f"{link['host_ip']}:22": "refused"}, found
    into = f"{link['ws_ip']}:7000"
    assert fake.probe(fake.ctr, into) == {into: "timeout"}
    assert fake.probe(fake.out, into) in ({into: "timeout"}, {into: "refused"})
