"""A workspace's network policy: what its calls may reach beyond its own loopback.

Every sandboxed workspace has a network namespace of its own (its loopback and abstract
unix sockets are its own); the policy says what leaves it:

- `none`: nothing (loopback only).
- `egress` (the default): the internet through the host; never the fleet's Redis, the
  host itself, loopback, link-local and cloud metadata addresses or private ranges
  (`DENIED`), unless the operator lists a range (`BASHFLEET_NETWORK_ALLOW_PRIVATE`).
- `allow`: only the listed domains (`example.com`, `*.example.com`) and CIDRs
  (`203.0.113.0/24`): HTTP and TLS by name (the Host header, the TLS SNI, an HTTP CONNECT),
  other TCP by address, DNS answered for listed names only; anything else is refused at
  once and recorded.
- `host`: the host's own namespace, only where the operator enables it
  (`BASHFLEET_NETWORK_HOST_OK=1`).

Pure: the model and its spellings (`egress`, `allow=pypi.org,*.pythonhosted.org`, a bool
of an older client). The worker's guard (`bashfleet.worker.engine.isolate.netguard`) applies it.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

NetworkMode = Literal["none", "egress", "allow", "host"]
MODES: tuple[NetworkMode, ...] = ("none", "egress", "allow", "host")
#: Most entries an `allow` list holds (each a domain or a CIDR).
MAX_ALLOW = 256

#: Never reachable under `egress` (and never by address under `allow`) unless the
#: operator lists a range: loopback, private, shared (CGNAT), link-local (cloud metadata
#: at 169.254.169.254 and fd00:ec2::254), multicast and reserved ranges.
DENIED: tuple[str, ...] = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4",
    "240.0.0.0/4", "::/128", "::1/128", "::ffff:0:0/96", "64:ff9b::/96", "100::/64",
    "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
)
#: AWS's IPv6 metadata address, fd00:ec2::254, is in fc00::/7.

_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_DOMAIN = re.compile(rf"^(\*\.)?{_LABEL}(\.{_LABEL})*\.?$")


class NetworkPolicy(BaseModel):
    """A workspace's network policy (`str()` spells it as the CLI takes it)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    mode: NetworkMode = "egress"
    """`none`, `egress`, `allow` or `host` (see the module)."""
    allow: tuple[str, ...] = ()
    """`allow`'s domains (`*.` wildcards) and CIDRs, normalized."""

    @model_validator(mode="after")
    def _check(self) -> NetworkPolicy:
        if self.allow and self.mode != "allow":
            raise ValueError(f"a list of allowed names is for mode `allow`, not {self.mode!r}")
        if len(self.allow) > MAX_ALLOW:
            raise ValueError(f"at most {MAX_ALLOW} allowed names and CIDRs")
        normal = tuple(dict.fromkeys(normalize_entry(entry) for entry in self.allow))
        if normal != self.allow:
            object.__setattr__(self, "allow", normal)
        return self

    def __str__(self) -> str:
        return f"allow={','.join(self.allow)}" if self.mode == "allow" else self.mode

    def domains(self) -> tuple[str, ...]:
        """The allowed names (`*.` wildcards kept)."""
        return tuple(entry for entry in self.allow if not _is_cidr(entry))

    def cidrs(self) -> tuple[str, ...]:
        """The allowed address ranges."""
        return tuple(entry for entry in self.allow if _is_cidr(entry))


def normalize_entry(entry: str) -> str:
    """A domain (lowercase, no final dot) or a CIDR (its network's spelling); ValueError
    for anything else."""
    text = entry.strip().lower()
    if _is_cidr(text):
        return str(ipaddress.ip_network(text, strict=False))
    if not _DOMAIN.match(text) or len(text) > 253:
        raise ValueError(f"not a domain (`*.example.com` allowed) or a CIDR: {entry!r}")
    return text.rstrip(".")


def _is_cidr(text: str) -> bool:
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return True


def parse(value: Any, *, legacy_true: NetworkMode = "egress") -> NetworkPolicy | None:
    """A policy from what callers send: a policy, its dict, its spelling (`none`,
    `egress`, `host`, `allow=a.com,10.1.0.0/16`), or a bool of an older caller (False:
    `none`, True: `legacy_true`). None stays None (the host's default)."""
    if value is None or isinstance(value, NetworkPolicy):
        return value
    if isinstance(value, bool):
        return NetworkPolicy(mode="none" if not value else legacy_true)
    if isinstance(value, dict):
        return NetworkPolicy.model_validate(value)
    if isinstance(value, str):
        return parse_text(value)
    raise ValueError(f"not a network policy: {value!r}")


def parse_text(text: str) -> NetworkPolicy:
    """`none`, `egress`, `host`, or `allow=NAME,CIDR,...` (also `allow:`)."""
    head, sep, rest = text.strip().partition("=")
    if not sep:
        head, sep, rest = text.strip().partition(":")
    mode = head.strip().lower()
    if mode == "allow":
        entries = tuple(e for e in re.split(r"[,\s]+", rest) if e)
        if not entries:
            raise ValueError("`allow=` lists at least one domain or CIDR")
        return NetworkPolicy(mode="allow", allow=entries)
    if sep or mode not in MODES:
        raise ValueError(f"unknown network policy {text!r}: use none, egress, host or "
                         "allow=DOMAIN,CIDR,...")
    return NetworkPolicy.model_validate({"mode": mode})
