"""What a Dockerfile's RUN steps run in: namespaces of their own, as a workspace's calls.

buildah's `chroot` isolation (the only one this host's builds use: no OCI runtime is
needed) runs RUN steps in buildah's own network and PID namespaces, and buildah 1.28
refuses `--network` other than `host` with it (`--pid private` is silently ignored).
So buildah itself is started in the namespaces the steps must have:

    worker ── nsenter --net=<the build's netns> ── unshare --pid --fork --mount-proc
                                                      └── buildah bud (pid 1's child)
                                                            └── RUN steps (chroot, userns)

- network: a namespace held by a small holder process while the build runs, under the
  build's policy, made by the same code as a workspace's (`network.apply`): `none` is
  its loopback alone; `egress` the link and the workspace rules (never the fleet's
  Redis, the host's loopback, metadata or private ranges); `host` the host's own
  namespace, only where the operator enables it for workspaces too.
- PID: a namespace of its own with its own /proc: a step sees buildah's processes and
  its own, never another tenant's command lines.
- ids: the steps' user namespace (`build_ids`), as before.

The base images (every `FROM` and `COPY --from` naming an image) are pulled before
the build by buildah in the worker's own namespace, with the host's credentials: a
registry the policy refuses (the fleet's own, on a private address or loopback) still
serves bases, while nothing a RUN step does reaches it.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

from bashfleet.worker.engine.images.image_meta import ImageError
from bashfleet.worker.engine.isolate.launcher import readable
from bashfleet.worker.engine.network import network
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.network import NetworkPolicy

#: A build's network when its request names none.
DEFAULT_POLICY = NetworkPolicy(mode="egress")
#: Seconds the holder of a build's network namespace gets to say it is there.
HOLDER_TIMEOUT_S = 20.0


# ------------------------------------------------------------------- the policy


def checked_policy(policy: NetworkPolicy | None, settings: Settings) -> NetworkPolicy:
    """The policy a build runs under (`egress` when none is asked); ImageError
    `invalid` for one builds do not take, `unavailable` for one this host cannot make."""
    chosen = policy or DEFAULT_POLICY
    if chosen.mode == "allow":
        raise ImageError("invalid", "a build's network is `none`, `egress` or `host` "
                         "(`allow=` lists are for workspaces)")
    if chosen.mode == "host" and not settings.network_host_ok:
        raise ImageError("invalid", "this host does not give builds its own network "
                         "(`host`): BASHFLEET_NETWORK_HOST_OK is off")
    if chosen.mode == "egress":
        problem = network.support(settings)
        if problem is not None:
            raise ImageError("unavailable", f"a build's network `egress` cannot be made "
                             f"on this host: {problem} (`none` can)")
    return chosen


# ------------------------------------------------------------ the base images

_ARG_REF = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?P<op>:[-+])?"
                      r"(?P<word>[^}]*)\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")
_DIRECTIVE = re.compile(r"^#\s*([a-zA-Z]+)\s*=\s*(\S+)\s*$")


def dockerfile_bases(text: str) -> list[str]:
    """The images a Dockerfile stands on, in order, once each: every `FROM` and
    `COPY --from`/`ADD --from` naming neither an earlier stage nor `scratch`, with the
    Dockerfile's global `ARG` defaults substituted. A reference still holding an unset
    variable is left out (buildah pulls it itself then, under the build's policy)."""
    args: dict[str, str] = {}
    stages: list[str] = []
    bases: list[str] = []

    def add(ref: str) -> None:
        if "$" in ref or not ref or ref.lower() == "scratch":
            return
        if ref.lower() in stages or ref.isdigit():
            return
        if ref not in bases:
            bases.append(ref)

    for keyword, rest in _instructions(text):
        words = rest.split()
        if keyword == "ARG" and not stages:
            for word in words:
                name, sep, value = word.partition("=")
                if sep:
                    args[name] = _substitute(_unquote(value), args)
                else:
                    args.setdefault(name, "")
        elif keyword == "FROM":
            plain = [word for word in words if not word.startswith("--")]
            if plain:
                add(_substitute(plain[0], args))
                stages.append(plain[2].lower() if len(plain) >= 3 and plain[1].lower() == "as"
                              else str(len(stages)))
        elif keyword in ("COPY", "ADD"):
            for word in words:
                if word.lower().startswith("--from="):
                    add(_substitute(word.partition("=")[2], args))
    return bases


def _instructions(text: str) -> Iterator[tuple[str, str]]:
    """A Dockerfile's instructions (keyword in capitals, the rest), continuation lines
    joined and comments dropped, under its `escape` directive."""
    escape = "\\"
    lines = text.splitlines()
    for line in lines:
        found = _DIRECTIVE.match(line.strip())
        if not found:
            break
        if found[1].lower() == "escape" and found[2] in ("\\", "`"):
            escape = found[2]
    current = ""
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            continue
        if stripped.endswith(escape):
            current += stripped[:-1] + " "
            continue
        current += stripped
        if current.strip():
            keyword, _, rest = current.strip().partition(" ")
            yield keyword.upper(), rest.strip()
        current = ""
    if current.strip():
        keyword, _, rest = current.strip().partition(" ")
        yield keyword.upper(), rest.strip()


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def _substitute(text: str, args: dict[str, str]) -> str:
    """`$NAME`, `${NAME}`, `${NAME:-word}`, `${NAME:+word}` from `args`; a name with
    no value stays as written (the caller leaves such a reference out)."""

    def one(match: re.Match[str]) -> str:
        name = match["braced"] or match["bare"]
        value = args.get(name)
        if match["op"] == ":-":
            return value if value else match["word"]
        if match["op"] == ":+":
            return match["word"] if value else ""
        return value if value else match[0]

    return _ARG_REF.sub(one, text)


# ----------------------------------------------------------- the namespaces


@dataclass(frozen=True)
class Namespaces:
    """How buildah is started for one build."""

    prefix: list[str]
    """The command line buildah's is appended to (nsenter, unshare)."""
    bud_flags: list[str]
    """More flags of `buildah bud`: the resolvers its steps' resolv.conf names."""


@contextlib.contextmanager
def namespaces(policy: NetworkPolicy, settings: Settings) -> Iterator[Namespaces]:
    """How to start buildah in the build's own network (under `policy`, made for the
    build and undone after it) and PID namespaces."""
    pid_ns = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "--"]
    if policy.mode == "host":
        yield Namespaces(pid_ns, [])
        return
    holder = _holder()
    state = network.State()
    try:
        if policy.mode == "none":
            _lo_up(holder.pid)
        else:
            try:
                state = network.apply(holder.pid, None, state, policy, settings)
            except OSError as exc:
                raise ImageError("unavailable", f"could not make the build's network: "
                                 f"{exc}") from None
        # The host's resolv.conf may name a stub on its loopback, which is the build's
        # own here: name the resolvers the workspaces' rules let through instead.
        dns = [flag for server in network.resolvers(settings) for flag in ("--dns", server)]
        yield Namespaces(["nsenter", f"--net=/proc/{holder.pid}/ns/net", "--", *pid_ns],
                         dns if policy.mode == "egress" else [])
    finally:
        if state.link is not None:
            network.detach(state.link)
        _end_holder(holder)


def _holder() -> subprocess.Popen[bytes]:
    """A process in a new network namespace, there until its stdin closes (the worker's
    end goes with the worker, so a holder never outlives it); ready when it says so."""
    proc = subprocess.Popen(
        ["unshare", "--net", "--", "sh", "-c", "echo ready; read -r _"], env=network.ENV,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        start_new_session=True)
    said = proc.stdout
    try:
        if said is None or not readable(said.fileno(), HOLDER_TIMEOUT_S) \
                or said.readline() != b"ready\n":
            raise ImageError("unavailable", "could not make the build's network namespace "
                             "(`unshare --net` did not start)")
    except BaseException:
        _end_holder(proc)
        raise
    return proc


def _lo_up(pid: int) -> None:
    """The namespace's loopback up (a build's own servers on 127.0.0.1 work)."""
    done = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "--", "ip", "link", "set",
                           "lo", "up"], env=network.ENV, capture_output=True, text=True,
                          timeout=network.TOOL_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise ImageError("unavailable", f"could not make the build's network: "
                         f"{done.stderr.strip()[:300]}")


def _end_holder(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    if proc.poll() is None:
        proc.kill()  # by its pid: it may be blocked before reading its stdin
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
