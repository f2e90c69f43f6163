"""The line of a workspace's /etc/hosts that names its hostname.

A workspace shares its host's UTS namespace, so its calls' hostname is the host's; a
program that resolves it (`socket.gethostbyname(socket.gethostname())`: Python's, Java's
and MPI's start-up, `sudo`) looks in /etc/hosts first. An image's /etc/hosts is the
workspace's own (written when it is made) and a host's may lack the name: the line
`127.0.1.1 NAME`, as Debian's installer writes it, makes it resolve to the workspace's
own loopback.
"""

from __future__ import annotations

#: Where the hostname resolves to: a loopback address of the workspace's own namespace.
HOSTNAME_ADDRESS = "127.0.1.1"


def names_in(text: str) -> set[str]:
    """Every name a hosts file gives an address (lower-cased; comments left out)."""
    names: set[str] = set()
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        names.update(name.lower() for name in fields[1:])
    return names


def with_hostname(text: str, hostname: str) -> str | None:
    """`text` (a hosts file) with a line for `hostname`, or None when it already names it
    (or there is no usable name)."""
    name = hostname.strip()
    if not name or any(c.isspace() or c == "#" for c in name) or name.lower() in names_in(text):
        return None
    if text and not text.endswith("\n"):
        text += "\n"
    return f"{text}{HOSTNAME_ADDRESS}\t{name}\n"
