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
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from privilege import needs_root

from bashfleet.client import CallRejected, Fleet
from bashfleet.client.errors import WorkerError
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.engine import workspaces
from bashfleet.worker.engine.network import netlog, network
from bashfleet.worker.engine.snapshots import snapshots
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire import names
from bashfleet.worker.wire.events import open_event
from bashfleet.worker.wire.models import CallResult
from bashfleet.worker.wire.network import parse_text as parse
from bashfleet.worker.wire.owner_keys import OwnerKey

from .conftest import RECORD_KEYS, WorkerFactory, WorkerProcess, wait_for
from .engine_helpers import (
    Engine,
    Janitor,
    _janitor_fixture,  # noqa: F401 - the `janitor` fixture
    engine_with,
)
from .netns_helpers import NetNs, make_netns, reachable

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


#: Every address of a test's own namespace.
ANY = "0.0.0.0"  # noqa: S104 - inside a namespace the test made


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


@pytest.fixture(name="net", scope="module")
def _net_fixture() -> Iterator[NetNs]:
    """The internet stand-in: HTTP on :80 and :8080, TCP on :7000, DNS on :53 (good.test
    and other.test are its address); 169.254.169.254 and 100.64.77.2 serve too."""
    with make_netns("203.0.113.0/24") as net:
        net.add_address("169.254.169.254")
        net.add_address("100.64.77.2")
        names = {"good.test": net.ns_ip, "other.test": net.ns_ip,
                 "a.wild.test": net.ns_ip, "wild.test": net.ns_ip}
        net.serve(http=[(ANY, 80), (ANY, 8080)], tcp=[(ANY, 7000)],
                  dns=(net.ns_ip, names))
        yield net


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


# ----------------------------------------------------------------- through a real fleet


FLOOD = r"""python3 - "$@" <<'EOF'
import socket, sys
opened, refused = [], 0
for target in sys.argv[2:]:
    host, _, port = target.rpartition(":")
    for _ in range(int(sys.argv[1])):
        try:
            opened.append(socket.create_connection((host, int(port)), timeout=3))
        except OSError:
            refused += 1
print("opened", len(opened), "refused", refused)
EOF"""


@pytest.fixture(name="nethost", scope="module")
def _nethost_fixture(session_workers: WorkerFactory, net: NetNs) -> Iterator[WorkerProcess]:
    yield from session_workers.module_host(
        "netpol", env={"BASHFLEET_NETWORK_RESOLVERS": net.ns_ip})


def _host_addresses() -> list[str]:
    """This machine's own IPv4 addresses beyond loopback (a server on 0.0.0.0 has them)."""
    done = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                          capture_output=True, text=True, check=True)
    return [line.split()[3].split("/")[0] for line in done.stdout.splitlines()
            if not line.split()[1].startswith(("bfw", "bft"))]


def test_finding_1_a_job_cannot_reach_the_fleets_redis(
        nethost: WorkerProcess, redis_server: RedisServer, redis_client: redis.Redis) -> None:
    """Replays an attack that once worked: a background job (no Redis password needed)
    opens connections to the fleet's Redis until none is left for anyone. Each address
    it tries is shown reachable from the host first; from the workspace every one is
    refused at once, and another owner's calls and kills go on as before."""
    url = urlsplit(redis_server.url)
    port = int(url.port or 6379)
    targets = [f"{address}:{port}" for address in ["127.0.0.1", *_host_addresses()]
               if reachable(address, port)]
    assert f"127.0.0.1:{port}" in targets  # the attack's target is real, from the host
    before = int(redis_client.info("clients")["connected_clients"])
    with Fleet(redis_server.url, owner="tenant-attacker") as attacker, \
            Fleet(redis_server.url, owner="tenant-other") as other:
        ws = attacker.workspace(host="netpol")
        start = time.monotonic()
        flood = ws.run("set -- 500 " + " ".join(targets) + "\n" + FLOOD, timeout=120)
        assert flood.stdout.split() == ["opened", "0", "refused", str(500 * len(targets))]
        assert time.monotonic() - start < 60  # refused at once, not 500 timeouts
        assert int(redis_client.info("clients")["connected_clients"]) < before + 20
        job = ws.run("sleep 300", mode="background").job
        assert job is not None
        assert other.run("echo still here", host="netpol").stdout == "still here\n"
        assert attacker.kill(job.id).running is False


def test_allow_refusals_are_events_and_a_live_workspace_changes_policy(
        nethost: WorkerProcess, net: NetNs, redis_server: RedisServer,
        redis_client: redis.Redis) -> None:
    with Fleet(redis_server.url, owner=f"tenant-{uuid.uuid4().hex[:8]}") as fleet:
        ws = fleet.workspace(host="netpol", network="allow=good.test")
        assert str(ws.view.network) == "allow=good.test"
        assert "host=good.test" in ws.run("curl -sS -m 5 http://good.test/").stdout
        refused = ws.run(f"curl -sS -m 5 http://{net.ns_ip}:8080/; echo rc=$?")
        assert refused.stdout.strip().endswith("rc=7")
        wanted = f"{net.ns_ip}:8080/tcp"
        assert wanted in _denied_events(redis_client, ws.id)
        view = ws.set_network("egress")
        assert view.network.mode == "egress" and ws.info().network.mode == "egress"
        assert "hello from" in ws.run(f"curl -sS -m 5 http://{net.ns_ip}:8080/").stdout
        with pytest.raises(CallRejected):
            ws.set_network("allow=no_such!name")


def _denied_events(client: redis.Redis, ws_id: str, wanted: set[str] | None = None) -> set[str]:
    """The targets of the `denied` events of a workspace in the fleet's stream (their
    seals verified), once there is one (`wanted`: once they are among them; within 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        found = set()
        entries: list[tuple[str, dict[str, str]]] = client.xrevrange(  # type: ignore[assignment]
            names.EVENTS_KEY, count=500)
        for seq, fields in entries:
            event = open_event(RECORD_KEYS, fields["e"], seq)
            if event is not None and event.kind == "denied" and event.job_id == ws_id:
                found.add(str(event.target))
        if (wanted <= found if wanted else found) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)  # the host publishes every second


# ------------------------------------------------ a worker with the compose file's capabilities


#: docker-compose.yml's `cap_add` (after `cap_drop: [ALL]`), which the k8s manifest
#: gives too: no CAP_NET_BIND_SERVICE.
COMPOSE_CAPS = ("sys_admin", "sys_chroot", "setuid", "setgid", "setpcap", "net_admin", "kill",
                "sys_ptrace", "chown", "fowner", "dac_override")
BOUNDING = "-all," + ",".join(f"+{cap}" for cap in COMPOSE_CAPS)
CAP_NET_BIND_SERVICE = 10


class CappedWorker(WorkerProcess):
    """A worker whose capabilities are the compose file's (its bounding set, so what it
    starts, the guard too, has no more)."""

    def args(self) -> list[str]:
        return ["setpriv", f"--bounding-set={BOUNDING}", "--inh-caps=-all", "--",
                *super().args()]


@pytest.fixture(name="capped", scope="module")
def _capped_fixture(session_workers: WorkerFactory, net: NetNs) -> Iterator[WorkerProcess]:
    worker = CappedWorker(
        "netcap", session_workers.url, state_dir=session_workers.state_dir("netcap"),
        log_dir=session_workers.base / "logs", concurrency=2,
        extra_env={"BASHFLEET_NETWORK_RESOLVERS": net.ns_ip}, projects=session_workers.projects)
    worker.start()
    session_workers.started.append(worker)
    try:
        worker.wait_ready(session_workers.client)
        yield worker
    finally:
        worker.stop()
        worker.kill_jobs()
        session_workers.started.remove(worker)


def _bind_low_port(*prefix: str) -> subprocess.CompletedProcess[str]:
    """Bind port 999 (where the guard listened before) in a new network namespace."""
    script = "import socket; socket.socket().bind(('127.0.0.1', 999)); print('bound')"
    return subprocess.run([*prefix, "unshare", "-n", "python3", "-c", script],
                          capture_output=True, text=True, timeout=30, check=False)


def _guard_pid(worker: WorkerProcess, ws_id: str) -> int:
    settings = Settings(state_dir=worker.state_dir)
    state = network.load_state(settings, ws_id)
    assert state.guard is not None
    return state.guard[0]


def test_allow_works_without_cap_net_bind_service(
        capped: CappedWorker, net: NetNs, redis_server: RedisServer) -> None:
    # What these capabilities cannot do: bind a port below 1024, even as root in a
    # network namespace of its own (the guard's ports were 53 and 999).
    assert _bind_low_port().stdout.strip() == "bound"
    denied = _bind_low_port("setpriv", f"--bounding-set={BOUNDING}", "--inh-caps=-all", "--")
    assert "Permission denied" in denied.stderr, denied
    with Fleet(redis_server.url, owner=f"tenant-{uuid.uuid4().hex[:8]}") as fleet:
        ws = fleet.workspace(host="netcap", network="allow=good.test")
        # Its guard runs without the capability, as the worker does.
        status = Path(f"/proc/{_guard_pid(capped, ws.id)}/status").read_text()
        effective = int(next(line.split()[1] for line in status.splitlines()
                             if line.startswith("CapEff:")), 16)
        assert not effective & (1 << CAP_NET_BIND_SERVICE), status
        got = ws.run("curl -sS -m 5 http://good.test/; getent hosts other.test; echo rc=$?")
        assert "host=good.test" in got.stdout and got.stdout.strip().endswith("rc=2"), got


SQUAT = r"""python3 - <<'EOF' &
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", PORT)); s.listen(1)
open("/tmp/squatting", "w").close()
time.sleep(300)
EOF"""


def test_a_guard_that_cannot_start_says_why(
        capped: CappedWorker, redis_server: RedisServer) -> None:
    """A call of a live workspace holds the guard's port (it is the workspace's own
    namespace): putting `allow` in force then fails, and the error says why, to the
    caller and in the worker's log (before, only "did not start")."""
    with Fleet(redis_server.url, owner=f"tenant-{uuid.uuid4().hex[:8]}") as fleet:
        ws = fleet.workspace(host="netcap")
        ws.run(SQUAT.replace("PORT", str(network.GUARD_PORT)), mode="background")
        assert ws.run("until [ -e /tmp/squatting ]; do sleep 0.05; done").exit_code == 0
        with pytest.raises(WorkerError) as refused:
            ws.set_network("allow=good.test")
        message = str(refused.value)
        assert "network guard did not start" in message, message
        assert "its proxy cannot listen on" in message, message
        assert f":{network.GUARD_PORT}: Address already in use" in message, message
        wait_for(lambda: "Address already in use" in capped.log(), 10,
                 "the worker's log to say why")


# ------------------------------------------------------- refusals, as their owner sees them


def _owner_env(redis_url: str, key: OwnerKey) -> dict[str, str]:
    """A client's environment as an owner's is deployed: its owner key only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BASHFLEET_")}
    env.update(BASHFLEET_REDIS_URL=redis_url, BASHFLEET_OWNER_KEY=key.text,
               BASHFLEET_STATE_DIR=os.environ["BASHFLEET_STATE_DIR"])
    return env


def _owner_fleet(redis_url: str, key: OwnerKey) -> Fleet:
    """An owner's client: its owner key, no fleet key (the process's environment as it
    was once it is made)."""
    saved = {name: os.environ.pop(name, None)
             for name in ("BASHFLEET_SIGNING_KEY", "BASHFLEET_OWNER_KEY")}
    os.environ["BASHFLEET_OWNER_KEY"] = key.text
    try:
        return Fleet(redis_url)
    finally:
        os.environ.pop("BASHFLEET_OWNER_KEY")
        os.environ.update({name: value for name, value in saved.items() if value is not None})


def _cli_denied(env: dict[str, str], ws_id: str, wanted: set[str],
                timeout: float = 15.0) -> set[str]:
    """The targets `bashfleet events --kind denied --since all` shows of a workspace,
    read until `wanted` are among them (or `timeout`: the command waits for more)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bashfleet.client.cli", "events", "--kind", "denied",
         "--since", "all", "--json"], env=env, stdout=subprocess.PIPE, text=True,
        stderr=subprocess.DEVNULL, start_new_session=True)
    found: set[str] = set()
    done = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            event = json.loads(line)
            if event["job_id"] == ws_id:
                found.add(str(event["target"]))
                if wanted and wanted <= found:
                    done.set()
        done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    done.wait(timeout)  # the events command never ends by itself: it follows the stream
    os.killpg(proc.pid, 9)
    proc.wait(10)
    reader.join(10)
    return set(found)


def test_refusals_are_their_owners_events_and_names_pass_on_80_and_443_only(
        nethost: WorkerProcess, net: NetNs, redis_server: RedisServer) -> None:
    """docs/network.md: `bashfleet events --kind denied` lists what a workspace was refused, and
    a listed name is reached by HTTP and TLS (ports 80 and 443). Before: an owner's own
    key opened none of its refusals (locked for the workers only), and a CONNECT or a
    Host: naming another port of a listed name reached that port."""
    fleet_key = os.environ["BASHFLEET_SIGNING_KEY"]
    alice = OwnerKey.issue(fleet_key, f"alice-{uuid.uuid4().hex[:6]}")
    bob = OwnerKey.issue(fleet_key, f"bob-{uuid.uuid4().hex[:6]}")
    fleet = _owner_fleet(redis_server.url, alice)
    ws = fleet.workspace(host="netpol", network="allow=good.test")
    try:
        # The way through that is meant to work: the guard, on 80, by CONNECT or Host.
        tunnel = ws.run("curl -sS -m 5 -p -x http://good.test:80 http://good.test/")
        assert "hello from 0.0.0.0:80 host=good.test" in tunnel.stdout, tunnel
        # Another port of the listed name, asked of the guard: refused (the server on
        # 8080 is there: the host reaches it).
        assert reachable(net.ns_ip, 8080)
        connect = ws.run("curl -sS -m 5 -p -x http://good.test:80 http://good.test:8080/")
        assert "hello from" not in connect.stdout, connect
        assert "CONNECT tunnel failed, response 403" in connect.stderr, connect
        host = ws.run("curl -sS -m 5 -H 'Host: good.test:8080' http://good.test/")
        assert "hello from" not in host.stdout, host
        assert "good.test:8080: a listed name is reached on ports 80 and 443 only" in host.stdout
        # An address the policy does not list: refused by the kernel, logged.
        refused = ws.run(f"curl -sS -m 5 http://{net.ns_ip}:7000/; echo rc=$?")
        assert refused.stdout.strip().endswith("rc=7"), refused
        wanted = {f"{net.ns_ip}:7000/tcp", "good.test:8080"}
        env = _owner_env(redis_server.url, alice)
        assert wanted <= _cli_denied(env, ws.id, wanted), "alice's own refusals, to her"
        # Another owner's key opens none of them.
        assert _cli_denied(_owner_env(redis_server.url, bob), ws.id, set(), 3.0) == set()
    finally:
        ws.delete()
        fleet.close()


def test_egress_refusals_are_recorded(nethost: WorkerProcess, net: NetNs,
                                      redis_server: RedisServer,
                                      redis_client: redis.Redis) -> None:
    """Under `egress` (no guard) what its rules refuse is recorded as under `allow`: a
    `denied` event, and the next result names it; a flood is recorded at a bounded rate."""
    with Fleet(redis_server.url, owner=f"tenant-{uuid.uuid4().hex[:8]}") as fleet:
        ws = fleet.workspace(host="netpol")
        assert ws.view.network.mode == "egress"
        assert "hello from" in ws.run(f"curl -sS -m 5 http://{net.ns_ip}:8080/").stdout
        refused = ws.run("curl -sS -m 5 http://169.254.169.254:8080/; echo rc=$?")
        assert refused.stdout.strip().endswith("rc=7"), refused
        noted = refused.network_denied + ws.run("true").network_denied
        assert "169.254.169.254:8080/tcp (address)" in noted, noted
        # A flood: 2,000 refused connections, recorded at most 50 a second (the rest
        # counted); what is refused after it is recorded again.
        flood = ws.run("set -- 2000 169.254.169.254:8081\n" + FLOOD)
        assert flood.stdout.split() == ["opened", "0", "refused", "2000"], flood
        path = network.denied_path(Settings(state_dir=nethost.state_dir), ws.id)
        deadline = time.monotonic() + 15
        while "100.64.77.2:8080/tcp" not in path.read_text():
            assert time.monotonic() < deadline, "nothing recorded after the flood"
            ws.run("curl -sS -m 5 http://100.64.77.2:8080/")  # a new refusal each time
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        flooded = [line for line in lines if line["target"] == "169.254.169.254:8081/tcp"]
        assert 0 < len(flooded) < 2000 // 4, len(flooded)
    wanted = {"169.254.169.254:8080/tcp", "100.64.77.2:8080/tcp"}
    assert wanted <= _denied_events(redis_client, ws.id, wanted)
