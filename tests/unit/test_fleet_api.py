"""`Fleet` and `AsyncFleet` offer one API: the same public methods, parameters, defaults
and return types, modulo `async` (a coroutine returns what the blocking method returns;
an async generator yields what the blocking generator yields)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from typing import Any

import pytest

from bashfleet.client import AsyncFleet, Fleet


def _normalized(annotation: Any) -> str:
    """An annotation (text, under `from __future__ import annotations`) with the asyncio
    spellings replaced by the blocking ones."""
    text = annotation if isinstance(annotation, str) else repr(annotation)
    text = re.sub(r"AsyncGenerator\[(.*), None\]$", r"Generator[\1, None, None]", text)
    text = re.sub(r"AsyncIterator\[(.*)\]$", r"Iterator[\1]", text)
    return re.sub(r"\bAsync(?=[A-Z])", "", text)


def _blocking_name(name: str) -> str:
    return {"__aenter__": "__enter__", "__aexit__": "__exit__"}.get(name, name)


def api(cls: type) -> dict[str, tuple[str, ...]]:
    """Every public method and property of a client class, by (blocking) name: its
    parameters (name, kind, default, annotation) and its return annotation."""
    found: dict[str, tuple[str, ...]] = {}
    for name, member in inspect.getmembers(cls):
        if name.startswith("_") and name not in ("__init__", "__aenter__", "__aexit__",
                                                 "__enter__", "__exit__"):
            continue
        if isinstance(member, property):
            assert member.fget is not None
            returned = inspect.signature(member.fget).return_annotation
            found[name] = ("property", _normalized(returned))
            continue
        if not inspect.isfunction(member):
            continue
        signature = inspect.signature(member)
        params = tuple(
            f"{p.name}:{p.kind.name}:{p.default!r}:{_normalized(p.annotation)}"
            for p in signature.parameters.values()
        )
        found[_blocking_name(name)] = (*params, "->", _normalized(signature.return_annotation))
    return found


def differences(one: type, other: type) -> list[str]:
    """What differs between two client classes' APIs, one line per method."""
    mine, theirs = api(one), api(other)
    lines = [f"only in {one.__name__}: {name}" for name in sorted(mine.keys() - theirs.keys())]
    lines += [f"only in {other.__name__}: {name}" for name in sorted(theirs.keys() - mine.keys())]
    lines += [f"{name}: {mine[name]} != {theirs[name]}"
              for name in sorted(mine.keys() & theirs.keys()) if mine[name] != theirs[name]]
    return lines


def test_fleet_and_async_fleet_have_one_api() -> None:
    assert differences(Fleet, AsyncFleet) == []
    assert len(api(Fleet)) >= 25  # the check sees the whole API, not an empty one


def _methods(cls: type) -> Iterator[tuple[str, Any]]:
    for name, member in inspect.getmembers(cls, inspect.isfunction):
        if not name.startswith("_") or name in ("__aenter__", "__aexit__"):
            yield name, member


def test_every_async_method_is_awaited_and_every_blocking_one_is_not() -> None:
    for name, member in _methods(AsyncFleet):
        assert inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member), name
    for name, member in _methods(Fleet):
        assert not (inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member)), \
            name


class _Blocking:
    def run(self, command: str, *, check: bool = True) -> int:
        return 0

    def events(self) -> Iterator[int]:
        yield 0


class _Drifted:
    async def run(self, command: str, *, check: bool = False) -> int:
        return 0

    async def cancel(self, call_id: str) -> bool:
        return True


@pytest.mark.parametrize(
    ("expected",),
    [(["only in _Blocking: events", "only in _Drifted: cancel"],)],
)
def test_a_drift_is_caught(expected: list[str]) -> None:
    found = differences(_Blocking, _Drifted)
    assert found[:2] == expected
    assert len(found) == 3 and found[2].startswith("run: ") and "False" in found[2]
