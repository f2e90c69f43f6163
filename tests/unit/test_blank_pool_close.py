"""`Blanks.close` while `ahead` is starting its makers: it joins only started threads."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bashfleet.worker.engine.workspaces import blank_pool
from bashfleet.worker.settings import Settings


def test_a_close_while_makers_start_joins_them_without_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = blank_pool.Blanks()
    errors: list[BaseException] = []
    closers: list[threading.Thread] = []

    def close() -> None:
        try:
            pool.close()
        except BaseException as exc:  # what the test looks for
            errors.append(exc)

    class CloseFirst(threading.Thread):
        """A maker whose start lets `close` run first, as a worker ending might."""

        def start(self) -> None:
            closer = threading.Thread(target=close)
            closers.append(closer)
            closer.start()
            # It either finishes (it could list this maker before its start) or waits
            # for the pool's lock until `ahead` lets it go.
            closer.join(timeout=0.5)
            super().start()

    made = threading.Event()

    def make_blank(*_args: Any, **_kwargs: Any) -> None:
        made.set()
        raise OSError("no keeper in a unit test")

    # Only the pool's module sees the maker class (its own threads stay threading's).
    monkeypatch.setattr(blank_pool, "threading", SimpleNamespace(Thread=CloseFirst))
    monkeypatch.setattr(blank_pool, "make_blank", make_blank)
    pool.ahead(Settings(state_dir=tmp_path), "none", prebuilt=False, count=1)
    for closer in closers:
        closer.join(timeout=10)
    assert closers and made.wait(10)
    assert errors == []
