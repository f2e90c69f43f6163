"""A worker that is not root (a person's own machine, `bashfleet up` as a user): each
workspace still has a network namespace of its own, and `egress` goes through pasta
(`bashfleet.worker.engine.network.usernet`), never to the host's loopback, the fleet's Redis or
the host's own addresses; `host` only where the operator says so.

The worker runs as `nobody`. The internet stands in as a network namespace the test
makes (`netns_helpers`: 203.0.113.0/24); the host's loopback and the fleet's Redis are
servers on the host's 127.0.0.1. Every refusal is shown possible first: the same probe
reaches the same server from the host's namespace (`host`, enabled explicitly).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from privilege import needs_root

from .engine_helpers import home_for_nobody, readable_install, wait_until
from .netns_helpers import NetNs, make_netns, reachable
from .test_network_policy import HOLD, PROBE

pytestmark = needs_root("runs a worker as another user")

TUN = Path("/dev/net/tun")


@pytest.fixture(name="tun", scope="module")
def _tun_fixture() -> Iterator[None]:
    """pasta opens /dev/net/tun as the worker's user: most systems make it 0666 (a udev
    rule); a machine that made it root's alone gets that mode for these tests, then its
    own back."""
    mode = stat.S_IMODE(TUN.stat().st_mode)
    if mode & 0o006 != 0o006:
        TUN.chmod(mode | 0o666)
    try:
        yield
    finally:
        TUN.chmod(mode)


@pytest.fixture(name="net", scope="module")
def _net_fixture() -> Iterator[NetNs]:
    """The internet stand-in (HTTP :80, TCP :7000, DNS), a metadata address on it, and a
    server on its host side's address (an address of the host itself)."""
    with make_netns("203.0.113.0/24") as net:
        net.add_address("169.254.169.254")
        names = {"good.test": net.ns_ip}
        net.serve(http=[("0.0.0.0", 80)], tcp=[("0.0.0.0", 7000)],  # noqa: S104
                  dns=(net.ns_ip, names))
        yield net


def _serve(address: str) -> Iterator[int]:
    server = socket.socket()
    server.bind((address, 0))
    server.listen(64)
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with contextlib.suppress(OSError):
                conn.sendall(b"host\n")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        server.close()


@pytest.fixture(name="loopback")
def _loopback_fixture() -> Iterator[int]:
    """A server on the host's 127.0.0.1 (another user's local service, say)."""
    yield from _serve("127.0.0.1")


@pytest.fixture(name="redis_port")
def _redis_port_fixture() -> Iterator[int]:
    """A stand-in for the fleet's Redis on the host's 127.0.0.1."""
    yield from _serve("127.0.0.1")


@pytest.fixture(name="own_address")
def _own_address_fixture(net: NetNs) -> Iterator[tuple[str, int]]:
    """A server on an address of the host's own (its side of the test link)."""
    for port in _serve(net.host_ip):
        yield net.host_ip, port


def as_nobody(script: str, *args: str, home: Path, timeout: float = 240.0,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a Python script as `nobody` (this environment's packages importable)."""
    nobody = pwd.getpwnam("nobody")
    return subprocess.run(
        ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
         "/usr/bin/python3", "-c", script, *args],
        capture_output=True, text=True, timeout=timeout, check=False, cwd="/",
        env={"PATH": os.defpath, "HOME": str(home),
             "PYTHONPATH": os.pathsep.join(readable_install()), **(env or {})})


@pytest.fixture(name="home")
def _home_fixture() -> Iterator[Path]:
    with home_for_nobody("bashfleet-rootless-net-") as home:
        yield home


def gone(pids: list[list[Any]]) -> bool:
    """Whether none of these (pid, start ticks) runs any more."""
    for pid, ticks in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[19]) == ticks and fields[0] != "Z":
                return False
    return True


# ------------------------------------------------------------------ the worker's engine

ENGINE_SCRIPT = r"""
import json, os, subprocess, sys, time
home, config = sys.argv[1], json.loads(sys.argv[2])
os.environ["XDG_STATE_HOME"] = os.path.join(home, "xdg")
os.environ["XDG_DATA_HOME"] = os.path.join(home, "data")
from bashfleet.worker import Call, run_call
from bashfleet.worker.engine import sandbox, workspaces
from bashfleet.worker.engine.network import network
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import WorkspaceSpec
from bashfleet.worker.wire.network import parse_text
settings = Settings(state_dir=os.path.join(home, "state"), host="rootless-net",
                    redis_url=config["redis_url"], network_resolvers=(config["dns"],),
                    network_max_connections=config["cap"], network_host_ok=True,
                    **config.get("settings", {}))
out = {"problems": sandbox.startup_problems(settings), "probe": sandbox.probe(settings).network}
n = [0]
def run(command, ws=None):
    n[0] += 1
    result = run_call(Call(call_id=f"rootless-net-{n[0]}", command=command, workspace=ws),
                      settings=settings)
    return {"out": result.stdout, "err": result.stderr,
            "error": result.error.message if result.error else None}

def ours():
    # (pid, start ticks) of this process's tethers and their pasta.
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if any(b"usernet_tether" in part for part in cmd[:3]) or cmd[0].endswith(b"pasta"):
            found.append([int(pid), int(fields[19]), cmd[0].decode()])
    return found

made = []
try:
    if config.get("only_policy"):
        try:
            asked = WorkspaceSpec(network=parse_text(config["only_policy"]))
            made.append(workspaces.create(asked, settings))
            out["asked"] = str(made[-1].network)
        except Exception as exc:
            out["asked"] = f"refused: {exc}"
        made.append(workspaces.create(WorkspaceSpec(), settings))
        out["policy"] = str(made[-1].network)
        out["links"] = run("ip -o link show | awk -F': ' '{print $2}'", made[-1].id)["out"].split()
    else:
        ws = workspaces.create(WorkspaceSpec(), settings)
        made.append(ws)
        out["policy"] = str(ws.network)
        out["state"] = network.load_state(settings, ws.id).dumps()
        out["hold"] = run(config["hold"], ws.id)  # first: DNS flows count too
        out["egress"] = run(config["probe"], ws.id)
        out["dns"] = run("getent hosts good.test", ws.id)
        out["attack"] = run("nft flush ruleset; echo rc=$?; ip link set eth0 down; echo rc=$?; "
                            "unshare -rn true; echo rc=$?", ws.id)
        out["after_attack"] = run(config["probe"], ws.id)
        workspaces.set_network(ws.id, parse_text("none"), settings)
        out["none"] = run(config["probe"], ws.id)
        workspaces.set_network(ws.id, parse_text("egress"), settings)
        out["egress_again"] = run(config["probe"], ws.id)
        host = workspaces.create(WorkspaceSpec(network=parse_text("host")), settings)
        made.append(host)
        out["host"] = run(config["probe"], host.id)
        out["throwaway"] = run(config["probe"])
        # A server on the workspace's own loopback: its own calls reach it, no other
        # workspace does, nor the host's namespace.
        run_call(Call(call_id="rootless-net-serve", background=True, workspace=ws.id,
                      command=config["serve"]), settings=settings)
        out["own_loopback"] = run("for i in $(seq 100); do [ -e /tmp/serving ] && break; "
                                  "sleep 0.1; done\n" + config["mine"], ws.id)
        out["other_loopback"] = run(config["mine"])
        out["host_loopback"] = run(config["mine"], host.id)
        try:
            workspaces.create(WorkspaceSpec(network=parse_text("allow=good.test")), settings)
            out["allow"] = "made"
        except Exception as exc:
            out["allow"] = str(exc)
    out["running"] = ours()
finally:
    for record in made:
        workspaces.delete(record.id, settings)
    deadline = time.monotonic() + 10  # a throwaway's end runs in a thread
    while workspaces.local_records(settings) and time.monotonic() < deadline:
        time.sleep(0.05)
    for record in workspaces.local_records(settings):
        workspaces.delete(record.id, settings)
    sandbox.close_all()
print(json.dumps(out))
"""


def probe_script(*targets: str) -> str:
    return "set -- " + " ".join(targets) + "\n" + PROBE


#: Connects to each `host:port` argument: `ok` once connected (Redis closes at once on
#: PROBE's HTTP request, which PROBE takes for a refusal), else why not.
CONNECT = r"""python3 - "$@" <<'EOF'
import errno, socket, sys
for target in sys.argv[1:]:
    host, _, port = target.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=8).close()
        outcome = "ok"
    except (ConnectionRefusedError, ConnectionResetError):
        outcome = "refused"
    except socket.timeout:
        outcome = "timeout"
    except OSError as exc:
        gone = (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EACCES, errno.EPERM)
        outcome = "unreachable" if exc.errno in gone else f"error:{exc.errno}"
    print(target, outcome)
EOF"""


#: A server on the workspace's 127.0.0.1:7788 (a background job); /tmp/serving once it
#: listens.
SERVE_MINE = r"""python3 - <<'EOF'
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 7788)); s.listen(8)
open("/tmp/serving", "w").close()
while True:
    c, _ = s.accept(); c.sendall(b"mine\n"); c.close()
EOF"""


def outcomes(result: dict[str, Any]) -> dict[str, str]:
    assert result["error"] is None, result
    return {line.split()[0]: line.split()[1] for line in result["out"].splitlines()}


def test_a_worker_that_is_not_root_gives_egress_through_pasta_and_nothing_of_the_host(  # noqa: PLR0917
        tun: None, net: NetNs, home: Path, loopback: int, redis_port: int,
        own_address: tuple[str, int]) -> None:
    del tun
    internet, metadata = f"{net.ns_ip}:80", "169.254.169.254:80"
    local, fleet = f"127.0.0.1:{loopback}", f"127.0.0.1:{redis_port}"
    host_own = f"{own_address[0]}:{own_address[1]}"
    # Each target answers the host: what the workspace is refused below is the policy.
    for target in (internet, metadata, local, fleet, host_own):
        address, _, port = target.rpartition(":")
        assert reachable(address, int(port)), target
    config = {"redis_url": f"redis://127.0.0.1:{redis_port}/0", "dns": net.ns_ip, "cap": 5,
              "probe": probe_script(internet, metadata, local, fleet, host_own),
              "hold": f"set -- 12 {net.ns_ip}\n" + HOLD, "serve": SERVE_MINE,
              "mine": "set -- 127.0.0.1:7788\n" + CONNECT}
    done = as_nobody(ENGINE_SCRIPT, str(home), json.dumps(config), home=home)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.splitlines()[-1])
    errors, warnings = out["problems"]
    # Nothing about its network (a cgroup it cannot make, as a user's worker may not, is
    # said, and is not this test's).
    assert errors == [] and not [w for w in warnings if "network" in w], out
    assert out["probe"] == "egress", out
    assert out["policy"] == "egress"
    assert json.loads(out["state"])["pasta"] is not None  # its tether, recorded

    egress = outcomes(out["egress"])
    assert egress[internet] == "ok", out["egress"]
    for refused in (metadata, local, fleet, host_own):
        assert egress[refused] in ("refused", "unreachable"), (refused, egress)
    assert out["dns"]["out"].split()[:1] == [net.ns_ip], out["dns"]
    # At most `network_max_connections` (5 here) open at once; past it refused at once.
    assert out["hold"]["out"].split() == ["5", "7"], out["hold"]
    # A call's root cannot change its rules nor its link (they are the worker's).
    assert "rc=0\nrc=0" not in out["attack"]["out"], out["attack"]
    assert outcomes(out["after_attack"])[metadata] != "ok"
    # Its policy changes while it lives: none cuts it, egress links it again.
    assert outcomes(out["none"])[internet] != "ok", out["none"]
    again = outcomes(out["egress_again"])
    assert again[internet] == "ok" and again[local] != "ok" and again[fleet] != "ok", again
    # The same probe from the host's namespace (`host`, which this worker was told it may
    # give) reaches the loopback server and the Redis: the refusals above are the policy's.
    host = outcomes(out["host"])
    assert host[local] == "ok" and host[fleet] == "ok", out["host"]
    # A throwaway workspace (a call with none) gets the same.
    throwaway = outcomes(out["throwaway"])
    assert throwaway[internet] == "ok" and throwaway[local] != "ok", throwaway
    assert throwaway[fleet] != "ok", throwaway
    assert "needs a root worker" in out["allow"], out["allow"]
    assert outcomes(out["own_loopback"])["127.0.0.1:7788"] == "ok", out["own_loopback"]
    assert outcomes(out["other_loopback"])["127.0.0.1:7788"] == "refused"
    assert outcomes(out["host_loopback"])["127.0.0.1:7788"] == "refused"
    # Every tether and pasta it ran ends with its workspace (or its ready keeper).
    assert out["running"] and any(cmd.endswith("pasta") for *_, cmd in out["running"])
    wait_until(lambda: gone([entry[:2] for entry in out["running"]]),
               what="every pasta and tether to end with their keepers")


def test_without_pasta_the_default_is_none_said_at_start_and_egress_is_refused(
        home: Path) -> None:
    config = {"redis_url": "redis://127.0.0.1:1/0", "dns": "127.0.0.1", "cap": 5,
              "only_policy": "egress", "settings": {"pasta": "/nonexistent/pasta"}}
    done = as_nobody(ENGINE_SCRIPT, str(home), json.dumps(config), home=home)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.splitlines()[-1])
    errors, warnings = out["problems"]
    assert errors == [] and any("no network" in w and "apt-get install passt" in w
                                for w in warnings), warnings
    assert out["asked"].startswith("refused") and "passt" in out["asked"], out["asked"]
    # Never the host's namespace by default, though this worker may give it when asked.
    assert out["policy"] == "none" and out["links"] == ["lo"], out
    assert out["probe"] == "none"



# ------------------------------------------------------------- `bashfleet up` as a user

CLI = "import sys\nfrom bashfleet.client.cli import main\nsys.exit(main(sys.argv[1:]))\n"


class UserFleet:
    """`bashfleet up` and its calls, as `nobody` with a HOME of its own."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {"BASHFLEET_STATE_DIR": str(home / "state"),
                    "XDG_STATE_HOME": str(home / "xdg")}

    def __call__(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return as_nobody(CLI, *args, home=self.home, timeout=180,
                         env={**self.env, **env})

    def redis_port(self) -> int:
        state = json.loads((self.home / "state" / "fleet" / "fleet.json").read_text())
        return int(str(state["redis_url"]).rsplit(":", 1)[1].split("/")[0])

    def probe(self, *targets: str, network: str | None = None) -> dict[str, str]:
        extra = ["--network", network] if network else []
        done = self("run", "--json", *extra, "set -- " + " ".join(targets) + "\n" + CONNECT)
        assert done.returncode == 0, done.stderr + done.stdout
        result = json.loads(done.stdout)
        return {line.split()[0]: line.split()[1] for line in result["stdout"].splitlines()}

    def end(self) -> None:
        self("down")
        with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
            state = json.loads((self.home / "state" / "fleet" / "fleet.json").read_text())
            for process in state["processes"]:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process["pid"], 9)


@pytest.fixture(name="user_fleet")
def _user_fleet_fixture(home: Path) -> Iterator[UserFleet]:
    fleet = UserFleet(home)
    try:
        yield fleet
    finally:
        fleet.end()


def test_a_local_fleet_started_by_a_user_keeps_its_redis_and_the_hosts_loopback_out(
        tun: None, net: NetNs, user_fleet: UserFleet, loopback: int) -> None:
    del tun
    up = user_fleet("up", "--hosts", "solo", "--no-flower", "--detach")
    assert up.returncode == 0, up.stderr + up.stdout
    redis, local = f"127.0.0.1:{user_fleet.redis_port()}", f"127.0.0.1:{loopback}"
    internet = f"{net.ns_ip}:80"
    assert reachable("127.0.0.1", user_fleet.redis_port()) and reachable("127.0.0.1", loopback)
    hosts = json.loads(user_fleet("hosts", "--json").stdout)
    sandboxes = [h.get("sandbox") or {} for h in hosts if h["host"] == "solo"]
    assert sandboxes and sandboxes[0].get("network") == "egress", hosts
    assert sandboxes[0].get("network_host") is False, hosts  # not turned on behind its back
    found = user_fleet.probe(redis, local, internet)
    assert found[internet] == "ok", found
    assert found[redis] in ("refused", "unreachable"), found
    assert found[local] in ("refused", "unreachable"), found
    asked = user_fleet("run", "--network", "host", "true")
    assert asked.returncode != 0 and "NETWORK_HOST_OK" in asked.stderr + asked.stdout, asked
    # The operator says so: `host` is given when asked for (the same probe reaches both,
    # so the refusals above are the policy's), and the default stays egress.
    assert user_fleet("down").returncode == 0
    up = user_fleet("up", "--hosts", "solo", "--no-flower", "--detach",
                    BASHFLEET_NETWORK_HOST_OK="1")
    assert up.returncode == 0, up.stderr + up.stdout
    redis = f"127.0.0.1:{user_fleet.redis_port()}"
    found = user_fleet.probe(redis, local, network="host")
    assert found[redis] == "ok" and found[local] == "ok", found
    found = user_fleet.probe(redis, local)
    assert found[redis] != "ok" and found[local] != "ok", found


def test_a_pasta_that_cannot_link_a_workspace_is_the_hosts_problem_for_a_while(
        tmp_path: Path) -> None:
    """A blank made ahead at the worker's start finds pasta failing (an AppArmor profile,
    a kernel without tun...): the worker says so and gives `none` by default meanwhile,
    rather than failing every tenant's first call."""
    from bashfleet.worker.engine.network import usernet  # noqa: PLC0415
    from bashfleet.worker.settings import Settings  # noqa: PLC0415

    settings = Settings(state_dir=tmp_path / "state", host="t", pasta="/bin/false")
    assert usernet.support(settings) is None  # installed, as far as can be seen
    with pytest.raises(usernet.UserNetError, match="did not link"):
        usernet.start(os.getpid(), "", settings)
    problem = usernet.support(settings)
    assert problem is not None and "could not link a workspace" in problem
