"""bashfleet.worker.engine.output.sanitize:
escape stripping, control filtering, CRLF folding, redaction."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bashfleet.worker.engine.output.sanitize import (
    MIN_SECRET_LENGTH,
    REDACTED,
    decode,
    drop_controls,
    redact,
    sanitize,
    sanitize_text,
    secret_pattern,
    strip_escapes,
    worth_redacting,
)

# Everything sanitize may leave: no C0 control except TAB, LF, CR; no DEL; no C1.
_FORBIDDEN = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\x80-\x9f]")


# ------------------------------------------------------------------------- table tests


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        # ANSI CSI colors (SGR), 8 and 256 colors, truecolor, reset.
        (b"\x1b[31mred\x1b[0m", "red"),
        (b"\x1b[1;32mok\x1b[m done", "ok done"),
        (b"\x1b[38;5;196mx\x1b[39m", "x"),
        (b"\x1b[38;2;255;0;0mtrue\x1b[0m", "true"),
        # Cursor movement and erasing.
        (b"\x1b[2K\x1b[1Gprogress", "progress"),
        (b"a\x1b[1Ab\x1b[10;20Hc\x1b[Jd", "abcd"),
        (b"\x1b[?25lhidden cursor\x1b[?25h", "hidden cursor"),
        # OSC window title, BEL- and ST-terminated; hyperlinks.
        (b"\x1b]0;my title\x07after", "after"),
        (b"\x1b]2;title\x1b\\after", "after"),
        (b"\x1b]8;;http://x.y/\x1b\\link\x1b]8;;\x1b\\", "link"),
        # An unterminated OSC removes only its introducer (as chalk's ansi-regex, which
        # requires the terminator): no text is lost, the next line survives.
        (b"\x1b]0;broken\nnext line\n", "0;broken\nnext line\n"),
        # Two-byte escapes: keypad mode, charset selection, save/restore cursor.
        (b"\x1b=\x1b>\x1b(Bplain\x1b7\x1b8", "plain"),
        # DCS / APC strings lose their payload, not only the introducer.
        (b"\x1bPtmux;payload\x1b\\after", "after"),
        (b"\x1b_Gf=100;AAAA\x1b\\img", "img"),
        # C1 forms of CSI and OSC (encoded as UTF-8 characters U+009B, U+009D).
        ("\u009b31mc1\u009b0m".encode(), "c1"),
        ("\u009d0;t\u0007x".encode(), "x"),
        # Invalid UTF-8 is replaced, never raised.
        (b"caf\xc3", "caf\ufffd"),
        (b"\xff\xfeok", "\ufffd\ufffdok"),
        (b"a\xe2\x82b", "a\ufffdb"),
        # NUL bytes and other controls are dropped; TAB, LF, CR kept.
        (b"a\x00b\x00c", "abc"),
        (b"bell\x07 back\x08space\x7f", "bell backspace"),
        (b"tab\there\rcr\n", "tab\there\rcr\n"),
        (b"\x1bMreverse index, lone ESC\x1b", "reverse index, lone ESC"),
        # CRLF folded to LF; a lone CR (progress bars) kept.
        (b"one\r\ntwo\r\n", "one\ntwo\n"),
        (b"50%\r100%\r\n", "50%\r100%\n"),
        (b"double\r\r\nconversion", "double\nconversion"),
        # A control between CR and LF: dropped first, then the pair folds.
        (b"x\r\x00\ny", "x\ny"),
        # A CSI between CR and LF.
        (b"x\r\x1b[0m\ny", "x\ny"),
        (b"", ""),
        ("héllo wörld ✓ 日本".encode(), "héllo wörld ✓ 日本"),
    ],
)
def test_sanitize_table(raw: bytes, clean: str) -> None:
    assert sanitize(raw) == clean


def test_decode_replaces_invalid_bytes() -> None:
    assert decode(b"ok\x80\n") == "ok\ufffd\n"
    assert decode("✓".encode()[:2]) == "\ufffd"


def test_strip_escapes_keeps_plain_text_and_controls() -> None:
    assert strip_escapes("a\tb\x00c") == "a\tb\x00c"
    assert strip_escapes("\x1b[31mred\x1b[0m") == "red"


def test_drop_controls_keeps_tab_newline_cr_only() -> None:
    every = "".join(chr(c) for c in range(0xA0))
    kept = drop_controls(every)
    assert kept == "\t\n\r" + "".join(chr(c) for c in range(0x20, 0x7F))


def test_sanitize_text_matches_sanitize_on_decoded_bytes() -> None:
    raw = b"\x1b[1mbold\x1b[0m\r\n\x00"
    assert sanitize_text(raw.decode()) == sanitize(raw) == "bold\n"


# ----------------------------------------------------------------------- redaction


def test_secret_pattern_ignores_short_and_empty_values() -> None:
    assert secret_pattern([]) is None
    assert secret_pattern(["", "a", "ab", "x" * (MIN_SECRET_LENGTH - 1)]) is None
    pattern = secret_pattern(["abcde", "abcdef"])
    assert pattern is not None
    assert redact("abcde abcdef", pattern) == f"abcde {REDACTED}"


@pytest.mark.parametrize(
    "value", ["true", "FALSE", "json", "table", "12345", "  yes  ", "8080", "default"]
)
def test_setting_values_are_not_treated_as_secrets(value: str) -> None:
    # GITHUB_ACTIONS=true or AWS_DEFAULT_OUTPUT=json must not garble ordinary output.
    assert not worth_redacting(value)
    assert secret_pattern([value]) is None


@pytest.mark.parametrize("value", ["hunter22", "ghp_abcdef123456", "123456789012345"])
def test_secret_like_values_are_redacted(value: str) -> None:
    assert worth_redacting(value)


def test_secret_pattern_escapes_regex_metacharacters() -> None:
    pattern = secret_pattern(["a.b*c+"])
    assert pattern is not None
    assert redact("aXbbc+ a.b*c+", pattern) == f"aXbbc+ {REDACTED}"


def test_redact_prefers_the_longest_secret() -> None:
    pattern = secret_pattern(["hunter", "hunter22"])
    assert pattern is not None
    assert redact("pw=hunter22!", pattern) == f"pw={REDACTED}!"


def test_redact_none_pattern_is_identity() -> None:
    assert redact("anything", None) == "anything"


def test_redact_every_occurrence() -> None:
    pattern = secret_pattern(["s3cr3t"])
    assert pattern is not None
    assert redact("s3cr3t and s3cr3t\ns3cr3t", pattern) == (
        f"{REDACTED} and {REDACTED}\n{REDACTED}"
    )


def test_redact_overlapping_secrets_leaves_no_part_in_clear() -> None:
    # "abcdX" wins at position 0; the overlapping "Xefgh" must not leave "efgh" shown.
    pattern = secret_pattern(["abcdefX", "Xghijkl"])
    assert pattern is not None
    assert redact("<abcdefXghijkl>", pattern) == f"<{REDACTED}>"


def test_redact_adjacent_secrets_merge_into_one_marker() -> None:
    pattern = secret_pattern(["aaaaa1", "bbbbb2"])
    assert pattern is not None
    assert redact("aaaaa1bbbbb2", pattern) == REDACTED


@pytest.mark.parametrize("secret", ["REDACTED", "EDACTE", "[REDAC", "TED]xy"])
def test_redact_secret_spelled_by_the_marker_is_still_removed(secret: str) -> None:
    pattern = secret_pattern([secret, "zzzzzz"])
    assert pattern is not None
    out = redact(f"a {secret} b zzzzzzx", pattern)
    assert secret not in out
    assert "zzzzzz" not in out
    assert out.startswith("a ")


# ---------------------------------------------------------------------- properties

_escape_pieces = st.sampled_from(
    [
        b"\x1b[",
        b"\x1b]",
        b"\x1b",
        b"\x07",
        b"\x1b\\",
        b"\r",
        b"\n",
        b"\r\n",
        b"\r\r\n",
        b"\x00",
        b"m",
        b"31;1",
        b"\xc3",
        b"\xe2\x82",
        b"\xc2\x9b",
        b"\xc2\x9d",
        b"\x1bP",
        b"\x1b_",
    ]
)
_raw = st.one_of(
    st.binary(max_size=400),
    st.lists(st.one_of(_escape_pieces, st.binary(max_size=8)), max_size=60).map(b"".join),
)


@settings(max_examples=400, deadline=None)
@given(_raw)
def test_sanitize_never_raises_and_output_is_clean(raw: bytes) -> None:
    out = sanitize(raw)
    assert _FORBIDDEN.search(out) is None
    assert "\r\n" not in out
    assert "\x1b" not in out
    out.encode("utf-8")  # never a lone surrogate


@settings(max_examples=400, deadline=None)
@given(_raw)
def test_sanitize_preserves_newline_count(raw: bytes) -> None:
    assert sanitize(raw).count("\n") == raw.count(b"\n")


@settings(max_examples=200, deadline=None)
@given(_raw)
def test_sanitize_is_idempotent(raw: bytes) -> None:
    once = sanitize(raw)
    assert sanitize_text(once) == once


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), max_size=200))
def test_sanitize_keeps_printable_text_unchanged(text: str) -> None:
    assert sanitize(text.encode("utf-8")) == text


_plain_secret = st.text(
    alphabet=st.sampled_from("abcXYZ[]REDACT-_1"), min_size=MIN_SECRET_LENGTH, max_size=8
)
# Secrets that the marker itself helps to spell: a piece of it, or its end plus text.
_marker_piece = st.tuples(st.integers(0, len(REDACTED)), st.integers(0, len(REDACTED))).map(
    lambda ij: REDACTED[min(ij) : max(ij)]
)
_marker_secret = st.tuples(_marker_piece, st.text(alphabet="abc[]", max_size=4)).map(
    "".join
).filter(lambda s: len(s) >= MIN_SECRET_LENGTH)
_secret = st.one_of(_plain_secret, _marker_secret).filter(worth_redacting)


@settings(max_examples=400, deadline=None)
@given(
    secrets=st.lists(_secret, min_size=1, max_size=4),
    pieces=st.lists(st.text(alphabet="abcXYZ[]REDACT-_1 \n", max_size=6), max_size=12),
    data=st.data(),
)
def test_redact_leaves_no_secret(
    secrets: list[str], pieces: list[str], data: st.DataObject
) -> None:
    # Build texts full of secrets, overlapping and adjacent, around noise.
    parts: list[str] = []
    for piece in pieces:
        parts.append(piece)
        if data.draw(st.booleans()):
            parts.append(data.draw(st.sampled_from(secrets)))
    text = "".join(parts)
    pattern = secret_pattern(secrets)
    assert pattern is not None
    out = redact(text, pattern)
    for secret in secrets:
        assert secret not in out
    if not any(secret in text for secret in secrets):
        assert out == text


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), st.lists(st.text(max_size=MIN_SECRET_LENGTH - 1), max_size=5))
def test_short_secrets_are_never_redacted(text: str, secrets: list[str]) -> None:
    assert secret_pattern(secrets) is None
    assert redact(text, secret_pattern(secrets)) == text


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), st.text(min_size=MIN_SECRET_LENGTH, max_size=10))
def test_redact_of_arbitrary_text_and_secret(text: str, secret: str) -> None:
    assume(worth_redacting(secret))
    pattern = secret_pattern([secret])
    out = redact(text + secret + text, pattern)
    assert secret not in out
