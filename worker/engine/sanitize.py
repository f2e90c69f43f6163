"""Turn raw command output into clean text for a model: pure functions, no I/O.

Order matters: decode first (invalid UTF-8 replaced, never raised), then strip escape
sequences, then drop the remaining control characters, then fold CRLF, then redact.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

REDACTED = "[REDACTED]"

#: Secrets shorter than this are not redacted: replacing every "1" or "ab" in the
#: output would destroy it while protecting nothing.
MIN_SECRET_LENGTH = 6

#: Values of scrubbed variables that are settings, not secrets (`GITHUB_ACTIONS=true`,
#: `AWS_DEFAULT_OUTPUT=json`): redacting them would garble ordinary output.
_PLAIN_VALUES = frozenset(
    {"true", "false", "yes", "no", "on", "off", "none", "null", "json", "text", "table",
     "yaml", "default", "enabled", "disabled"}
)


def worth_redacting(value: str) -> bool:
    """True for values that may be secrets: long enough, not a flag, word or small number."""
    plain = value.strip()
    if len(plain) < MIN_SECRET_LENGTH or plain.lower() in _PLAIN_VALUES:
        return False
    return not (plain.isdigit() and len(plain) < 12)

# CSI: ESC [ parameters intermediates final byte. Also the 8-bit C1 form (U+009B).
_CSI = r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
# OSC: ESC ] ... terminated by BEL or ST (ESC \). Never crosses a newline, so a
# malformed sequence cannot swallow the rest of the output.
_OSC = r"(?:\x1b\]|\x9d)[^\x07\x1b\n]*(?:\x07|\x1b\\)?"
# DCS, SOS, PM and APC strings (ESC P / X / ^ / _, or their C1 forms) carry a payload up
# to ST, like OSC: strip the payload too (kitty graphics, tmux passthrough), not only
# the introducer. Same newline guard as OSC.
_STRING = r"(?:\x1b[PX^_]|[\x90\x98\x9e\x9f])[^\x07\x1b\n]*(?:\x07|\x1b\\)?"
# Other two-byte escapes (ESC followed by one character: charset selection, keypad...).
_ESC2 = r"\x1b[@-Z\\-_]|\x1b[()*+#][0-9A-Za-z]|\x1b[=>78c]"
_ESCAPES = re.compile(f"{_CSI}|{_OSC}|{_STRING}|{_ESC2}")
# Control characters other than TAB, LF and CR, plus DEL and the C1 range.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\x80-\x9f]")
# CR before LF, any number of them: "\r\r\n" (a CRLF written through a second CRLF
# conversion) must not leave a "\r\n" behind, as a plain replace would.
_CRLF = re.compile(r"\r+\n")


def decode(data: bytes) -> str:
    """Decode bytes as UTF-8, replacing invalid sequences with U+FFFD."""
    return data.decode("utf-8", errors="replace")


def strip_escapes(text: str) -> str:
    """Remove ANSI CSI and OSC sequences and other terminal escapes."""
    return _ESCAPES.sub("", text)


def drop_controls(text: str) -> str:
    """Drop control characters except tab, newline and carriage return."""
    return _CONTROL.sub("", text)


def sanitize_text(text: str) -> str:
    """Strip escapes and control characters and fold CRLF to LF."""
    return _CRLF.sub("\n", drop_controls(strip_escapes(text)))


def sanitize(data: bytes) -> str:
    """Raw output bytes to clean text. Never raises, whatever the bytes."""
    return sanitize_text(decode(data))


def secret_pattern(secrets: Iterable[str]) -> re.Pattern[str] | None:
    """Compile one pattern matching any of the secret values worth redacting."""
    return _secret_pattern(tuple(secrets))


@lru_cache(maxsize=16)
def _secret_pattern(secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    # Cached: every call of a worker scrubs the same values from the same environment.
    values = sorted({s for s in secrets if worth_redacting(s)}, key=len, reverse=True)
    if not values:
        return None
    return re.compile("|".join(re.escape(v) for v in values))


def redact(text: str, pattern: re.Pattern[str] | None) -> str:
    """Replace every occurrence of a secret value with a marker.

    Occurrences that overlap or touch are merged under one marker, so no part of a
    secret overlapping another one is left in the clear. In the odd case where the
    marker itself helps spell a secret (a secret such as "REDACTED" or "D]ab"), the
    secrets are removed without a marker instead, so no secret is ever left.
    """
    if pattern is None:
        return text
    spans = _secret_spans(text, pattern)
    if not spans:
        return text
    redacted = _replace_spans(text, spans, REDACTED)
    if pattern.search(redacted) is None:
        return redacted
    # Each pass removes at least one character, so this ends.
    while spans := _secret_spans(text, pattern):
        text = _replace_spans(text, spans, "")
    return text


def _secret_spans(text: str, pattern: re.Pattern[str]) -> list[tuple[int, int]]:
    """Every occurrence of a secret, overlapping ones included, merged into spans."""
    spans: list[tuple[int, int]] = []
    pos = 0
    while (found := pattern.search(text, pos)) is not None:
        start, end = found.span()
        if start == end:
            pos = start + 1
            continue
        # Occurrences starting inside this one extend it (secrets are short).
        inside = start + 1
        while inside < end:
            more = pattern.match(text, inside)
            if more is not None and more.end() > end:
                end = more.end()
            inside += 1
        if spans and start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
        pos = end
    return spans


def _replace_spans(text: str, spans: list[tuple[int, int]], marker: str) -> str:
    parts: list[str] = []
    last = 0
    for start, end in spans:
        parts.append(text[last:start])
        parts.append(marker)
        last = end
    parts.append(text[last:])
    return "".join(parts)
