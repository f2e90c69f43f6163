"""The blocking client is generated from the asyncio one: the checked-in `client/_sync/`
is exactly what `scripts/unasync.py` writes, the rewriting rules do what they say, and
the two hand-written `concurrency` modules offer the same names."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

import pytest

from bashfleet.client._async import concurrency as async_concurrency
from bashfleet.client._sync import concurrency as sync_concurrency

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync", ROOT / "scripts" / "unasync.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["unasync"] = module
    spec.loader.exec_module(module)
    return module


unasync = _script()


@pytest.mark.parametrize("source", unasync.sources(), ids=lambda path: path.name)
def test_the_checked_in_sync_code_is_what_the_script_generates(source: Path) -> None:
    target = unasync.TARGET / source.name
    assert target.exists(), f"run scripts/unasync.py: {target} is missing"
    assert target.read_text(encoding="utf-8") == unasync.generate(source), (
        f"{target.relative_to(ROOT)} differs from what scripts/unasync.py generates from "
        f"{source.relative_to(ROOT)}: edit the asyncio module, then run the script"
    )


def test_every_sync_module_is_generated_or_hand_written() -> None:
    generated = {p.name for p in unasync.sources()}
    present = {p.name for p in unasync.TARGET.glob("*.py")}
    assert present == generated | unasync.HAND_WRITTEN


def test_the_check_mode_names_a_stale_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "_async"
    target = tmp_path / "_sync"
    source.mkdir()
    target.mkdir()
    (source / "thing.py").write_text('"""A thing."""\n\n\nasync def f() -> None:\n    pass\n')
    (target / "thing.py").write_text("hand edited\n")
    monkeypatch.setattr(unasync, "SOURCE", source)
    monkeypatch.setattr(unasync, "TARGET", target)
    monkeypatch.setattr(unasync, "ROOT", tmp_path)
    assert unasync.main(["--check"]) == 1
    assert "_sync/thing.py differs" in capsys.readouterr().err
    assert unasync.main([]) == 0
    assert unasync.main(["--check"]) == 0
    assert "def f() -> None:" in (target / "thing.py").read_text()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("async def run(self) -> CallResult:", "def run(self) -> CallResult:"),
        ("        async with self._io:", "        with self._io:"),
        ("    async for event in stream:", "    for event in stream:"),
        ("    return await self.execute(x)", "    return self.execute(x)"),
        ("class AsyncFleet:", "class Fleet:"),
        ("    slot: AsyncSlot[Answer] = AsyncSlot()", "    slot: Slot[Answer] = Slot()"),
        ("-> AsyncGenerator[JobEvent | None, None]:", "-> Generator[JobEvent | None, None, None]:"),
        ("    operation: Callable[P, Awaitable[T]],", "    operation: Callable[P, T],"),
        ("from collections.abc import AsyncIterator, Awaitable, Callable",
         "from collections.abc import Iterator, Callable"),
        ("from bashfleet.client._async.concurrency import sleep",
         "from bashfleet.client._sync.concurrency import sleep"),
        ("        self._redis = async_redis_client(url)",
         "        self._redis = redis_client(url)"),
        ("    @asynccontextmanager", "    @contextmanager"),
        ("    async def __aenter__(self) -> AsyncFleet:", "    def __enter__(self) -> Fleet:"),
        ("    async def __aexit__(self, *exc: object) -> None:",
         "    def __exit__(self, *exc: object) -> None:"),
        ("        await stream.aclose()", "        stream.close()"),
        ("        event = await anext(stream)", "        event = next(stream)"),
        # Prose may name the asyncio class by its module; words that merely contain
        # the letters are left alone.
        ('"""See `bashfleet.client.aio.AsyncFleet`: awaiting it..."""',
         '"""See `bashfleet.client.aio.AsyncFleet`: awaiting it..."""'),
        ("    awaited = MyAsyncThing()", "    awaited = MyAsyncThing()"),
    ],
)
def test_unasync_line(line: str, expected: str) -> None:
    assert unasync.unasync_line(line) == expected


def _public(module: ModuleType) -> dict[str, object]:
    return {name: value for name, value in vars(module).items()
            if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__}


def test_the_hand_written_primitives_are_twins() -> None:
    mine, theirs = _public(async_concurrency), _public(sync_concurrency)
    renamed = {unasync.unasync_line(name) for name in mine}
    assert renamed == set(theirs)
    for name, value in mine.items():
        twin = theirs[unasync.unasync_line(name)]
        if inspect.isclass(value):
            assert {m for m in vars(value) if not m.startswith("_")} == {
                m for m in vars(twin) if not m.startswith("_")}, name
    assert async_concurrency.CANCELLATION_EXCEPTIONS
    assert sync_concurrency.CANCELLATION_EXCEPTIONS == ()
