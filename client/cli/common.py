"""What the CLI's commands share: the fleet client of a person's CLI, its words when no
fleet answers, JSON and table output, `--tag` options.
"""

from __future__ import annotations

from collections.abc import Sequence

#: `typing.TYPE_CHECKING` without loading `typing` (`bashfleet --help` does not need it).
TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

    from pydantic import BaseModel

    from bashfleet.client.fleet import Fleet


#: What a CLI user does when no fleet answers (not the Python API's `redis_url=`).
NO_FLEET_HINT = (
    "start a local fleet with `bashfleet up`, or set BASHFLEET_REDIS_URL to the Redis "
    "of a running fleet"
)


class NoFleet(Exception):  # noqa: N818 - said to a person as is
    """No fleet is configured or reachable: the CLI's words for it."""


def print_json(data: Any) -> None:
    import json  # noqa: PLC0415 - not for `bashfleet --help`

    print(json.dumps(data, indent=2, default=str))


def open_fleet(*, light: bool = False) -> Fleet:
    """The fleet client of a person's CLI: the admin key when one is configured (or the
    local fleet's), so `check`, `kill`, `output` and `ps --all` reach every owner's jobs.
    NoFleet when none is configured (no URL and no `bashfleet up` running).

    `light`: talk to a `redis://` or `unix://` Redis through the light client
    (`bashfleet.worker.fleet.resp`), not redis-py, whose import alone takes longer than
    a call: for `run`, whose commands it speaks."""
    from bashfleet.client.fleet import Fleet, resolve_url  # noqa: PLC0415 - keep `--help` fast

    if not resolve_url():
        raise NoFleet(f"no fleet to talk to: {NO_FLEET_HINT}")
    if light:
        from bashfleet.worker.fleet.connect import use_light_client  # noqa: PLC0415

        use_light_client()
    # No URL handed over: a client that found the local fleet finds it again where it
    # must (`bashfleet events` across a `down` and `up` hears the new fleet).
    return Fleet(admin=True)


# ---------------------------------------------------------------------- ps, hosts


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def blank(value: object) -> object:
    return "-" if value is None else value


def dump(item: BaseModel) -> dict[str, Any]:
    return item.model_dump(mode="json")


def tag_filter(pairs: Sequence[str] | None) -> dict[str, str]:
    """`--tag NAME=VALUE` options as a mapping; ValueError for one without `=`."""
    tags: dict[str, str] = {}
    for pair in pairs or ():
        name, equals, value = pair.partition("=")
        if not equals or not name:
            raise ValueError(f"--tag takes NAME=VALUE, not {pair!r}")
        tags[name] = value
    return tags
