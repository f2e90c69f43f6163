"""A host's pulls behind its control queue (`bashfleet.worker.fleet.image_calls`), with the store
replaced by a stand-in the test steers: one pull per reference, joined by later asks;
each answer brings the lines said since the caller's last; failures are raised to every
asker; a pull's end never waits for an asker."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bashfleet.worker.engine import id_slots, sandbox
from bashfleet.worker.engine.images import images
from bashfleet.worker.engine.images.image_meta import ImageError
from bashfleet.worker.fleet import image_calls
from bashfleet.worker.fleet.control import Runtime
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.control import ImagePull, ImagePullRequest, ImageRemoveRequest
from bashfleet.worker.wire.errors import ToolError
from bashfleet.worker.wire.models import ImageInfo

DIGEST = "sha256:" + "b" * 64


class FakeStore:
    """`images.ensure` as the test steers it: each pull says a line, then waits for the
    test to let it finish (or fail)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.release = threading.Event()
        self.fail: ToolError | None = None

    def ensure(self, ref: str, settings: Settings, progress: Callable[[str], None],
               *, refresh: bool = False) -> tuple[ImageInfo, Path]:
        self.calls.append(ref)
        progress(f"pulling {ref}")
        assert self.release.wait(10)
        progress("done")
        if self.fail is not None:
            raise self.fail
        return ImageInfo(ref=ref, digest=DIGEST, host=settings.host), Path("/nowhere")


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeStore]:
    fake = FakeStore()
    monkeypatch.setattr(images, "ensure", fake.ensure)
    monkeypatch.setattr(image_calls, "PULLS", image_calls.Pulls())
    yield fake
    fake.release.set()


#: Subordinate ids a host gives its workspaces (a host that takes images has some).
HOST_IDS = id_slots.HostIds(uids=id_slots.Range(1 << 30, 1 << 30),
                            gids=id_slots.Range(1 << 30, 1 << 30))


@pytest.fixture
def rt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Runtime:
    """A host that takes images, whoever runs the test (the ids are read from
    /etc/subuid for a root worker's run user)."""
    monkeypatch.setattr(sandbox, "host_ids", lambda settings: HOST_IDS)
    settings = Settings(state_dir=tmp_path, host="h1")
    return Runtime(settings=settings, redis=Any, instance="i")  # type: ignore[arg-type]


def test_a_single_tenant_host_refuses_a_pull_before_it_starts(
        store: FakeStore, rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "host_ids", lambda settings: None)
    with pytest.raises(ToolError, match="host h1 is single-tenant") as caught:
        _ask(rt, wait_s=0)
    assert caught.value.kind == "unavailable" and store.calls == []


def _ask(rt: Runtime, **fields: Any) -> ImagePull:
    return image_calls.pull(rt, ImagePullRequest(**{"ref": "reg.example/a:1", **fields}))


def test_a_pull_answers_while_it_runs_then_with_its_image(store: FakeStore, rt: Runtime) -> None:
    first = _ask(rt, wait_s=0.2)
    assert not first.done and first.lines == ("pulling reg.example/a:1",) and first.seen == 1
    store.release.set()
    done = _ask(rt, pull_id=first.pull_id, seen=first.seen, wait_s=5)
    assert done.done and done.image is not None and done.image.digest == DIGEST
    assert done.lines == ("done",) and done.seen == 2 and done.host == "h1"


def test_a_second_ask_for_the_same_reference_joins_the_pull(
    store: FakeStore, rt: Runtime
) -> None:
    one = _ask(rt, wait_s=0.1)
    two = _ask(rt, ref="reg.example/a:1", wait_s=0.1)
    other = _ask(rt, ref="reg.example/b:1", wait_s=0.1)
    assert one.pull_id == two.pull_id != other.pull_id
    store.release.set()
    for pull_id in (one.pull_id, other.pull_id):
        assert _ask(rt, pull_id=pull_id, wait_s=5).done
    assert sorted(store.calls) == ["reg.example/a:1", "reg.example/b:1"]


def test_a_failed_pull_is_raised_to_every_asker(store: FakeStore, rt: Runtime) -> None:
    first = _ask(rt, wait_s=0.1)
    store.fail = ImageError("not_found", "reg.example/a:1: no such image: manifest unknown")
    store.release.set()
    for _ in range(2):
        with pytest.raises(ImageError) as caught:
            _ask(rt, pull_id=first.pull_id, wait_s=5)
        assert caught.value.kind == "not_found"
    store.fail = None
    again = _ask(rt, wait_s=5)  # a new ask after a failure pulls again
    assert again.done and again.pull_id != first.pull_id


def test_too_many_pulls_at_once_are_refused(store: FakeStore, rt: Runtime) -> None:
    for n in range(image_calls.MAX_RUNNING_PULLS):
        _ask(rt, ref=f"reg.example/a:{n}", wait_s=0)
    with pytest.raises(ToolError) as caught:
        _ask(rt, ref="reg.example/more:1", wait_s=0)
    assert caught.value.kind == "limit"


def test_a_bad_reference_fails_at_once_and_starts_nothing(store: FakeStore, rt: Runtime) -> None:
    with pytest.raises(ImageError) as caught:
        _ask(rt, ref="-oops", wait_s=5)
    assert caught.value.kind == "invalid" and store.calls == []


def test_an_unknown_pull_id_is_not_found(store: FakeStore, rt: Runtime) -> None:
    with pytest.raises(ToolError) as caught:
        _ask(rt, pull_id="0" * 32)
    assert caught.value.kind == "not_found" and "pull again" in caught.value.message


def test_only_an_admin_removes(rt: Runtime) -> None:
    with pytest.raises(ToolError) as caught:
        image_calls.remove(rt, ImageRemoveRequest(ref="reg.example/a:1"), admin=False)
    assert caught.value.kind == "unauthorized"
    assert not image_calls.remove(rt, ImageRemoveRequest(ref="reg.example/a:1"), admin=True).removed


def test_progress_lines_past_the_kept_ones_are_counted() -> None:
    pull = image_calls.Pull("r", False)
    for n in range(image_calls.MAX_LINES + 10):
        pull.say(str(n))
    lines, seen = pull.since(0)
    assert seen == image_calls.MAX_LINES + 10 and len(lines) == image_calls.MAX_LINES
    assert pull.since(seen - 1) == ((str(seen - 1),), seen)
