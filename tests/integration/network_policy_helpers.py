"""What the network policy's tests share: the namespace that stands for the internet
(`net`), and this machine's own addresses."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from .netns_helpers import NetNs, make_netns

#: Every address of a test's own namespace.
ANY = "0.0.0.0"  # noqa: S104 - inside a namespace the test made


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


def _host_addresses() -> list[str]:
    """This machine's own IPv4 addresses beyond loopback (a server on 0.0.0.0 has them)."""
    done = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                          capture_output=True, text=True, check=True)
    return [line.split()[3].split("/")[0] for line in done.stdout.splitlines()
            if not line.split()[1].startswith(("bfw", "bft"))]
