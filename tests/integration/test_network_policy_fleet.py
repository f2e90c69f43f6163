"""Network by policy through a real fleet: a job cannot reach the fleet's Redis, refusals
are their owner's events, a worker with only the Compose file's capabilities filters
workspaces' networks. The engine's own tests, and the namespaces that stand for the
internet and what a workspace must not reach: test_network_policy.py."""

from __future__ import annotations

import json
import os
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
from bashfleet.worker.engine.network import network
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire import names
from bashfleet.worker.wire.events import open_event
from bashfleet.worker.wire.owner_keys import OwnerKey

from .conftest import RECORD_KEYS, WorkerFactory, WorkerProcess, wait_for
from .netns_helpers import NetNs, reachable
from .network_policy_helpers import (
    _host_addresses,
    _net_fixture,  # noqa: F401 - the `net` fixture
)

pytestmark = needs_root("a root worker's networks")

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
