"""`bashfleet.client.foreground`: Ctrl-C and SIGTERM around a foreground call, and following its
output, against a fake fleet (the real one: tests/e2e/test_run_terminal.py)."""

from __future__ import annotations

import io
import os
import signal
import threading
from typing import Any
from unittest.mock import patch

import pytest

from bashfleet.client import foreground
from bashfleet.client.errors import UnknownJob
from bashfleet.client.foreground import Follower, ForegroundRun, Outcome
from bashfleet.worker.wire.models import CallResult, JobHandle, OutputChunk, RunRequest, Spill

JOB = JobHandle(id="j1", host="h1", pid=7, pgid=7, output_path="/s/c1.out")


class FakeFleet:
    """A call that runs until cancelled or detached; files that grow as told."""

    def __init__(self, files: dict[str, str] | None = None) -> None:
        self.files = files or {}
        self.actions: list[str] = []
        self.ended = threading.Event()
        self.answer = CallResult(call_id="c1", host="h1", exit_code=0)
        self.running = threading.Event()

    def execute(self, request: RunRequest, *, check: bool = False) -> CallResult:
        assert not check  # a person sees a call that did not run as its result
        self.actions.append(f"execute {request.call_id}")
        self.running.set()
        assert self.ended.wait(10)
        return self.answer

    def cancel(self, call_id: str) -> bool:
        self.actions.append("cancel")
        self.answer = CallResult(call_id=call_id, host="h1", signal=15, cancelled=True)
        self.ended.set()
        return True

    def detach(self, call_id: str) -> bool:
        self.actions.append("detach")
        self.answer = CallResult(call_id=call_id, host="h1", backgrounded=True, job=JOB)
        self.ended.set()
        return True

    def read_output(self, item: str, *, offset: int, limit: int, stream: str) -> OutputChunk:
        if stream not in self.files:
            raise UnknownJob(f"no such job or call: {item}")
        data = self.files[stream]
        end = min(len(data), offset + limit)
        return OutputChunk(path=f"/s/{item}", offset=offset, next_offset=end, size=len(data),
                           text=data[offset:end], eof=end >= len(data))


def signals_later(fleet: FakeFleet, *plan: tuple[float, int]) -> threading.Thread:
    """Once the call runs (our handlers are in place then), send this process each signal
    after its delay (the handler runs in the main thread)."""

    def send() -> None:
        assert fleet.running.wait(10)
        for delay, signum in plan:
            threading.Event().wait(delay)  # a scripted person at the keyboard
            os.kill(os.getpid(), signum)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(foreground, "DETACH_WINDOW_S", 0.3)
    monkeypatch.setattr(foreground, "TICK_S", 0.02)


def run(fleet: FakeFleet) -> Outcome:
    return ForegroundRun(fleet, RunRequest(command="sleep 30"), follow=False).run()


def test_a_call_that_ends_by_itself_is_its_own_outcome() -> None:
    fleet = FakeFleet()
    threading.Timer(0.1, fleet.ended.set).start()
    outcome = run(fleet)
    assert outcome == Outcome(result=fleet.answer, status=None)
    assert fleet.actions[0].startswith("execute c")  # an id chosen before it was sent


def test_ctrl_c_cancels_after_the_window(capsys: pytest.CaptureFixture[str]) -> None:
    fleet = FakeFleet()
    signals_later(fleet, (0.1, signal.SIGINT))
    outcome = run(fleet)
    assert fleet.actions[1:] == ["cancel"]
    assert outcome.status == 130 and outcome.result is not None and outcome.result.cancelled
    err = capsys.readouterr().err
    assert "^C: cancelling call c" in err and "press Ctrl-C again" in err


def test_a_second_ctrl_c_detaches(capsys: pytest.CaptureFixture[str]) -> None:
    fleet = FakeFleet()
    signals_later(fleet, (0.1, signal.SIGINT), (0.05, signal.SIGINT))
    outcome = run(fleet)
    assert fleet.actions[1:] == ["detach"]
    assert outcome.status == 130 and outcome.result is not None and outcome.result.job == JOB
    assert "leaving call c" in capsys.readouterr().err


class SlowDetachFleet(FakeFleet):
    """A detach its host answers at once, but whose call's result (naming the job)
    arrives some ticks later, as over a real fleet."""

    def detach(self, call_id: str) -> bool:
        self.actions.append("detach")
        self.answer = CallResult(call_id=call_id, host="h1", backgrounded=True, job=JOB)
        threading.Timer(0.3, self.ended.set).start()
        return True


def test_after_a_detach_the_result_naming_the_job_is_waited_for() -> None:
    fleet = SlowDetachFleet()
    signals_later(fleet, (0.1, signal.SIGINT), (0.05, signal.SIGINT))
    outcome = run(fleet)
    assert fleet.actions[1:] == ["detach"]
    assert outcome.result is not None and outcome.result.job == JOB


def test_a_ctrl_c_after_the_detach_stops_the_waiting(capsys: pytest.CaptureFixture[str]) -> None:
    fleet = SlowDetachFleet()
    signals_later(fleet, (0.1, signal.SIGINT), (0.05, signal.SIGINT), (0.1, signal.SIGINT))
    outcome = run(fleet)
    assert outcome == Outcome(status=130)
    assert "no longer waiting for call c" in capsys.readouterr().err


def test_sigterm_cancels_at_once() -> None:
    fleet = FakeFleet()
    signals_later(fleet, (0.1, signal.SIGTERM))
    outcome = run(fleet)
    assert fleet.actions[1:] == ["cancel"] and outcome.status == 143


def test_the_signal_handlers_are_given_back() -> None:
    before = signal.getsignal(signal.SIGINT)
    fleet = FakeFleet()
    fleet.ended.set()
    run(fleet)
    assert signal.getsignal(signal.SIGINT) is before


# ---------------------------------------------------------------------------- follow


def follower(fleet: FakeFleet) -> tuple[Follower, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    found = Follower.of(fleet, "c1")
    found.streams[0].out, found.streams[1].out = out, err
    return found, out, err


def test_follow_prints_complete_lines_once() -> None:
    fleet = FakeFleet({"stdout": "a\nb", "stderr": ""})
    watcher, out, _ = follower(fleet)
    watcher.poll()
    assert out.getvalue() == "a\n"  # `b` waits for its newline
    fleet.files["stdout"] = "a\nbc\nd"
    watcher._next = 0.0
    watcher.poll()
    assert out.getvalue() == "a\nbc\n"
    # The call answered with its whole output (files not kept): the rest comes from it.
    rest = watcher.finish(CallResult(call_id="c1", host="h1", exit_code=0,
                                     stdout="a\nbc\nd", stderr="w\n"))
    assert out.getvalue() == "a\nbc\nd"
    assert rest.stdout == "" and rest.stderr == ""


def test_follow_reads_kept_files_to_their_end() -> None:
    fleet = FakeFleet({"stdout": "1\n2\n", "stderr": "e\n"})
    watcher, out, err = follower(fleet)
    watcher.poll()
    fleet.files["stdout"] += "3\nlast"
    kept = Spill(host="h1", stdout_path="/s/c1.out", stderr_path="/s/c1.err")
    watcher.finish(CallResult(call_id="c1", host="h1", exit_code=0, stdout="cut", spill=kept))
    assert (out.getvalue(), err.getvalue()) == ("1\n2\n3\nlast", "e\n")
    assert watcher.offsets() == {"stdout": 10, "stderr": 2}


def test_follow_prints_a_last_line_an_earlier_poll_read_already() -> None:
    # The command wrote its last line, without a newline, before the last poll: that poll
    # held it back; the end finds no new bytes and must still print it.
    fleet = FakeFleet({"stdout": "1\nlast, no newline", "stderr": ""})
    watcher, out, _ = follower(fleet)
    watcher.poll()
    assert out.getvalue() == "1\n"
    kept = Spill(host="h1", stdout_path="/s/c1.out", stderr_path="/s/c1.err")
    watcher.finish(CallResult(call_id="c1", host="h1", exit_code=5, stdout="cut", spill=kept))
    assert out.getvalue() == "1\nlast, no newline"


def test_follow_of_a_line_cut_by_a_slice_prints_it_whole_once() -> None:
    fleet = FakeFleet({"stdout": "abc\ndef\nghi", "stderr": ""})
    watcher, out, _ = follower(fleet)
    watcher.streams[0].offset = 0
    kept = Spill(host="h1", stdout_path="/s/c1.out", stderr_path="/s/c1.err")
    with patch("bashfleet.client.foreground.FOLLOW_SLICE_BYTES", 5):  # slices end mid-line
        watcher.finish(CallResult(call_id="c1", host="h1", exit_code=0, stdout="", spill=kept))
    assert out.getvalue() == "abc\ndef\nghi"


def test_follow_waits_for_a_call_that_has_not_started() -> None:
    watcher, out, _ = follower(FakeFleet())  # no files yet: UnknownJob
    watcher.poll()
    assert out.getvalue() == ""


def test_stdin_kinds(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    empty = tmp_path / "empty"
    empty.write_text("")
    full = tmp_path / "full"
    full.write_text("data")
    for path, kind in ((empty, "none"), (full, "file"), ("/dev/null", "none")):
        with open(path) as handle:
            monkeypatch.setattr("sys.stdin", handle)
            assert foreground.stdin_kind() == kind
    read, write = os.pipe()
    with os.fdopen(read) as handle, os.fdopen(write, "w"):
        monkeypatch.setattr("sys.stdin", handle)
        assert foreground.stdin_kind() == "pipe"
