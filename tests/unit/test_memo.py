"""TimedMemo: a value per key, computed at most once per time-to-live."""

from __future__ import annotations

import functools

from bashfleet.worker.engine.memo import TimedMemo


def test_a_value_is_reused_within_its_ttl_and_per_key() -> None:
    memo: TimedMemo[str, str] = TimedMemo(ttl_s=60.0)
    calls: list[str] = []

    def compute(key: str) -> str:
        calls.append(key)
        return key.upper()

    assert memo.get("a", lambda: compute("a")) == "A"
    assert memo.get("a", lambda: compute("other")) == "A"
    assert memo.get("b", lambda: compute("b")) == "B"
    assert calls == ["a", "b"]


def test_a_value_is_computed_again_after_its_ttl() -> None:
    memo: TimedMemo[str, int] = TimedMemo(ttl_s=0.0)
    values = iter(range(10))
    assert memo.get("k", lambda: next(values)) == 0
    assert memo.get("k", lambda: next(values)) == 1


def test_forget_and_clear_make_the_next_get_compute() -> None:
    memo: TimedMemo[str, int] = TimedMemo(ttl_s=60.0)
    values = iter(range(10))
    memo.get("k", lambda: next(values))
    memo.forget("k")
    assert memo.get("k", lambda: next(values)) == 1
    memo.clear()
    assert memo.get("k", lambda: next(values)) == 2


def test_none_is_a_value_like_any_other() -> None:
    memo: TimedMemo[str, None] = TimedMemo(ttl_s=60.0)
    calls: list[int] = []

    def compute() -> None:
        calls.append(1)

    memo.get("k", compute)
    memo.get("k", compute)
    assert calls == [1]


def test_at_most_kept_keys_are_held() -> None:
    memo: TimedMemo[int, int] = TimedMemo(ttl_s=60.0, kept=3)
    for key in range(10):
        memo.get(key, functools.partial(int, key))
        assert len(memo._entries) <= 3
