"""A workspace's network: its own namespace, the link to the host, the rules in force.

Every sandboxed workspace's keeper is made in a network namespace of its own (its
loopback and abstract unix sockets are the workspace's alone). What leaves it is its
policy (`bashfleet.worker.wire.network`), built here by a root worker with the kernel's own parts:

    workspace netns (owned by the host's       host netns
    user namespace: a call's root, in the       table inet bashfleet: input drops all
    workspace's, has no CAP_NET_ADMIN there)    from bfw*, forward drops bfw*->bfw* and
      lo                                        anything new into bfw*, postrouting
      eth0 10.250.x.2/30 ── veth ──  bfwN 10.250.x.1/30 ── masquerade ──► the internet
      table inet bashfleet (this module's rules, per policy)
      netguard (`allow` only: DNS and HTTP/TLS by name, refusals recorded)

- `none`: no link at all (loopback only).
- `egress`: the link, and the workspace's rules refuse (TCP reset, ICMP admin-prohibited:
  at once, never a timeout) the fleet's addresses, `DENIED` ranges (private, loopback,
  link-local, metadata) unless allowed (`network_allow_private`), and new connections
  past `network_max_connections`; DNS goes to the host's resolvers (whichever server a
  call asks); refusals logged (NFLOG, rate-limited) to the worker (`netlog`), recorded.
- `allow`: the link; DNS and TCP 80/443 go to the workspace's guard (`netguard`, its
  own process in the namespace, outside its PID namespace, root of the host's user
  namespace), which answers and connects listed names only; listed CIDRs directly;
  anything else refused at once and logged (NFLOG) to the guard, which records it.

Why veth and nftables rather than user-mode networking (pasta, slirp4netns): measured
here, a 100 MB download through pasta took 2.2x (slirp4netns 2.6x) the host's time, the
kernel's forwarding ~1x; Debian 12's pasta, started as root, drops to `nobody` before it
opens the target namespace and cannot join one the host's root owns. The rules live in
the workspace's namespace, written before its first call by the worker (root of the
host's user namespace, which owns that namespace): nothing a call does can change them.

The interface name is the lock on a link's index: `ip link add bfwN` fails when N is
taken, and the pair goes with the workspace's namespace (its keeper's end), so nothing
is left to clean up whatever way a workspace ends.

A worker that is not root makes no link: `egress` is user-mode networking instead, the
same rules over pasta (`bashfleet.worker.engine.network.usernet`), as rootless podman does;
`allow` needs a root worker.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bashfleet.worker.engine import isolate, procs
from bashfleet.worker.engine.isolate import kernel, nft_helper
from bashfleet.worker.engine.isolate.launcher import readable
from bashfleet.worker.engine.memo import TimedMemo
from bashfleet.worker.engine.network import usernet
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.network import DENIED, NetworkPolicy

log = logging.getLogger("bashfleet.network")

#: Host-side interfaces of workspaces' links: `bfw<index>`.
IFACE_PREFIX = "bfw"
#: Packet mark of the guard's own sockets (its upstream DNS queries and connections):
#: only a process with CAP_NET_ADMIN in the namespace (root of the host) can set it.
GUARD_MARK = 0x62660001
#: The guard's proxy and DNS ports on the workspace's address, where the rules send TCP
#: 80/443 and DNS. Unprivileged, so the guard needs no CAP_NET_BIND_SERVICE (a worker in
#: a container is often without it), and below the kernel's ephemeral range (32768-60999),
#: so no connection's local port holds them. A call that binds one first (it is the
#: workspace's own namespace) only breaks its own workspace's guard, which then says so:
#: its connections still leave through the workspace's rules, never around them.
GUARD_PORT = 1999
GUARD_DNS_PORT = 1053
#: The NFLOG group the workspace's refusals are logged to (the guard reads it).
LOG_GROUP = 7
#: The group of an `egress` workspace's refusals (`netlog` reads it in the worker; apart
#: from the guard's, so a policy changed either way never finds the group taken), and
#: the most packets a second its rules log (a flood costs the worker nothing more).
EGRESS_LOG_GROUP = 8
EGRESS_LOG_RATE = 50
#: Seconds a tool (ip, nft, nsenter) may take.
TOOL_TIMEOUT_S = 20.0
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}


class NetworkError(OSError):
    """A workspace's network could not be set up as asked."""


@dataclass(frozen=True)
class Link:
    """A workspace's link to the host: a /30 of the pool."""

    index: int
    host_ip: str
    ws_ip: str

    @property
    def iface(self) -> str:
        return f"{IFACE_PREFIX}{self.index}"


def link_of(pool: str, index: int) -> Link:
    """The `index`th /30 of `pool` (ValueError past its end)."""
    network = ipaddress.ip_network(pool, strict=False)
    if not isinstance(network, ipaddress.IPv4Network):
        raise ValueError(f"the network pool is an IPv4 range: {pool!r}")
    if index < 0 or index >= capacity(pool):
        raise ValueError(f"no link {index} in {pool}")
    base = int(network.network_address) + 4 * index
    return Link(index, str(ipaddress.IPv4Address(base + 1)), str(ipaddress.IPv4Address(base + 2)))


def capacity(pool: str) -> int:
    """Links the pool holds (a /30 each)."""
    return int(ipaddress.ip_network(pool, strict=False).num_addresses // 4)


@dataclass
class State:
    """What a workspace's network holds now (kept in `<id>.net` in the state directory)."""

    link: int | None = None
    """Its link's index (None: no link, `none` or `host`)."""
    guard: tuple[int, float | None] | None = None
    """Its guard's (pid, start time), under `allow`."""
    pasta: tuple[int, float | None] | None = None
    """Its pasta's tether's (pid, start time): `egress` where the worker is not root."""

    def dumps(self) -> str:
        return json.dumps({"link": self.link, "guard": list(self.guard) if self.guard else None,
                           "pasta": list(self.pasta) if self.pasta else None})

    @classmethod
    def loads(cls, text: str) -> State:
        data = json.loads(text)
        guard, pasta = data.get("guard"), data.get("pasta")
        return cls(link=data.get("link"), guard=(int(guard[0]), guard[1]) if guard else None,
                   pasta=(int(pasta[0]), pasta[1]) if pasta else None)


def state_path(settings: Settings, ws_id: str) -> Path:
    return settings.workspaces_dir / f"{ws_id}.net"


def denied_path(settings: Settings, ws_id: str) -> Path:
    """Where a workspace's guard records what it refused (JSON lines)."""
    return settings.workspaces_dir / f"{ws_id}.denied"


#: Refusals a call's result names at most (the rest counted).
DENIED_SHOWN = 10


def take_denied(settings: Settings, ws_id: str) -> tuple[str, ...]:
    """What the workspace's guard refused since the last result that said so (its
    `.denied` file past the offset kept beside it), distinct, at most DENIED_SHOWN."""
    path = denied_path(settings, ws_id)
    seen = path.with_name(f"{path.name}.seen")
    try:
        size = path.stat().st_size
        if size == 0:  # nothing refused yet (most workspaces): no offset to read
            return ()
        offset = int(seen.read_text("ascii") or 0) if seen.exists() else 0
    except (OSError, ValueError):
        return ()
    if size <= offset:
        return ()
    with path.open("rb") as handle:
        handle.seek(offset)
        data = handle.read(min(size - offset, 1 << 20))
    data = data[:data.rfind(b"\n") + 1]
    seen.write_text(str(offset + len(data)), encoding="ascii")
    found: dict[str, None] = {}
    for line in data.splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            entry = json.loads(line)
            found[f"{entry['target']} ({entry['kind']})"] = None
    shown = list(found)[:DENIED_SHOWN]
    if len(found) > DENIED_SHOWN:
        shown.append(f"+{len(found) - DENIED_SHOWN} more")
    return tuple(shown)


def load_state(settings: Settings, ws_id: str) -> State:
    try:
        return State.loads(state_path(settings, ws_id).read_text("utf-8"))
    except (OSError, ValueError):
        return State()


def save_state(settings: Settings, ws_id: str, state: State) -> None:
    path = state_path(settings, ws_id)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(state.dumps(), encoding="utf-8")
    os.replace(tmp, path)


# ------------------------------------------------------------------- what the host can


def support(settings: Settings) -> str | None:
    """None when this worker can give workspaces `egress` (root, with ip, nft and
    nsenter; not root, with pasta: `usernet`), else why not (then `egress` and `allow`
    are unavailable here)."""
    if os.geteuid() != 0:
        return usernet.support(settings)
    return _support.get("", _find_support)


def allow_support(settings: Settings) -> str | None:
    """None when this worker can also give `allow` (its guard), else why not."""
    if os.geteuid() != 0:
        return ("`allow` needs a root worker (its guard listens below port 1024 as the "
                "host's root); this one gives `egress` and `none`")
    return support(settings)


_support: TimedMemo[str, str | None] = TimedMemo(ttl_s=60.0)


def _find_support() -> str | None:
    missing = [tool for tool in ("ip", "nft", "nsenter") if shutil.which(tool, path=ENV["PATH"])
               is None]
    if missing:
        return (f"{', '.join(missing)} not installed (Debian: apt-get install iproute2 "
                "nftables util-linux)")
    return None


def _run(argv: Sequence[str], stdin: str = "", *,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                              env=ENV, timeout=TOOL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise NetworkError(f"{argv[0]} did not finish within {TOOL_TIMEOUT_S:.0f}s") from None
    if check and done.returncode != 0:
        raise NetworkError(f"{argv[0]} {' '.join(argv[1:3])}: "
                           f"{(done.stderr or done.stdout).strip()[:500]}")
    return done


def _in_netns(pid: int, argv: Sequence[str], stdin: str = "") -> None:
    _run(["nsenter", f"--net=/proc/{pid}/ns/net", "--", *argv], stdin)


def load_rules(pid: int, text: str) -> None:
    """Load an nftables ruleset in the namespace of `pid`: through libnftables (what
    `nft` itself calls) in the worker's nftables helper (`nft_helper`: never in this
    process, whose descriptors outnumber what the library's select(2) survives);
    `nft -f` through nsenter where the library is missing. Through the helper a ruleset
    in a fresh namespace takes ~1.3 ms p50 (~1.0 ms in-process), the tool ~5 ms (a blank
    keeper's link and rules are made ahead, but a burst of workspaces outruns a slow
    refill)."""
    if kernel.nftables_installed():
        try:
            problem = _helper.load(f"/proc/{pid}/ns/net", text)
        except OSError as exc:
            raise NetworkError(f"nft: {exc}") from None
        if problem is not None:
            raise NetworkError(f"nft: {problem[:500]}")
        return
    _in_netns(pid, ["nft", "-f", "-"], text)


#: This process's nftables helper, started at its first ruleset.
_helper = nft_helper.Helper()


def end_helper() -> None:
    """End this process's nftables helper (a later ruleset starts another)."""
    _helper.close()


# ------------------------------------------------------------------------ the host side


_host_lock = threading.Lock()
_host_ready: set[bool] = set()
#: Left by older workers, which then dropped every forwarded packet that was not a
#: workspace's (other containers' bridges too): removed at start, never written.
OLD_FORWARDING_MARK = Path("/run/bashfleet/net/forwarding-was-off")


def ensure_host(settings: Settings) -> None:
    """The host's part, once per process: forwarding on, and the host's `bashfleet`
    table (nothing of the host reachable from a workspace's link; no workspace reaches
    another; nothing new enters one; what leaves is masqueraded). As podman's netavark
    and Docker do, forwarding is turned on and the table's rules match workspaces'
    links only: whatever else the host forwards (a container bridge, a VPN) is left to
    the host's own firewall, whether or not forwarding was on before."""
    del settings
    with _host_lock:
        if _host_ready:
            return
        forwarding = Path("/proc/sys/net/ipv4/ip_forward")
        if forwarding.read_text("ascii").strip() != "1":
            log.info("IPv4 forwarding was off: turned on for workspaces' links (the "
                     "host's firewall decides what else it forwards)")
            forwarding.write_text("1\n", encoding="ascii")
        _run(["nft", "-f", "-"], host_ruleset())
        OLD_FORWARDING_MARK.unlink(missing_ok=True)
        _host_ready.add(True)


def host_ruleset() -> str:
    """The host's table (replaced whole, atomically: an older worker's rules go with
    it), the same for every worker of the machine whatever its pool: links are told by
    their interfaces' names, and every rule names one (`iifname` or `oifname` a link's),
    so no packet of anything else's is touched."""
    wild = f'"{IFACE_PREFIX}*"'
    return (
        "table inet bashfleet\ndelete table inet bashfleet\n"
        "table inet bashfleet {\n"
        "    chain input {\n"
        "        type filter hook input priority filter - 10; policy accept;\n"
        f"        iifname {wild} meta l4proto tcp reject with tcp reset\n"
        f"        iifname {wild} reject with icmpx type admin-prohibited\n"
        "    }\n"
        "    chain forward {\n"
        "        type filter hook forward priority filter - 10; policy accept;\n"
        f"        iifname {wild} oifname {wild} drop\n"
        f"        iifname {wild} accept\n"
        f"        oifname {wild} ct state established,related accept\n"
        f"        oifname {wild} drop\n"
        "    }\n"
        "    chain postrouting {\n"
        "        type nat hook postrouting priority srcnat + 10; policy accept;\n"
        f"        iifname {wild} oifname != {wild} masquerade\n"
        "    }\n"
        "}\n"
    )


def attach(keeper_pid: int, settings: Settings) -> Link:
    """A link between the host and the keeper's namespace, at the first free index from
    a random one; its workspace end configured."""
    ensure_host(settings)
    total = capacity(settings.network_pool)
    first = int.from_bytes(os.urandom(4), "big") % total
    for step in range(total):
        link = link_of(settings.network_pool, (first + step) % total)
        made = _run(["ip", "-batch", "-"], (
            f"link add {link.iface} type veth peer name eth0 netns {keeper_pid}\n"
            f"addr add {link.host_ip}/30 dev {link.iface}\n"
            f"link set {link.iface} up\n"), check=False)
        if made.returncode == 0:
            break
        if "File exists" not in made.stderr or not os.path.exists(f"/sys/class/net/{link.iface}"):
            # Not the index taken (the workspace's end exists already, or another error).
            raise NetworkError(f"could not make the workspace's link: {made.stderr.strip()}")
    else:
        raise NetworkError(f"every link of {settings.network_pool} is in use")
    try:
        _configure_inside(keeper_pid, link)
    except BaseException:
        detach(link.index)
        raise
    return link


def _configure_inside(keeper_pid: int, link: Link) -> None:
    """The workspace's end of its link: its address, up, its loopback up, its default
    route through the host's end. Done by a thread of this process that enters the
    keeper's network namespace and ends there (never reused: a namespace is a thread's
    own, the process's other threads stay in the host's): ioctls, where `nsenter ip` cost
    two processes (~5 ms a blank alone, ~11 ms each of sixteen made at once)."""
    try:
        kernel.in_network_namespace(keeper_pid, functools.partial(
            kernel.configure_link, "eth0", link.ws_ip, "255.255.255.252", link.host_ip),
            "bashfleet-link")
    except Exception as exc:
        raise NetworkError(f"could not set up the workspace's end of its link: {exc}") from exc


def detach(index: int) -> None:
    """Remove a link (both ends); gone already is fine."""
    _run(["ip", "link", "del", f"{IFACE_PREFIX}{index}"], check=False)


# ---------------------------------------------------------------- the workspace's rules


def fleet_addresses(settings: Settings) -> tuple[str, ...]:
    """The fleet's own addresses no workspace may reach whatever its policy: its Redis
    (each host of its URL, resolved) and `network_deny`."""
    return _fleet.get(settings.redis_url_value() or "", lambda: _find_fleet(settings))


_fleet: TimedMemo[str, tuple[str, ...]] = TimedMemo(ttl_s=60.0)


def _find_fleet(settings: Settings) -> tuple[str, ...]:
    found: list[str] = []
    for entry in settings.network_deny:
        found += _resolve_entry(entry)
    url = settings.redis_url_value()
    if url:
        netloc = urlsplit(url).netloc.rpartition("@")[2]
        for hostport in netloc.split(","):
            host = urlsplit(f"//{hostport}").hostname
            if host:
                found += _resolve_entry(host)
    return tuple(dict.fromkeys(found))


def _resolve_entry(entry: str) -> list[str]:
    try:
        return [str(ipaddress.ip_network(entry, strict=False))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(entry, None)
    except OSError:
        return []
    return [str(info[4][0]) for info in infos]


def resolvers(settings: Settings) -> tuple[str, ...]:
    """The DNS servers workspaces reach (through the host): `network_resolvers`, else
    the host's resolv.conf's, else systemd-resolved's upstream ones when the host's is
    its loopback stub (no workspace reaches the host's loopback)."""
    if settings.network_resolvers:
        return tuple(settings.network_resolvers)
    for path in ("/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"):
        found = [ip for ip in _nameservers(path) if not ipaddress.ip_address(ip).is_loopback]
        if found:
            return tuple(found)
    return ()


def _nameservers(path: str) -> list[str]:
    found = []
    with contextlib.suppress(OSError):
        for line in Path(path).read_text("utf-8").splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[0] == "nameserver":
                with contextlib.suppress(ValueError):
                    found.append(str(ipaddress.ip_address(fields[1].split("%")[0])))
    return found


def _split(nets: Iterable[str]) -> tuple[list[str], list[str]]:
    v4: list[str] = []
    v6: list[str] = []
    for net in nets:
        parsed = ipaddress.ip_network(net, strict=False)
        (v4 if parsed.version == 4 else v6).append(str(parsed))
    return v4, v6


def _set(name: str, kind: str, elements: Sequence[str]) -> str:
    body = f"        type {kind}; flags interval; auto-merge;\n"
    if elements:
        body += f"        elements = {{ {', '.join(elements)} }}\n"
    return f"    set {name} {{\n{body}    }}\n"


@dataclass(frozen=True)
class Rules:
    """What a workspace's ruleset is made of (`ruleset`)."""

    policy: NetworkPolicy
    link: Link | None
    """The workspace's link (`allow` needs its address); None: pasta's."""
    fleet: tuple[str, ...] = ()
    resolvers: tuple[str, ...] = ()
    allowed_private: tuple[str, ...] = ()
    max_connections: int = 512


def ruleset(rules: Rules, *, replace: bool = True) -> str:
    """The workspace's table for `egress` or `allow` (`replace`: the one there replaced
    whole, atomically; else made in a namespace that has none, which is faster: a table's
    deletion waits out an RCU grace period, ~10 ms)."""
    allow = rules.policy.mode == "allow"
    fleet4, fleet6 = _split(rules.fleet)
    open4, open6 = _split(rules.policy.cidrs() if allow else rules.allowed_private)
    denied4, denied6 = _split(DENIED)
    dns4, _ = _split(rules.resolvers)
    sets = (_set("fleet4", "ipv4_addr", fleet4) + _set("fleet6", "ipv6_addr", fleet6)
            + _set("open4", "ipv4_addr", open4) + _set("open6", "ipv6_addr", open6)
            + _set("denied4", "ipv4_addr", denied4) + _set("denied6", "ipv6_addr", denied6)
            + _set("dns4", "ipv4_addr", dns4))
    output = [
        # Its own addresses (the guard's, after the steer chain's DNAT: the output hook
        # still names the link as the packet's interface).
        'oifname "lo" accept', "fib daddr type local accept",
        # The link's own chatter (neighbour discovery, multicast listener reports).
        "ip6 daddr ff02::/16 accept",
        "icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit } accept",
        f"meta mark {GUARD_MARK:#x} accept" if allow else "",
        "ip daddr @fleet4 goto refuse", "ip6 daddr @fleet6 goto refuse",
        "" if allow else "ip daddr @dns4 meta l4proto { tcp, udp } th dport 53 goto out",
        "ip daddr @open4 goto out", "ip6 daddr @open6 goto out",
        "goto refuse" if allow else "ip daddr @denied4 goto refuse",
        "" if allow else "ip6 daddr @denied6 goto refuse",
        "" if allow else "goto out",
    ]
    refuse = [f"log group {LOG_GROUP}" if allow else
              f"limit rate {EGRESS_LOG_RATE}/second burst {EGRESS_LOG_RATE} packets "
              f"log group {EGRESS_LOG_GROUP}",
              "meta l4proto tcp reject with tcp reset", "reject with icmpx type admin-prohibited"]
    text = ("table inet bashfleet\ndelete table inet bashfleet\n" if replace else "")
    text += "table inet bashfleet {\n" + sets
    text += _chain("output", "type filter hook output priority filter; policy accept;", output)
    text += _chain("out", "", [
        f"ct state new ct count over {rules.max_connections} goto capped", "accept"])
    text += _chain("capped", "", ["meta l4proto tcp reject with tcp reset",
                                  "reject with icmpx type admin-prohibited"])
    text += _chain("refuse", "", refuse)
    if not allow and dns4:
        # Every query to the host's resolvers (a resolv.conf naming another, a private
        # one, still resolves), whatever server the call asked.
        text += _chain("steer", "type nat hook output priority -100; policy accept;", [
            'oifname "lo" return',
            f"meta l4proto {{ tcp, udp }} th dport 53 dnat ip to {dns4[0].split('/')[0]}:53"])
    if allow:
        if rules.link is None:
            raise ValueError("`allow` needs a link of the workspace's own")
        ws = rules.link.ws_ip
        text += _chain("steer", "type nat hook output priority -100; policy accept;", [
            'oifname "lo" return', f"meta mark {GUARD_MARK:#x} return",
            f"meta l4proto {{ tcp, udp }} th dport 53 dnat ip to {ws}:{GUARD_DNS_PORT}",
            "ip daddr @open4 return", "ip daddr @fleet4 return",
            f"tcp dport {{ 80, 443 }} dnat ip to {ws}:{GUARD_PORT}",
        ])
    return text + "}\n"


def _chain(name: str, head: str, lines: Sequence[str]) -> str:
    body = "".join(f"        {line}\n" for line in ([head] if head else []) + list(lines) if line)
    return f"    chain {name} {{\n{body}    }}\n"


def _rules(policy: NetworkPolicy, link: Link | None, settings: Settings) -> Rules:
    # Over pasta, the host's own addresses are reached as its own processes reach them
    # (a root worker's host table refuses everything a link sends the host).
    fleet = fleet_addresses(settings) + (usernet.host_addresses() if link is None else ())
    return Rules(policy=policy, link=link, fleet=tuple(dict.fromkeys(fleet)),
                 resolvers=resolvers(settings),
                 allowed_private=tuple(settings.network_allow_private),
                 max_connections=settings.network_max_connections)


# ---------------------------------------------------------------------------- policies


def apply(keeper_pid: int, ws_id: str | None, state: State, policy: NetworkPolicy,
          settings: Settings) -> State:
    """Put `policy` in force in the keeper's namespace (made with `state`); the new state.
    `ws_id` None: a blank keeper (no guard yet: `allow` is applied at its claim)."""
    if os.geteuid() != 0:
        return _apply_user_mode(keeper_pid, state, policy, settings)
    if policy.mode in ("none", "host"):
        _stop_guard(state)
        if state.link is not None:
            detach(state.link)
            # A table is there only with a link: gone with it, a later link's is made anew.
            load_rules(keeper_pid, "delete table inet bashfleet\n")
        return State()
    fresh = state.link is None
    link = (attach(keeper_pid, settings) if state.link is None
            else link_of(settings.network_pool, state.link))
    try:
        load_rules(keeper_pid, ruleset(_rules(policy, link, settings), replace=not fresh))
        _stop_guard(state)
        guard = None
        if policy.mode == "allow" and ws_id is not None:
            guard = start_guard(keeper_pid, ws_id, link, policy, settings)
    except BaseException:
        if fresh:
            detach(link.index)
        raise
    return State(link=link.index, guard=guard)


def _apply_user_mode(keeper_pid: int, state: State, policy: NetworkPolicy,
                     settings: Settings) -> State:
    """`apply` for a worker that is not root: `egress` is pasta and the rules; `none`
    and `host` end them (`usernet`)."""
    if policy.mode == "allow":
        raise NetworkError(allow_support(settings) or "`allow` needs a root worker")
    if policy.mode in ("none", "host"):
        if state.pasta is not None:
            usernet.stop(state.pasta)
            usernet.load_rules(keeper_pid, "table inet bashfleet\ndelete table inet bashfleet\n")
        return State()
    text = ruleset(_rules(policy, None, settings), replace=state.pasta is not None)
    if usernet.alive(state.pasta):
        usernet.load_rules(keeper_pid, text)
        return state
    return State(pasta=usernet.start(keeper_pid, text, settings))


def start_guard(keeper_pid: int, ws_id: str, link: Link, policy: NetworkPolicy,
                settings: Settings) -> tuple[int, float | None]:
    """The workspace's guard (`bashfleet.worker.engine.isolate.netguard`), in its namespace,
    ready."""
    config = {
        "keeper": keeper_pid, "address": link.ws_ip, "port": GUARD_PORT,
        "dns_port": GUARD_DNS_PORT, "mark": GUARD_MARK,
        "group": LOG_GROUP, "domains": list(policy.domains()), "cidrs": list(policy.cidrs()),
        "resolvers": list(resolvers(settings)), "fleet": list(fleet_addresses(settings)),
        "allowed_private": list(settings.network_allow_private),
        "max_connections": settings.network_max_connections,
    }
    denied = os.open(denied_path(settings, ws_id), os.O_WRONLY | os.O_APPEND | os.O_CREAT
                     | os.O_CLOEXEC, 0o600)
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    # Its stderr is ours (the worker's log) once it runs; until then a pipe this reads
    # when it fails (nsenter's or Python's own complaint, before the guard can answer).
    try:
        log_fd = os.dup(2)
    except OSError:  # a worker started with no stderr
        log_fd = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        proc = subprocess.Popen(
            ["nsenter", f"--net=/proc/{keeper_pid}/ns/net", "--",
             *isolate.command("netguard", json.dumps(config), str(denied), str(ready_w),
                              str(log_fd))],
            env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, pass_fds=(denied, ready_w, log_fd), start_new_session=True)
        os.close(ready_w)
        ready_w = -1
        answer = _guard_answer(ready_r)
        if answer != "ok":
            proc.kill()
            _, errors = proc.communicate(timeout=TOOL_TIMEOUT_S)
            why = guard_failure(answer, errors.decode("utf-8", "replace"))
            log.error("workspace %s: its network guard did not start: %s", ws_id, why)
            raise NetworkError(f"the workspace's network guard did not start: {why}")
    finally:
        for fd in (denied, ready_r, ready_w, log_fd):
            if fd >= 0:
                os.close(fd)
    if proc.stderr is not None:
        proc.stderr.close()  # the guard writes to the worker's log from now on
    threading.Thread(target=proc.wait, daemon=True, name="bashfleet-guard-reaper").start()
    return proc.pid, procs.start_time(proc.pid)


def _guard_answer(ready_r: int) -> str:
    """What the guard said on its ready pipe: `ok`, `error: why`, or "" (nothing within
    TOOL_TIMEOUT_S, or it ended without a word)."""
    if not readable(ready_r, TOOL_TIMEOUT_S):
        return ""
    return os.read(ready_r, 4096).decode("utf-8", "replace").strip()


def guard_failure(answer: str, stderr: str) -> str:
    """Why a guard did not start, for the operator: its own word (`error: ...`), else the
    last lines its process wrote (nsenter's, Python's), else that it said nothing."""
    if answer.startswith("error:"):
        return answer[len("error:"):].strip()
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if lines:
        return " / ".join(lines[-3:])[:500]
    return f"no answer within {TOOL_TIMEOUT_S:.0f}s" if not answer else f"it said {answer!r}"


def _stop_guard(state: State) -> None:
    if state.guard is None:
        return
    pid, start = state.guard
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if start is None or procs.is_same_process(pid, start):
            os.kill(pid, signal.SIGKILL)
