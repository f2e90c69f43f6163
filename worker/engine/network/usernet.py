"""A workspace's egress where the worker is not root: user-mode networking (pasta).

A worker that is not root cannot make veth links or touch the host's firewall. Rootless
podman's answer is user-mode networking, and so is this one: each workspace keeps its
network namespace of its own (made by the zygote inside the worker's user namespace,
bubblewrap's), and `egress` links it to the host through pasta (Debian's `passt`), which
carries what leaves the namespace's tap as the worker's user's own sockets:

    host (the worker's user)                 workspace netns (owned by the zygote's
                                               user namespace)
      tether ── fork, death signal ──► pasta ══ tap eth0 ══  lo, eth0 (the host's address,
      (`usernet_tether`: ends pasta               routes via the host's gateway)
       when the keeper ends)                   table inet bashfleet (`network.ruleset`)

pasta's options, and why:
- `--no-map-gw`: by default the gateway's address is mapped to the host's loopback, so a
  call would reach every service on the host's 127.0.0.1 (the fleet's Redis first);
- `-T none -U none`: by default pasta binds in the namespace every port the host listens
  on and forwards it to the host's loopback: the same hole;
- `-t none -u none`: nothing of the host enters the workspace;
- `--config-net`: the namespace gets the host's address and routes (as podman's does);
- `-f`, `-q`, `--no-netns-quit`, `-P` on the worker's pipe: the worker knows when the
  link is up (pasta writes its pid once it is).

The rules are those of a root worker's `egress` (`network.ruleset`): never the fleet's
addresses, the denied ranges (private, link-local, metadata) unless allowed, nor any
address of the host itself (pasta connects as a local process would: a service of the
host on 0.0.0.0 would be in reach), and at most `network_max_connections` at once. They
are loaded by the tether from a child that enters the workspace's user namespace (the
worker has every capability there, a call none): no call can change them.

`allow` is a root worker's only (its guard binds ports below 1024 as the host's root).
"""

from __future__ import annotations

import contextlib
import ctypes.util
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import IO

from bashfleet.worker.engine import isolate, procs
from bashfleet.worker.engine.isolate.launcher import readable
from bashfleet.worker.engine.memo import TimedMemo
from bashfleet.worker.settings import Settings

#: Seconds pasta and its rules may take to be ready (~60 ms idle).
START_TIMEOUT_S = 20.0
#: Seconds a tether takes to end pasta and itself when told.
STOP_TIMEOUT_S = 5.0
TUN = "/dev/net/tun"
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}


class UserNetError(OSError):
    """pasta or the rules could not be put in place."""


def pasta_argv(pasta: str, *, ready: int, netns: int, userns: int) -> list[str]:
    """pasta's command line for a workspace's namespaces (descriptors, as the tether
    inherits them) and the worker's ready pipe (see the module for the options)."""
    return [pasta, "--config-net", "--no-map-gw", "-t", "none", "-u", "none",
            "-T", "none", "-U", "none", "-f", "-q", "--no-netns-quit",
            "-P", f"/proc/self/fd/{ready}", "--netns", f"/proc/self/fd/{netns}",
            "--userns", f"/proc/self/fd/{userns}"]


# ------------------------------------------------------------------- what the host can


def support(settings: Settings) -> str | None:
    """None when this worker (not root) can give workspaces `egress` through pasta,
    else why not. Looked up once a minute (an operator who installs passt needs no
    restart). A pasta that could not link a workspace (a blank made ahead at the worker's
    start, say) makes it the host's problem for that minute: workspaces get `none`
    meanwhile and `hosts` says why, rather than every tenant's first call failing."""
    failed = _failures.get(settings.pasta)
    if failed is not None and time.monotonic() - failed[1] < FAILURE_HELD_S:
        return f"pasta could not link a workspace here: {failed[0]}"
    return _support.get(settings.pasta, lambda: _find_support(settings))


_support: TimedMemo[str, str | None] = TimedMemo(ttl_s=60.0)
#: pasta's last failure to link a workspace, per pasta setting: (what it said, when).
_failures: dict[str, tuple[str, float]] = {}
FAILURE_HELD_S = 60.0


def _find_support(settings: Settings) -> str | None:
    if pasta_path(settings) is None:
        return (f"pasta ({settings.pasta}) is not installed (Debian: apt-get install passt), "
                "which a worker that is not root links workspaces to the network with")
    if not os.access(TUN, os.R_OK | os.W_OK):
        return (f"pasta needs {TUN}, which this user cannot open (most systems make it "
                "mode 0666)")
    if ctypes.util.find_library("nftables") is None:
        return "libnftables is not installed (Debian: apt-get install nftables)"
    return None


def pasta_path(settings: Settings) -> str | None:
    search = os.pathsep.join([os.environ.get("PATH", ""), ENV["PATH"]])
    return shutil.which(settings.pasta, path=search)


def host_addresses() -> tuple[str, ...]:
    """The host's own addresses but loopback (looked up every minute): pasta reaches
    them as the host's own processes do, so the rules refuse them."""
    return _addresses.get("", _find_addresses)


_addresses: TimedMemo[str, tuple[str, ...]] = TimedMemo(ttl_s=60.0)


def _find_addresses() -> tuple[str, ...]:
    try:
        done = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True,
                              env=ENV, timeout=START_TIMEOUT_S, check=True)
        links = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return ()
    return addresses_of(links)


def addresses_of(links: list[dict[str, object]]) -> tuple[str, ...]:
    """The addresses in `ip -j addr`'s answer, loopback and link-local left out (the
    rules refuse those ranges whatever)."""
    found: list[str] = []
    for link in links:
        entries = link.get("addr_info")
        for entry in entries if isinstance(entries, list) else []:
            with contextlib.suppress(KeyError, TypeError, ValueError):
                address = ipaddress.ip_address(str(entry["local"]).split("%")[0])
                if not (address.is_loopback or address.is_link_local):
                    found.append(str(address))
    return tuple(dict.fromkeys(found))


# ---------------------------------------------------------------------- a workspace's


def _namespaces(keeper_pid: int) -> tuple[int, int]:
    """Descriptors of the keeper's user and network namespaces (its netns's owner is its
    user namespace: the zygote's)."""
    userns = os.open(f"/proc/{keeper_pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    try:
        netns = os.open(f"/proc/{keeper_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        os.close(userns)
        raise
    return userns, netns


def load_rules(keeper_pid: int, text: str) -> None:
    """Load an nftables ruleset in the keeper's network namespace (from a process of its
    own: entering a user namespace needs a single-threaded one)."""
    userns, netns = _namespaces(keeper_pid)
    try:
        done = subprocess.run(
            isolate.command("usernet_tether", "rules",
                            json.dumps({"userns": userns, "netns": netns})),
            input=text, capture_output=True, text=True, env=ENV, pass_fds=(userns, netns),
            timeout=START_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise UserNetError(f"the workspace's rules took over {START_TIMEOUT_S:.0f}s") from None
    finally:
        os.close(userns)
        os.close(netns)
    if done.returncode != 0:
        raise UserNetError(done.stderr.strip()[:500] or "the workspace's rules failed")


def start(keeper_pid: int, rules: str, settings: Settings) -> tuple[int, float | None]:
    """The workspace's rules loaded and pasta linking its namespace to the host, ended
    with the keeper; the tether's (pid, start time)."""
    pasta = pasta_path(settings)
    if pasta is None:
        raise UserNetError(support(settings) or "pasta is not installed")
    try:
        linked = _start(pasta, keeper_pid, rules)
    except UserNetError as exc:
        _failures[settings.pasta] = (exc.strerror or str(exc), time.monotonic())
        raise
    _failures.pop(settings.pasta, None)
    return linked


def _start(pasta: str, keeper_pid: int, rules: str) -> tuple[int, float | None]:
    keeper = os.pidfd_open(keeper_pid)
    fds = [keeper]
    try:
        fds += _namespaces(keeper_pid)
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        fds.append(ready_w)
        errors = tempfile.TemporaryFile()  # noqa: SIM115 - pasta keeps it as its stderr
        try:
            proc = _spawn_tether(pasta, keeper, fds[1], fds[2], ready_w, rules, errors)
            os.close(ready_w)
            fds.remove(ready_w)
            return _await_ready(proc, ready_r, errors)
        finally:
            errors.close()
            os.close(ready_r)
    finally:
        for fd in fds:
            os.close(fd)


def _spawn_tether(pasta: str, keeper: int, userns: int, netns: int,  # noqa: PLR0917
                  ready: int, rules: str, errors: IO[bytes]) -> subprocess.Popen[bytes]:
    config = {"keeper": keeper, "userns": userns, "netns": netns, "ready": ready,
              "argv": pasta_argv(pasta, ready=ready, netns=netns, userns=userns)}
    # A session of its own: a signal to the worker's group (^C) leaves it, as the
    # workspace outlives the worker.
    proc = subprocess.Popen(
        isolate.command("usernet_tether", "tether", json.dumps(config)),
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors, env=ENV,
        pass_fds=(keeper, userns, netns, ready), start_new_session=True)
    if proc.stdin is not None:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(rules.encode())
            proc.stdin.close()
    return proc


def _await_ready(proc: subprocess.Popen[bytes], ready: int,
                 errors: IO[bytes]) -> tuple[int, float | None]:
    """pasta's pid on the ready pipe: the link is up. Else the tether's error."""
    answer = os.read(ready, 64) if readable(ready, START_TIMEOUT_S) else b""
    if not answer.strip().isdigit():
        proc.kill()
        proc.wait(STOP_TIMEOUT_S)
        errors.seek(0)
        said = errors.read(2000).decode(errors="replace").strip()
        raise UserNetError(f"pasta did not link the workspace's network: "
                           f"{said or 'no answer within the time allowed'}")
    threading.Thread(target=proc.wait, daemon=True, name="bashfleet-tether-reaper").start()
    return proc.pid, procs.start_time(proc.pid)


def stop(tether: tuple[int, float | None]) -> None:
    """End a workspace's pasta (its tether ends it and itself); gone already is fine."""
    pid, start = tether
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if start is not None and not procs.is_same_process(pid, start):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not readable(pidfd, STOP_TIMEOUT_S):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # pasta follows it (its death signal)
    finally:
        os.close(pidfd)


def alive(tether: tuple[int, float | None] | None) -> bool:
    """Whether a workspace's tether (so its pasta) still runs."""
    if tether is None:
        return False
    pid, start = tether
    return start is not None and procs.is_same_process(pid, start)


__all__: Sequence[str] = ["UserNetError", "alive", "host_addresses", "load_rules",
                          "pasta_argv", "start", "stop", "support"]
