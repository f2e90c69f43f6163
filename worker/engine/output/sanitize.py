"""Turn raw command output into clean text for a model: pure functions, no I/O.

Order matters: decode first (invalid UTF-8 replaced, never raised), then strip escape
sequences, then drop the remaining control characters, then fold CRLF, then redact.

The native dialect asks for more, each step off unless its policy turns it on (the texts
of the dialects that reproduce an existing tool stay exactly that tool's):
`reveal_invisible` shows bidirectional and zero-width characters, `last_frames` keeps the
last frame of a line rewritten with carriage returns, `cap_lines` cuts very long lines,
and `looks_binary` tells binary output from text by its first bytes.
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

#: Shapes of the values a variable scrubbed *by its name* holds when it is a setting,
#: not a secret: one word in one case or Capitalized, at most 12 letters (`WARNING`,
#: `production`, `Linux`: a logging level scrubbed this way blanked every `WARNING` of a
#: pytest run), a number or version (`3`, `v1.2.3`), a cloud region (`us-east-1`).
#: A mixed-case or longer run of letters, or one with digits or punctuation, may be a
#: secret and stays redacted.
_SETTING_SHAPES = re.compile(
    r"[a-z]{1,12}|[A-Z]{1,12}|[A-Z][a-z]{1,11}"
    r"|v?[0-9]+(?:\.[0-9]+)*"
    r"|[a-z]{2,6}(?:-gov|-iso[a-z]?)?-(?:(?:north|south)?(?:east|west)|north|south|central)"
    r"-?[0-9]{1,2}[a-z]?"
)


def worth_redacting(value: str) -> bool:
    """True for values that may be secrets: long enough, not a flag, word or small number.

    The test for a value known to be a secret (the worker's own keys and password)."""
    plain = value.strip()
    if len(plain) < MIN_SECRET_LENGTH or plain.lower() in _PLAIN_VALUES:
        return False
    return not (plain.isdigit() and len(plain) < 12)


def may_be_secret(value: str) -> bool:
    """True for a value of a variable that was scrubbed for its name (`AWS_*`,
    `*TOKEN*`...) or found in a secret file, when it can be a secret: worth redacting
    and not shaped as a setting (a word, a version, a region). Paths of public files
    are told apart where the disk can be looked at (`bashfleet.worker.engine.secrets`)."""
    return worth_redacting(value) and _SETTING_SHAPES.fullmatch(value.strip()) is None

# Terminal escapes, as ECMA-48 (5th edition, 1991) defines them and xterm and chalk's
# ansi-regex read them. The rule for every class: remove the sequence, never the text
# around it; an introducer without its ending removes only itself. Every quantifier is
# possessive (`*+`, `++`) and every payload stops at the next ESC, C1 control, BEL or
# newline, so each character is looked at a bounded number of times: the scan is linear
# whatever the input (a megabyte of lone introducers included).
#
# Control strings (§5.6): OSC, DCS, SOS, PM, APC, as ESC ] / P / X / ^ / _ or their C1
# forms U+009D, U+0090, U+0098, U+009E, U+009F, each ended by a string terminator (ST):
# ESC \ or U+009C, and for OSC also BEL (xterm's). For the others BEL is payload, as in
# DEC's parser. A doubled ESC in a payload is an escaped ESC (tmux passthrough), not an
# end. Without its ST (the payload meets a newline, another ESC or a C1 control first)
# a string does not match and its introducer alone is removed below: "important\x90data"
# keeps "data".
_OSC = r"(?:\x1b\]|\x9d)(?:[^\x07\x1b\x80-\x9f\n]|\x1b\x1b)*+(?:\x07|\x1b\\|\x9c)"
_STRING = r"(?:\x1b[PX^_]|[\x90\x98\x9e\x9f])(?:[^\x1b\x80-\x9f\n]|\x1b\x1b)*+(?:\x1b\\|\x9c)"
# CSI (§5.4): ESC [ or U+009B, parameter bytes 0x30-0x3F, intermediate bytes 0x20-0x2F,
# one final byte 0x40-0x7E.
_CSI = r"(?:\x1b\[|\x9b)[0-?]*+[ -/]*+[@-~]"
# Device status reports written without their `[` (`ESC 5 n`, `ESC 6 n`): chalk's
# ansi-regex takes these as one sequence and its fixtures expect them gone whole.
_DSR = r"\x1b[0-9]n"
# nF escape sequences (§5.3, ECMA-35): ESC, intermediate bytes 0x20-0x2F, a final byte
# 0x30-0x7E: charset designation `ESC ( B`, `ESC # 8`, `ESC % G`, `ESC SP F`.
_NF = r"\x1b[ -/]++[0-~]"
# Two-byte sequences: ESC Fp (0x30-0x3F: DECSC `ESC 7`, keypad `ESC =`, VT52 `ESC <`),
# ESC Fe (0x40-0x5F: C1 controls in 7 bits, VT52 cursor moves `ESC A`...) and ESC Fs
# (0x60-0x7E: `ESC c`, SCO cursor save/restore `ESC s` / `ESC u`). This is also what
# removes a lone 7-bit introducer (`ESC [`, `ESC ]`, `ESC P`) whose sequence never ends.
_ESC2 = r"\x1b[0-~]"
_ESCAPES = re.compile(f"{_OSC}|{_STRING}|{_CSI}|{_DSR}|{_NF}|{_ESC2}")
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


# ----------------------------------------------------------------- native extras

#: Characters that change how text reads without showing themselves: the bidirectional
#: controls of the "Trojan Source" attacks (CVE-2021-42574: ALM, LRM, RLM, LRE, RLE, PDF,
#: LRO, RLO, LRI, RLI, FSI, PDI) and the zero-width ones (ZWSP, word joiner, invisible
#: operators, BOM). ZWJ and ZWNJ are left alone: emoji sequences and several scripts
#: need them.
_INVISIBLE = re.compile("[\u061c\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")


def reveal_invisible(text: str) -> str:
    """Show each bidirectional or zero-width character as a visible `<U+202E>` marker,
    so what a model reads is what the bytes say."""
    return _INVISIBLE.sub(lambda found: f"<U+{ord(found.group()):04X}>", text)


def last_frames(text: str) -> str:
    """Each line rewritten with carriage returns (a progress bar) as its last frame.

    The last frame is the last non-empty run between carriage returns: `50%\\r100%\\r`
    shows `100%`. Lines without a carriage return are untouched.
    """
    if "\r" not in text:
        return text
    return "\n".join(_last_frame(line) if "\r" in line else line for line in text.split("\n"))


def _last_frame(line: str) -> str:
    frames = [frame for frame in line.split("\r") if frame]
    return frames[-1] if frames else ""


def cut_marker(rest: int) -> str:
    """What ends a line cut by `cap_lines`: how many characters were left out."""
    return f"… [{rest:,} more characters]"


def cap_lines(text: str, width: int) -> tuple[str, tuple[int, ...]]:
    """Cut every line longer than `width` characters to `width`, marked with what was cut.

    Returns the text and the 0-based numbers of the lines that were cut, so a caller can
    tell how many of them it shows. One minified line cannot fill a whole output budget.
    """
    if len(text) <= width:
        return text, ()
    lines = text.split("\n")
    cut = tuple(number for number, line in enumerate(lines) if len(line) > width)
    for number in cut:
        line = lines[number]
        lines[number] = line[:width] + cut_marker(len(line) - width)
    return ("\n".join(lines) if cut else text), cut


#: Bytes of a stream's start that decide whether it is binary (git looks at 8000).
BINARY_SNIFF = 8192
#: Above this share of invalid UTF-8 and control bytes, a stream is binary.
_BINARY_SHARE = 0.3
# Control bytes that text does not hold. TAB, LF, CR, FF, VT, BS, BEL and ESC are common
# in terminal output (colors, progress bars, bells) and do not count.
_BINARY_CONTROLS = bytes(set(range(0x20)) - {0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x1B})
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def looks_binary(sample: bytes) -> bool:
    """True when a stream's first bytes look binary rather than text.

    As Gemini CLI's `isBinary` and git: a NUL byte is binary (unless a UTF-16 byte order
    mark says the NULs are half of each character); so is a sample where more than 30% of
    the bytes are invalid UTF-8 or control characters text never holds. A character cut
    at the sample's end is not counted as invalid.
    """
    sample = sample[:BINARY_SNIFF]
    if not sample or sample.startswith(_UTF16_BOMS):
        return False
    if 0 in sample:
        return True
    whole = sample[: utf8_boundary(sample)]
    invalid = len(whole) - len(whole.decode("utf-8", "ignore").encode("utf-8"))
    controls = len(whole) - len(whole.translate(None, _BINARY_CONTROLS))
    return invalid + controls > _BINARY_SHARE * len(whole)


def utf8_boundary(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a character."""
    end = len(data)
    back = 0
    while back < 4 and end - back - 1 >= 0 and (data[end - back - 1] & 0xC0) == 0x80:
        back += 1
    if end - back - 1 >= 0:
        lead = data[end - back - 1]
        if lead >> 5 == 0b110:
            need = 2
        elif lead >> 4 == 0b1110:
            need = 3
        elif lead >> 3 == 0b11110:
            need = 4
        else:
            need = 1
        if need > back + 1:
            return end - back - 1
    return end


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
