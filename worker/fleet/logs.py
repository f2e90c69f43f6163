"""The worker's log lines: text as they always were, or one JSON object per line.

`BASHFLEET_LOG_FORMAT=json` makes every line of a worker (its supervisor and both
consumers) a JSON object that a log shipper can take as it is:

    {"time": "2025-01-02T03:04:05.678Z", "level": "INFO", "logger": "bashfleet.worker",
     "host": "build-1", "role": "exec", "pid": 4242, "call_id": "c-1f...",
     "message": "call ended: exit 0 in 0.03s", "exit_code": 0, "duration_s": 0.031}

`time`, `level`, `logger`, `host`, `role` (`supervisor`, `exec` or `ctl`), `pid` and
`message` are always there; `call_id` / `job_id` when the line is about one (given
with `extra=`); `exception` when one was logged. bashfleet's own lines add their
`extra=` fields (exit code, duration, queue...). Other libraries' extra fields are
left out: Celery's, for one, carry a task's arguments, and those hold the command
and its environment.

The text format keeps its look and shows the ids as `[call_id]` before the message.
Both formats mask the password of any URL in a line (`redis://:**@host`), a last
guard behind the callers, which already log URLs masked.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

LogFormat = Literal["text", "json"]

#: Supervisor lines in the text format (the consumers keep Celery's format).
TEXT_FORMAT = "%(asctime)s bashfleet[%(process)d] %(levelname)s %(message)s"
#: Record attributes that name what a line is about, in the order they are shown.
ID_FIELDS = ("call_id", "job_id")
#: Loggers whose `extra=` fields go into JSON lines: ours, which never put secrets there.
OWN_LOGGER = "bashfleet"

# Every attribute a plain LogRecord has: anything else on a record came from `extra=`.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName",
}
# `scheme://user:password@` (user may be empty); the password is replaced by `**`.
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)[^\s@/]+@")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def mask_urls(text: str) -> str:
    """`text` with the password of every URL in it replaced by `**`."""
    if "://" not in text:  # no URL (the pattern needs one): most lines, at a glance
        return text
    return _URL_PASSWORD.sub(r"\1**@", text)


def record_ids(record: logging.LogRecord) -> dict[str, str]:
    """The call / job ids a record is about (given with `extra=`)."""
    ids: dict[str, str] = {}
    for name in ID_FIELDS:
        value = getattr(record, name, None)
        if value is not None and value != "":
            ids[name] = str(value)
    return ids


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line, whatever the message holds."""

    def __init__(self, host: str, role: str) -> None:
        super().__init__()
        self.host = host
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line (no trailing newline: the handler adds it)."""
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "host": self.host,
            "role": self.role,
            "pid": record.process,
            **record_ids(record),
            "message": mask_urls(record.getMessage()),
        }
        if record.name == OWN_LOGGER or record.name.startswith(OWN_LOGGER + "."):
            for name, value in vars(record).items():
                if name not in _STANDARD_ATTRS and name not in entry:
                    entry[name] = value
        if record.exc_info:
            entry["exception"] = mask_urls(self.formatException(record.exc_info))
        elif record.exc_text:
            entry["exception"] = mask_urls(record.exc_text)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # ensure_ascii: besides \n, line splitters also break on U+2028, U+0085 and
        # friends; escaped, a line is one line for every reader. default=str: an extra
        # field that JSON cannot hold (a Path, an exception) is logged as text.
        return json.dumps(entry, ensure_ascii=True, default=str)


class TextFormatter(logging.Formatter):
    """A `%`-style format with `[call_id job_id]` before the message when known."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        """The formatted line, tagged with the record's ids."""
        ids = record_ids(record)
        if not ids:
            return super().formatMessage(record)
        # A copy: other handlers of the same record must see its message untouched. Its
        # attributes copied as they are, without copy.copy's generic protocol.
        tagged = object.__new__(logging.LogRecord)
        tag = " ".join(_CONTROL.sub("?", value) for value in ids.values())
        tagged.__dict__ = {**record.__dict__, "message": f"[{tag}] {record.message}"}
        return super().formatMessage(tagged)

    def format(self, record: logging.LogRecord) -> str:
        """The whole line, traceback included, with URL passwords masked."""
        return mask_urls(super().format(record))


def json_say(host: str, role: str, logger: str) -> Callable[..., None]:
    """A stand-in for a `say(msg, file)` that prints a notice: the notice as a JSON line.

    It writes with `os.write`, no logging lock taken: Celery says its shutdown notices
    from a signal handler, which may interrupt a thread that holds the handler's lock.
    """
    formatter = JsonFormatter(host, role)

    def say(msg: object, f: Any = None) -> None:
        record = logging.makeLogRecord(
            {"name": logger, "levelno": logging.INFO, "levelname": "INFO", "msg": str(msg)}
        )
        target: Any = f if hasattr(f, "fileno") else sys.__stderr__
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.write(target.fileno(), (formatter.format(record) + "\n").encode())

    return say


def make_formatter(
    log_format: LogFormat, host: str, role: str, text_format: str = TEXT_FORMAT
) -> logging.Formatter:
    """The formatter of `log_format` for one process of a worker."""
    if log_format == "json":
        return JsonFormatter(host, role)
    return TextFormatter(text_format)


def setup(log_format: LogFormat, host: str, role: str) -> None:
    """Log INFO and up to stderr in `log_format`, unless the process set up logging itself.

    An embedding program (or a test) that configured the root logger keeps its handlers.
    """
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(make_formatter(log_format, host, role))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    if log_format == "json":
        # Python warnings print plain text to stderr; as records they become JSON too.
        logging.captureWarnings(True)


def restyle(
    logger: logging.Logger, log_format: LogFormat, host: str, role: str, text_format: str
) -> None:
    """Give every handler of `logger` our formatter (after Celery set up its handlers)."""
    for handler in logger.handlers:
        handler.setFormatter(make_formatter(log_format, host, role, text_format))
    if log_format == "json":
        logging.captureWarnings(True)
