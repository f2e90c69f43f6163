"""The worker's log formatters: one valid JSON object per line, ids, no secrets."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from bashfleet.worker.fleet import logs

HOST = "build-1"


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO, logging.Handler]]:
    """A private logger under `bashfleet` writing JSON lines into a buffer."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.make_formatter("json", HOST, "exec"))
    logger = logging.getLogger(f"bashfleet.test.{id(stream)}")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, stream, handler
    logger.removeHandler(handler)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    """Every line of the buffer, parsed: each must be a JSON object on its own."""
    parsed = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert all(isinstance(entry, dict) for entry in parsed)
    return parsed


def test_json_lines_have_the_fields_and_ids(
    captured: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, stream, _ = captured
    logger.info("call started: %s", "queue q", extra={"call_id": "c-1", "queue": "q"})
    logger.warning("about a job", extra={"job_id": "j-9"})
    logger.info("about nothing")
    first, second, third = lines(stream)
    assert {"time", "level", "logger", "host", "role", "pid", "message"} <= set(first)
    assert first["message"] == "call started: queue q"
    assert first["call_id"] == "c-1" and first["queue"] == "q" and "job_id" not in first
    assert first["host"] == HOST and first["role"] == "exec" and first["level"] == "INFO"
    assert isinstance(first["pid"], int) and str(first["time"]).endswith("Z")
    assert second["job_id"] == "j-9" and second["level"] == "WARNING"
    assert "call_id" not in third and "job_id" not in third


def test_json_stays_one_line_whatever_the_message_holds(
    captured: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, stream, _ = captured
    nasty = 'a\nb\r\nc\u2028d\x85e\x00f "quoted" \\ ünïcode'
    logger.info(nasty, extra={"call_id": "c\nx", "path": sys})  # a module: not JSON
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        logger.exception("failed", extra={"call_id": "c-2"})
    # str.splitlines breaks on \u2028 and \x85 too: the line must survive it.
    assert len(stream.getvalue().splitlines()) == 2
    first, second = lines(stream)
    assert first["message"] == nasty and first["call_id"] == "c\nx"
    assert "module 'sys'" in str(first["path"])
    assert "ValueError: boom" in str(second["exception"]) and second["call_id"] == "c-2"


def test_url_passwords_are_masked(
    captured: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, stream, _ = captured
    logger.warning("Redis at %s down", "redis://:hunter2pass@10.0.0.1:6379/0")
    logger.warning("also rediss://user:s3cr3t@h/1 and redis://h:6379 plain")
    text = stream.getvalue()
    assert "hunter2pass" not in text and "s3cr3t" not in text
    first, second = lines(stream)
    assert first["message"] == "Redis at redis://:**@10.0.0.1:6379/0 down"
    assert second["message"] == "also rediss://user:**@h/1 and redis://h:6379 plain"
    assert logs.mask_urls("redis://:**@h:1/0") == "redis://:**@h:1/0"


def test_other_libraries_extra_fields_are_left_out() -> None:
    # Celery logs a task's arguments (the command, its env) in `extra={"data": ...}`.
    formatter = logs.make_formatter("json", HOST, "exec")
    record = logging.LogRecord("celery.app.trace", logging.ERROR, __file__, 1, "Task failed",
                               None, None)
    record.data = {"args": [{"command": "echo SECRET", "env": {"TOKEN": "x"}}]}
    record.call_id = "c-3"
    entry = json.loads(formatter.format(record))
    assert "data" not in entry and "SECRET" not in json.dumps(entry)
    assert entry["call_id"] == "c-3" and entry["logger"] == "celery.app.trace"


def test_text_keeps_its_look_and_adds_the_ids() -> None:
    formatter = logs.make_formatter("text", HOST, "supervisor")
    plain = logging.LogRecord("bashfleet.worker", logging.INFO, __file__, 1, "host %s up",
                              ("a",), None)
    tagged = logging.LogRecord("bashfleet.worker", logging.INFO, __file__, 1, "call ended",
                               None, None)
    tagged.call_id, tagged.job_id = "c-4", "j-4"
    line = formatter.format(plain)
    assert line.endswith(f" bashfleet[{plain.process}] INFO host a up")
    assert formatter.format(tagged).endswith("INFO [c-4 j-4] call ended")
    assert tagged.getMessage() == "call ended"  # the record itself is left as it was
    assert tagged.message == "call ended"  # the tagged text went to a copy of it
    celery_style = logs.make_formatter("text", HOST, "exec", "[%(levelname)s] %(message)s")
    assert celery_style.format(tagged) == "[INFO] [c-4 j-4] call ended"
    injected = logging.LogRecord("bashfleet.worker", logging.INFO, __file__, 1, "x", None, None)
    injected.call_id = "c\nFAKE LINE"
    assert "\n" not in formatter.format(injected)


def test_setup_installs_one_handler_unless_logging_is_configured() -> None:
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    try:
        root.handlers = []
        logs.setup("json", HOST, "supervisor")
        assert len(root.handlers) == 1
        assert isinstance(root.handlers[0].formatter, logs.JsonFormatter)
        mine = list(root.handlers)
        logs.setup("text", HOST, "supervisor")  # configured already: left alone
        assert root.handlers == mine
    finally:
        logging.captureWarnings(False)
        root.handlers = saved
        root.setLevel(level)


def test_a_line_without_a_url_is_left_as_it_is() -> None:
    text = "call ended: exit 0 in 0.01s"
    assert logs.mask_urls(text) is text
    assert logs.mask_urls("see http://u:pw@h/ and ftp://v:pw2@k") == (
        "see http://u:**@h/ and ftp://v:**@k")
