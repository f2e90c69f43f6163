"""bashfleet.worker.engine.hostname: a workspace's /etc/hosts names its hostname."""

from __future__ import annotations

import pytest

from bashfleet.worker.engine.hostname import names_in, with_hostname

IMAGE = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"


@pytest.mark.parametrize(
    ("text", "hostname", "expected"),
    [
        # An image's file: the name is added.
        (IMAGE, "build-7", IMAGE + "127.0.1.1\tbuild-7\n"),
        # A host's that names it already (Debian's installer's line, or any other):
        # left as it is, whatever the case.
        ("127.0.0.1 localhost\n127.0.1.1 vm.corp vm\n", "vm", None),
        ("127.0.0.1 localhost\n10.0.0.5\tBuild-7 # the LAN\n", "build-7", None),
        # Named only in a comment: not named.
        ("127.0.0.1 localhost # build-7\n", "build-7", "127.0.0.1 localhost # build-7\n"
         "127.0.1.1\tbuild-7\n"),
        # No newline at its end; an empty file.
        ("127.0.0.1 localhost", "h", "127.0.0.1 localhost\n127.0.1.1\th\n"),
        ("", "h", "127.0.1.1\th\n"),
        # Nothing usable to add.
        (IMAGE, "", None),
        (IMAGE, "two words", None),
        (IMAGE, "a#b", None),
    ],
)
def test_with_hostname(text: str, hostname: str, expected: str | None) -> None:
    assert with_hostname(text, hostname) == expected
    if expected is not None:
        assert hostname.lower() in names_in(expected)
