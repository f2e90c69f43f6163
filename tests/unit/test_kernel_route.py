"""bashfleet.worker.engine.isolate.kernel.default_route: the `struct rtentry` SIOCADDRT takes
for a workspace's default route, laid out as the kernel reads it (LP64)."""

from __future__ import annotations

import socket
import struct

import pytest

from bashfleet.worker.engine.isolate import kernel

#: Offsets of `struct rtentry` on LP64 (x86_64, aarch64): rt_dst, rt_gateway, rt_genmask,
#: rt_flags; its size.
DST, GATEWAY, GENMASK, FLAGS, SIZE = 8, 24, 40, 56, 120


@pytest.mark.parametrize("gateway", ["10.250.0.1", "10.250.198.209", "192.0.2.254"])
def test_the_default_route_names_its_gateway_and_any_destination(gateway: str) -> None:
    entry = kernel.default_route(gateway)
    assert len(entry) == SIZE
    # The whole sockaddr_in, NUL bytes and all (a family of 2, port 0, the address).
    assert entry[GATEWAY:GATEWAY + 8] == struct.pack("HH4s", socket.AF_INET, 0,
                                                     socket.inet_aton(gateway))
    for where in (DST, GENMASK):
        assert entry[where:where + 16] == struct.pack("HH4s8x", socket.AF_INET, 0, bytes(4))
    assert struct.unpack_from("H", entry, FLAGS)[0] == kernel.RTF_UP | kernel.RTF_GATEWAY
    assert entry[FLAGS + 2:] == bytes(SIZE - FLAGS - 2)  # no metric, device, mtu
