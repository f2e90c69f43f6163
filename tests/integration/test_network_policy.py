"""Network by policy (`bashfleet.worker.engine.network.network`): each workspace a network
namespace of its own, and what leaves it as its policy says. Each refusal is shown possible first:
the host reaches the very server the workspace is refused.

The servers are in network namespaces the tests make (`netns_helpers`): 203.0.113.0/24
(documentation addresses, outside every denied range) stands for the internet; the
fleet's Redis, the host's loopback, 169.254.169.254 and a shared-range (100.64/10)
server stand for what a workspace must not reach.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from privilege import needs_root

from bashfleet.worker.engine import workspaces
from bashfleet.worker.engine.network import netlog, network
from bashfleet.worker.engine.snapshots import snapshots
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import CallResult
from bashfleet.worker.wire.network import parse_text as parse

from .conftest import wait_for
from .engine_helpers import (
    Engine,
    Janitor,
    _janitor_fixture,  # noqa: F401 - the `janitor` fixture
    engine_with,
)
from .netns_helpers import NetNs, make_netns, reachable
from .network_policy_helpers import (
    ANY,
    _host_addresses,
    _net_fixture,  # noqa: F401 - the `net` fixture
)

pytestmark = needs_root("a root worker's networks")

#: Connects to each `host:port` argument and prints `target outcome seconds` per line:
#: `ok`, `refused` (ECONNREFUSED or a reset), `unreachable`, `timeout` or `error:...`.
PROBE = r"""python3 - "$@" <<'EOF'
import errno, socket, sys, time
for target in sys.argv[1:]:
    host, _, port = target.rpartition(":")
    start = time.monotonic()
    try:
        with socket.create_connection((host, int(port)), timeout=8) as s:
            s.settimeout(8)
            s.sendall(b"GET / HTTP/1.0\r\nHost: " + host.encode() + b"\r\n\r\n")
            data = s.recv(64)
        outcome = "ok" if data else "refused"
    except ConnectionRefusedError:
        outcome = "refused"
    except ConnectionResetError:
        outcome = "refused"
    except socket.timeout:
        outcome = "timeout"
    except OSError as exc:
        gone = (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EACCES, errno.EPERM)
        outcome = "unreachable" if exc.errno in gone else f"error:{exc.errno}"
    print(target, outcome, round(time.monotonic() - start, 3))
EOF"""


def probe(engine: Engine, ws_id: str, *targets: str) -> dict[str, tuple[str, float]]:
    """What a call in the workspace gets connecting to each target."""
    script = "set -- " + " ".join(targets) + "\n" + PROBE
    result = engine.run(script, workspace=ws_id)
    assert result.exit_code == 0, result.stderr
    found = {}
    for line in result.stdout.splitlines():
        target, outcome, seconds = line.split()
        found[target] = (outcome, float(seconds))
    return found


def refused_at_once(found: tuple[str, float]) -> bool:
    outcome, seconds = found
    return outcome in ("refused", "unreachable") and seconds < 1.0


@pytest.fixture(name="fleet_redis", scope="module")
def _fleet_redis_fixture() -> Iterator[NetNs]:
    """A stand-in for the fleet's Redis on a public address (TCP :6379)."""
    with make_netns("203.0.113.0/24") as net:
        net.serve(tcp=[(ANY, 6379)])
        yield net


@pytest.fixture(name="loopback_server")
def _loopback_server_fixture() -> Iterator[int]:
    """A server on the host's 127.0.0.1 (its port)."""
    yield from _host_server("127.0.0.1")


@pytest.fixture(name="host_server")
def _host_server_fixture() -> Iterator[int]:
    """A server on every address of the host (its port)."""
    yield from _host_server(ANY)


def _host_server(address: str) -> Iterator[int]:
    server = socket.socket()
    server.bind((address, 0))
    server.listen(16)
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.sendall(b"host loopback\n")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        server.close()


@pytest.fixture(name="neteng")
def _neteng_fixture(tmp_path: Path, janitor: Janitor, net: NetNs,
                    fleet_redis: NetNs) -> Iterator[Engine]:
    """A root engine whose fleet Redis is `fleet_redis` and whose resolver is `net`'s."""
    with engine_with(tmp_path, janitor, redis_url=f"redis://{fleet_redis.ns_ip}:6379/0",
                     network_resolvers=(net.ns_ip,)) as engine:
        yield engine


def test_none_is_loopback_only(neteng: Engine, net: NetNs) -> None:
    assert reachable(net.ns_ip, 8080)
    ws = neteng.workspace(network="none")
    assert ws.network.mode == "none"
    links = neteng.run("ip -o link show | awk -F': ' '{print $2}'", workspace=ws.id)
    assert links.stdout.split() == ["lo"]
    found = probe(neteng, ws.id, f"{net.ns_ip}:8080")
    assert refused_at_once(found[f"{net.ns_ip}:8080"]), found


def test_egress_reaches_the_internet_and_nothing_of_the_fleet_or_the_host(
        neteng: Engine, net: NetNs, fleet_redis: NetNs, loopback_server: int) -> None:
    # Each target is reachable from the host itself: the refusals below are the policy's.
    for address, port in ((net.ns_ip, 8080), (fleet_redis.ns_ip, 6379),
                          ("127.0.0.1", loopback_server), ("169.254.169.254", 8080),
                          ("100.64.77.2", 8080)):
        assert reachable(address, port), f"the host cannot reach {address}:{port}"
    ws = neteng.workspace()  # the default policy
    assert ws.network.mode == "egress"
    found = probe(neteng, ws.id, f"{net.ns_ip}:8080", f"{net.ns_ip}:7000",
                  f"{fleet_redis.ns_ip}:6379", f"127.0.0.1:{loopback_server}",
                  "169.254.169.254:8080", "100.64.77.2:8080")
    assert found[f"{net.ns_ip}:8080"][0] == "ok"
    assert found[f"{net.ns_ip}:7000"][0] == "ok"
    for refused in (f"{fleet_redis.ns_ip}:6379", f"127.0.0.1:{loopback_server}",
                    "169.254.169.254:8080", "100.64.77.2:8080"):
        assert refused_at_once(found[refused]), (refused, found)
    # DNS: the host's resolvers, whichever server the workspace's resolv.conf names.
    named = neteng.run("getent hosts good.test", workspace=ws.id)
    assert named.stdout.split()[:1] == [net.ns_ip], named


def test_a_workspaces_root_cannot_change_its_rules(neteng: Engine, net: NetNs) -> None:
    """Root inside a workspace runs nft (in a namespace of its own making it changes
    rules), but not its workspace's: the namespace belongs to the host's root."""
    ws = neteng.workspace()
    own = neteng.run("unshare -rn sh -c 'nft add table inet mine && nft list tables'",
                     workspace=ws.id)
    assert own.stdout.strip() == "table inet mine", own  # the tool works for it
    for attack in ("nft flush ruleset", "nft delete table inet bashfleet",
                   "ip link set eth0 down", "ip route del default"):
        tried = neteng.run(f"{attack}; echo rc=$?", workspace=ws.id)
        assert "rc=0" not in tried.stdout, (attack, tried)
    found = probe(neteng, ws.id, "169.254.169.254:8080", f"{net.ns_ip}:8080")
    assert refused_at_once(found["169.254.169.254:8080"]) and found[f"{net.ns_ip}:8080"][0] == "ok"


def test_egress_reaches_none_of_the_hosts_own_addresses(neteng: Engine, host_server: int) -> None:
    """A server of the host's on 0.0.0.0 (Redis bound so, say) by each of the host's
    addresses, public ones too: the host's table refuses whatever a link sends it."""
    targets = [f"{address}:{host_server}" for address in _host_addresses()]
    assert targets and all(reachable(address, host_server) for address in _host_addresses())
    found = probe(neteng, neteng.workspace().id, *targets)
    assert all(refused_at_once(found[target]) for target in targets), found


def test_a_private_range_the_operator_lists_is_reachable(
        tmp_path: Path, janitor: Janitor, net: NetNs) -> None:
    with engine_with(tmp_path, janitor, network_allow_private=("100.64.77.0/24",),
                     network_resolvers=(net.ns_ip,)) as engine:
        ws = engine.workspace()
        found = probe(engine, ws.id, "100.64.77.2:8080", "169.254.169.254:8080")
        assert found["100.64.77.2:8080"][0] == "ok"
        assert refused_at_once(found["169.254.169.254:8080"])


HOLD = r"""python3 - "$@" <<'EOF'
import socket, sys
held, refused = [], 0
for _ in range(int(sys.argv[1])):
    try:
        held.append(socket.create_connection((sys.argv[2], 80), timeout=5))
    except OSError:
        refused += 1
print(len(held), refused)
EOF"""


def test_a_workspaces_open_connections_are_capped(tmp_path: Path, janitor: Janitor,
                                                   net: NetNs) -> None:
    """`network_max_connections` (512 by default; 20 here): past it a new connection is
    refused at once, while those open stay open. The host holds 40 at once (the server
    keeps each open until it reads a request)."""
    held = [socket.create_connection((net.ns_ip, 80), timeout=5) for _ in range(40)]
    for sock in held:
        sock.close()
    with engine_with(tmp_path, janitor, network_max_connections=20,
                     network_resolvers=(net.ns_ip,)) as engine:
        ws = engine.workspace()
        result = engine.run(f"set -- 40 {net.ns_ip}\n" + HOLD, workspace=ws.id)
        assert result.stdout.split() == ["20", "20"], result


def test_allow_reaches_listed_names_only_and_records_the_rest(
        neteng: Engine, net: NetNs) -> None:
    ws = neteng.workspace(network="allow=good.test,*.wild.test")
    assert ws.network.allow == ("good.test", "*.wild.test")
    got = neteng.run("curl -sS -m 5 http://good.test/ && curl -sS -m 5 http://a.wild.test/",
                     workspace=ws.id)
    assert got.exit_code == 0, got.stderr
    assert "host=good.test" in got.stdout and "host=a.wild.test" in got.stdout
    # DNS answers listed names only (other.test exists: the host resolves it).
    dns = neteng.run("getent hosts other.test; echo rc=$?; getent hosts wild.test; echo rc=$?",
                     workspace=ws.id)
    assert dns.stdout.split() == ["rc=2", "rc=2"], dns
    # Another name, by its address: refused at once (not a timeout), and recorded.
    start = time.monotonic()
    named = neteng.run(f"curl -sS -m 5 --resolve other.test:80:{net.ns_ip} "
                       "http://other.test/", workspace=ws.id)
    assert "not in this workspace's allow list" in named.stdout
    assert time.monotonic() - start < 3.0
    found = probe(neteng, ws.id, f"{net.ns_ip}:7000", f"{net.ns_ip}:8080")
    assert refused_at_once(found[f"{net.ns_ip}:7000"]), found
    assert refused_at_once(found[f"{net.ns_ip}:8080"]), found
    wanted = {"other.test", "other.test:80", f"{net.ns_ip}:7000/tcp"}
    assert wanted <= _denied(neteng, ws.id, wanted)
    # A result says what was refused since the last result said it (the native dialect
    # shows it): the refusing call's own, or the next one's; once.
    refusing = neteng.run(f"curl -sS -m 5 http://{net.ns_ip}:7001/; true", workspace=ws.id)
    _denied(neteng, ws.id, {f"{net.ns_ip}:7001/tcp"})
    noted = refusing.network_denied + neteng.run("true", workspace=ws.id).network_denied
    assert noted.count(f"{net.ns_ip}:7001/tcp (address)") == 1, noted
    assert neteng.run("true", workspace=ws.id).network_denied == ()


def _denied(engine: Engine, ws_id: str, wanted: set[str]) -> set[str]:
    """The targets the workspace's guard recorded, once `wanted` are among them (or 10 s)."""
    path = network.denied_path(engine.settings, ws_id)
    deadline = time.monotonic() + 10
    while True:
        lines = path.read_text("utf-8").splitlines() if path.exists() else []
        found = {str(json.loads(line)["target"]) for line in lines}
        if wanted <= found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)  # the guard writes as it refuses


#: Through the guard: `held` CONNECT tunnels to good.test:80 (the server waits for a
#: request on each, so each holds two of the guard's sockets), then a plain GET, then
#: `more` tunnels; marks `holding` in the cwd and waits for `release` before it ends.
TUNNELS = r"""python3 - "$@" <<'EOF'
import os, socket, sys, time
address, held_n, more_n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def tunnel():
    try:
        sock = socket.create_connection((address, 80), timeout=10)
        sock.settimeout(10)
        sock.sendall(b"CONNECT good.test:80 HTTP/1.1\r\nHost: good.test:80\r\n\r\n")
        if sock.recv(64).startswith(b"HTTP/1.1 200"):
            return sock
        sock.close()
    except OSError:
        pass
    return None

tunnels = [tunnel() for _ in range(held_n)]
with socket.create_connection((address, 80), timeout=10) as sock:
    sock.settimeout(10)
    sock.sendall(b"GET / HTTP/1.0\r\nHost: good.test\r\n\r\n")
    got = b""
    while chunk := sock.recv(4096):
        got += chunk
tunnels += [tunnel() for _ in range(more_n)]
held = [sock for sock in tunnels if sock is not None]
print(len(held), len(tunnels) - len(held), b"host=good.test" in got)
open("holding", "w").close()
deadline = time.monotonic() + 60
while not os.path.exists("release") and time.monotonic() < deadline:
    time.sleep(0.1)
EOF"""


def _guard_descriptors(settings: Settings, ws_id: str) -> int:
    """How many descriptors the workspace's guard holds (it is the process writing the
    workspace's refusals)."""
    denied = str(network.denied_path(settings, ws_id))
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == denied for fd in fds):
                return len(fds)
    raise AssertionError(f"no guard of {ws_id}")


def test_the_guard_serves_past_1024_descriptors(tmp_path: Path, janitor: Janitor,
                                                net: NetNs) -> None:
    """A workspace's guard holds two sockets per connection, up to its 512: past 1024
    descriptors it still serves, and refuses at once past its cap. Its worker's soft
    descriptor limit is 1024 here (as a worker started from a shell often has): the guard
    raises its own."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with engine_with(tmp_path, janitor, network_resolvers=(net.ns_ip,)) as engine:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, soft), hard))
        try:
            ws = engine.workspace(network="allow=good.test")
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        outcome: list[CallResult] = []
        holding = threading.Thread(target=lambda: outcome.append(engine.run(
            f"set -- {net.ns_ip} 511 89\n" + TUNNELS, workspace=ws.id, timeout_s=110)))
        holding.start()
        try:
            deadline = time.monotonic() + 100
            while not (Path(ws.path) / "holding").exists() and holding.is_alive():
                assert time.monotonic() < deadline
                time.sleep(0.2)
            descriptors = _guard_descriptors(engine.settings, ws.id)
        finally:
            (Path(ws.path) / "release").touch()
            holding.join(30)
        (result,) = outcome
        # 512 held (511, then one more once the GET's slot was free), 88 refused.
        assert result.stdout.split() == ["512", "88", "True"], result.stderr
        assert descriptors > 1024
        again = engine.run("curl -sS -m 5 http://good.test/", workspace=ws.id)
        assert "host=good.test" in again.stdout, again


def test_recording_egress_refusals_holds_no_namespace(neteng: Engine) -> None:
    """The worker reads an `egress` workspace's refusals through a socket made in its
    namespace, which holds that namespace: closed once the keeper ends, so the
    workspace's link goes with it as before (a link left behind is a leak)."""
    ws = neteng.workspace()
    refused = neteng.run("curl -sS -m 5 http://169.254.169.254:8080/; true", workspace=ws.id)
    assert refused.exit_code == 0
    keeper = workspaces.load(ws.id, neteng.settings).keeper_pid
    link = network.load_state(neteng.settings, ws.id).link
    assert keeper is not None and link is not None and netlog.watching(keeper)
    iface = Path(f"/sys/class/net/{network.IFACE_PREFIX}{link}")
    assert iface.exists()
    start = time.monotonic()
    netlog.watch(keeper, ws.id, neteng.settings)  # watched already: nothing more
    assert time.monotonic() - start < 0.01
    workspaces.delete(ws.id, neteng.settings)
    wait_for(lambda: not netlog.watching(keeper), 10, "the reader to let the namespace go")
    wait_for(lambda: not iface.exists(), 10, "the workspace's link to go with its namespace")


def test_allow_by_cidr_and_tls_by_name(neteng: Engine, net: NetNs) -> None:
    ws = neteng.workspace(network=f"allow={net.ns_ip}/32")
    found = probe(neteng, ws.id, f"{net.ns_ip}:7000")
    assert found[f"{net.ns_ip}:7000"][0] == "ok"


def test_host_only_where_enabled(tmp_path: Path, janitor: Janitor, neteng: Engine,
                                 loopback_server: int) -> None:
    with pytest.raises(workspaces.WorkspaceError, match="NETWORK_HOST_OK"):
        neteng.workspace(network="host")
    with engine_with(tmp_path / "ok", janitor, network_host_ok=True) as engine:
        ws = engine.workspace(network="host")
        found = probe(engine, ws.id, f"127.0.0.1:{loopback_server}")
        assert found[f"127.0.0.1:{loopback_server}"][0] == "ok"


def test_the_policy_of_a_live_workspace_changes(neteng: Engine, net: NetNs) -> None:
    ws = neteng.workspace(network="none")
    target = f"{net.ns_ip}:8080"
    assert refused_at_once(probe(neteng, ws.id, target)[target])
    ws = workspaces.set_network(ws.id, parse("egress"), neteng.settings)
    assert probe(neteng, ws.id, target)[target][0] == "ok"
    ws = workspaces.set_network(ws.id, parse("allow=good.test"), neteng.settings)
    assert refused_at_once(probe(neteng, ws.id, target)[target])
    assert "host=good.test" in neteng.run("curl -sS -m 5 http://good.test/",
                                          workspace=ws.id).stdout
    ws = workspaces.set_network(ws.id, parse("none"), neteng.settings)
    assert refused_at_once(probe(neteng, ws.id, target)[target])
    assert workspaces.load(ws.id, neteng.settings).network.mode == "none"
    ws = workspaces.set_network(ws.id, parse("egress"), neteng.settings)  # a link anew
    assert probe(neteng, ws.id, target)[target][0] == "ok"
    with pytest.raises(workspaces.WorkspaceError, match="host's network namespace"):
        workspaces.set_network(ws.id, parse("host"), neteng.settings)


def test_a_snapshot_carries_the_policy_to_its_forks(neteng: Engine, net: NetNs) -> None:
    source = neteng.workspace(network="allow=good.test")
    snap, _ = snapshots.take(source, neteng.settings)
    assert snap.network == source.network
    fork = neteng.workspace(snapshot=snap.id)
    assert str(fork.network) == "allow=good.test"
    assert "host=good.test" in neteng.run("curl -sS -m 5 http://good.test/",
                                          workspace=fork.id).stdout
    target = f"{net.ns_ip}:8080"
    assert refused_at_once(probe(neteng, fork.id, target)[target])
    # A fork may be made with another policy.
    assert neteng.workspace(snapshot=snap.id, network="none").network.mode == "none"


SERVE_BOTH = r"""python3 - <<'EOF' &
import socket, threading
tcp = socket.socket(); tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.bind(("127.0.0.1", 7777)); tcp.listen(8)
uds = socket.socket(socket.AF_UNIX); uds.bind("\0bashfleet-test-abstract"); uds.listen(8)
open("/tmp/serving", "w").close()  # both listen: what the test waits for
def serve(s):
    while True:
        c, _ = s.accept(); c.sendall(b"mine\n"); c.close()
threading.Thread(target=serve, args=(uds,), daemon=True).start()
serve(tcp)
EOF"""

CONNECT_BOTH = r"""python3 - <<'EOF'
import socket
for family, address in ((socket.AF_INET, ("127.0.0.1", 7777)),
                        (socket.AF_UNIX, "\0bashfleet-test-abstract")):
    s = socket.socket(family)
    try:
        s.connect(address); print(s.recv(16).decode().strip())
    except OSError as exc:
        print("refused", exc.errno)
EOF"""


def test_loopback_and_abstract_sockets_are_each_workspaces_own(neteng: Engine) -> None:
    first, second = neteng.workspace(), neteng.workspace()
    neteng.run(SERVE_BOTH, workspace=first.id, background=True)
    # Its server listening (a fixed sleep was too short on a loaded host), in its own /tmp.
    ready = neteng.run("until [ -e /tmp/serving ]; do sleep 0.05; done", workspace=first.id)
    assert ready.exit_code == 0, ready
    assert neteng.run(CONNECT_BOTH, workspace=first.id).stdout.split("\n")[:2] == ["mine", "mine"]
    other = neteng.run(CONNECT_BOTH, workspace=second.id).stdout.splitlines()
    assert [line.split()[0] for line in other] == ["refused", "refused"], other
    # Nor the host: its loopback and abstract names are not the workspace's.
    with socket.socket(socket.AF_UNIX) as uds, pytest.raises(OSError):
        uds.connect("\0bashfleet-test-abstract")
