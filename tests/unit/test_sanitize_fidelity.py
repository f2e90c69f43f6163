"""The sanitizer removes escape sequences and never the text around them.

Cases derived from ECMA-48 (5th edition) and from the peers' public tests: chalk's
ansi-regex fixtures (VT52, VT100 and urxvt codes, terminal links with each string
terminator), chalk's strip-ansi tests and Gemini CLI's `stripUnsafeCharacters` tests
(its DCS data-loss regression among them). Expectations follow bashfleet's rules where
they differ from a peer's (DEL and CRLF are bashfleet's own: DEL is dropped, CRLF folded).
Then the native extras: invisible characters, progress frames, long lines, binary.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bashfleet.worker.engine.output.sanitize import (
    BINARY_SNIFF,
    cap_lines,
    cut_marker,
    last_frames,
    looks_binary,
    reveal_invisible,
    sanitize,
    sanitize_text,
    strip_escapes,
)

ESC = "\x1b"
#: The three string terminators: BEL (xterm), ESC \ (7-bit ST), U+009C (8-bit ST).
TERMINATORS = ["\x07", "\x1b\\", "\x9c"]
#: Text around sequences in the ansi-regex fixtures: every character must survive.
AROUND = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ!@#$%^&*()_+1234567890-=[]{};':\"./>?,<\\|"
)


# ------------------------------------------------------- class 1: lone C1 introducers


@pytest.mark.parametrize("introducer", ["\x90", "\x98", "\x9d", "\x9e", "\x9f"])
def test_a_lone_c1_string_introducer_removes_only_itself(introducer: str) -> None:
    text = f"important{introducer}data after it\nnext line\n"
    assert sanitize_text(text) == "importantdata after it\nnext line\n"
    # As UTF-8 bytes (C2 90 ...), the way a command writes them.
    assert sanitize(text.encode()) == "importantdata after it\nnext line\n"


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        # Gemini CLI's stripUnsafeCharacters tests.
        ("important\x90data after DCS", "importantdata after DCS"),
        ("keep\x9b42mthis text", "keepthis text"),
        ("start\x90\x9b\x85middle\x80end", "startmiddleend"),
        ("hello\x80world", "helloworld"),
        ("hello\x85world", "helloworld"),
        ("hello\x8aworld", "helloworld"),
        ("hello\x9fworld", "helloworld"),
        ("hello\xa0world", "hello\xa0world"),  # NBSP is not a C1 control
        ("a\x00b\x01c\x02d\x07e\x08f", "abcdef"),
        ("line1\n\x00line2\t\x07line3\r\n", "line1\nline2\tline3\n"),
        ("\x1b[31mRed\x1b[0m text", "Red text"),
        ("hello\x1b[9D\x1b[Kworld", "helloworld"),
        ("\x1b[1;32;40mBold Green on Black\x1b[0m", "Bold Green on Black"),
        # Several lone introducers in a row, then a real sequence: all text kept.
        ("\x90\x98\x9e\x9fplain\x1b[1mbold\x1b[0m", "plainbold"),
        # A lone introducer whose text reaches another introducer: each removes itself.
        ("a\x90b\x9dc\x9fd", "abcd"),
        # ...or the start of a real sequence, which is still removed whole.
        ("a\x90b\x1b]0;title\x07c", "abc"),
    ],
)
def test_gemini_cli_cases(raw: str, clean: str) -> None:
    assert sanitize_text(raw) == clean


@pytest.mark.parametrize("introducer", ["\x90", "\x98", "\x9d", "\x9e", "\x9f"])
@pytest.mark.parametrize("terminator", ["\x1b\\", "\x9c"])
def test_a_c1_string_with_its_terminator_is_removed_whole(
    introducer: str, terminator: str
) -> None:
    assert sanitize_text(f"a{introducer}payload;1;2{terminator}b") == "ab"


@pytest.mark.parametrize("introducer", ["\x1bP", "\x1bX", "\x1b^", "\x1b_", "\x90", "\x9f"])
def test_bel_ends_only_an_osc(introducer: str) -> None:
    # DEC's parser keeps BEL in a DCS, SOS, PM or APC payload; xterm ends an OSC on it.
    assert sanitize_text(f"a{introducer}text\x07more") == "atextmore"
    assert sanitize_text(f"a{introducer}te\x07xt\x1b\\b") == "ab"
    assert sanitize_text("a\x9dtitle\x07more") == "amore"


# ----------------------------------------------- class 2: OSC ended by any terminator


@pytest.mark.parametrize("terminator", TERMINATORS)
@pytest.mark.parametrize("osc", ["\x1b]", "\x9d"])
def test_hyperlinks_keep_their_text_whatever_the_terminator(osc: str, terminator: str) -> None:
    link = f"{osc}8;;https://example.com/?q=hello+world{terminator}click{osc}8;;{terminator}"
    assert sanitize_text(link) == "click"
    params = f"{osc}8;k=v;https://example-a.com/?a_b=1&c=2#tit%20le{terminator}"
    assert sanitize_text(f"{params}click{osc}8;;{terminator} after") == "click after"
    mail = f"{osc}8;;mailto:no-reply@mail.com{terminator}mail-me{osc}8;;{terminator}"
    assert sanitize_text(mail) == "mail-me"


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        # chalk's strip-ansi tests.
        (
            "\x1b[0m\x1b[4m\x1b[42m\x1b[31mfoo\x1b[39m\x1b[49m\x1b[24mfoo\x1b[0m",
            "foofoo",
        ),
        ("\x1b[00;38;5;244m\x1b[m\x1b[00;38;5;33mfoo\x1b[0m", "foo"),
        ("\x1b[0;33;49;3;9;4mbar\x1b[0m", "bar"),
        ("\x1b]8;;https://github.com\x07click\x1b]8;;\x07", "click"),
        (
            "\x1b[2J\x1b[m\x1b[HABC\r\n\x1b]0;C:\\WINDOWS\\system32\\cmd.exe\x07\x1b[?25h",
            "ABC\n",
        ),
        # ansi-regex: window title and prompt colors; colon-separated SGR arguments.
        (
            "\x1b]0;sg@tota:~/git/\x07\x1b[01;32m[sg@tota\x1b[01;37m misc-tests\x1b[01;32m]$",
            "[sg@tota misc-tests]$",
        ),
        ("\x1b[38:2:68:68:68:48:2:0:0:0mX", "X"),
        ("\x1b[58:2::255:0:0mX", "X"),
        ("\x1b[38:6::255:0:0:128mX", "X"),
        # Bracketed text without ESC is text.
        ("plain [58:2::255:0:0m words", "plain [58:2::255:0:0m words"),
        ("some [0m text", "some [0m text"),
        # urxvt's font OSC.
        ("hel\x1b]710;9x15bold\x07lo", "hello"),
        # An OSC ended by the 8-bit ST inside running text.
        ("see \x1b]8;;file:///tmp/x\x9cthe file\x1b]8;;\x9c.", "see the file."),
    ],
)
def test_strip_ansi_cases(raw: str, clean: str) -> None:
    assert sanitize_text(raw) == clean


# ----------------------------------------------------- class 3: two-byte and nF escapes

#: ESC + one character: VT52 (cursor moves, identify, keypad, graphics, ANSI mode), DEC
#: (DECSC/DECRC, keypad, index, next line, RIS, single shifts, tab set) and SCO (save and
#: restore cursor). ECMA-48 §5.3: ESC Fp (0x30-0x3F), Fe (0x40-0x5F), Fs (0x60-0x7E).
TWO_BYTE = [*"ABCDHIJKSTZ=>12<su78NOMEc", "`", "d", "n", "o", "|", "}", "~", "9", "?", "F", "G"]


@pytest.mark.parametrize("final", TWO_BYTE)
def test_two_byte_escapes_leave_no_final_byte(final: str) -> None:
    assert sanitize_text(f"hel{ESC}{final}lo") == "hello"
    # ...and never take the character after them (ansi-regex's "overconsume" fixture).
    for after in AROUND:
        if final.isdigit() and after == "n":
            continue  # ESC 5 n is a status report: one sequence (ansi-regex)
        assert sanitize_text(f"{ESC}{final}{after}") == after


@pytest.mark.parametrize(
    "sequence",
    [
        # nF: charset designation, line attributes, UTF-8 mode, 7/8-bit controls.
        "\x1b(A", "\x1b)A", "\x1b(B", "\x1b)B", "\x1b(0", "\x1b)0", "\x1b*<", "\x1b+B",
        "\x1b#3", "\x1b#4", "\x1b#5", "\x1b#6", "\x1b#8", "\x1b%G", "\x1b%@", "\x1b F",
        # Status reports written without their bracket (ansi-regex fixtures).
        "\x1b5n", "\x1b0n", "\x1b3n", "\x1b6n",
        # CSI: cursor, erase, modes, SCO save/restore, DECSCUSR (an intermediate byte).
        "\x1b[176A", "\x1b[176;176H", "\x1b[176;176f", "\x1b[K", "\x1b[2J", "\x1b[?1049h",
        "\x1b[s", "\x1b[u", "\x1b[1 q", "\x1b[?1;1760c", "\x1b[2;10y", "\x1b[3;1605;606t",
        "\x1b[5~", "\x1b[0g", "\x1b[20h", "\x1b[?25l", "\x9b2J", "\x9b?25h",
        # Control strings with each terminator: DCS (tmux passthrough with a doubled
        # ESC), APC (kitty graphics), SOS, PM, OSC.
        "\x1bPtmux;\x1b\x1b]52;c;aGk=\x07\x1b\\", "\x1b_Gf=100,a=T;AAAA\x1b\\",
        "\x1bXsos payload\x1b\\", "\x1b^pm payload\x9c", "\x1b]2;title\x07",
        "\x1bP1$r0m\x1b\\", "\x90q#0;2;0;0;0#0~~@@vv\x9c",
    ],
)
def test_sequences_are_removed_whole(sequence: str) -> None:
    assert sanitize_text(f"hel{sequence}lo") == "hello"
    assert sanitize_text(f"{sequence}") == ""
    for after in AROUND:
        assert sanitize_text(sequence + after) == after


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        # A lone 7-bit introducer removes only itself: the text after it is text.
        ("a\x1b]no terminator\nnext", "ano terminator\nnext"),
        ("a\x1bPno terminator", "ano terminator"),
        ("a\x1b_no terminator", "ano terminator"),
        ("a\x1b[\nb", "a\nb"),
        ("a\x1b[12\nb", "a12\nb"),
        ("end\x1b", "end"),
        ("end\x1b[", "end"),
        ("a\x1b(\nb", "a(\nb"),
        # A string whose payload meets another ESC before its ST is unterminated.
        ("\x1b]0;title\x1b[31mred", "0;titlered"),
        # An ESC followed by a non-ASCII character or a control.
        ("a\x1bé", "aé"),
        ("a\x1b\tb", "a\tb"),
        # VT52 direct cursor address: ESC Y, then row and column as characters.
        ("\x1bY  text", "  text"),
        # DEL and C0 controls inside text.
        ("x\x7fy", "xy"),
    ],
)
def test_unterminated_and_odd_sequences(raw: str, clean: str) -> None:
    assert sanitize_text(raw) == clean


# --------------------------------------------------------------------- properties

_printable = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=12
)
_param = st.text(alphabet="0123456789;:", max_size=6)
_payload = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="\x9c"),
    max_size=10,
)
_terminator = st.sampled_from(TERMINATORS)
_sequence = st.one_of(
    st.builds(lambda p, f: f"\x1b[{p}{f}", _param, st.sampled_from("mHJKABCDfhlsuq@~")),
    st.builds(lambda p, f: f"\x9b{p}{f}", _param, st.sampled_from("mHJK")),
    st.builds(lambda i, p, t: f"{i}{p}{t}", st.sampled_from(["\x1b]", "\x9d"]), _payload,
              _terminator),
    st.builds(
        lambda i, p, t: f"{i}{p}{t}",
        st.sampled_from(["\x1bP", "\x1bX", "\x1b^", "\x1b_", "\x90", "\x98", "\x9e", "\x9f"]),
        _payload,
        st.sampled_from(["\x1b\\", "\x9c"]),
    ),
    st.builds(lambda i, f: f"\x1b{i}{f}", st.sampled_from(["(", ")", "#", "%", " "]),
              st.sampled_from("0AB8G@F")),
    # Two-byte escapes; no digit (ESC 5 n is one sequence) and no ST (ESC \).
    st.sampled_from([f"\x1b{c}" for c in "ABCDHIJKMNOSTZ=><suc`~|}{"]),
    st.sampled_from(["\x1b5n", "\x1b6n"]),
)
# Controls that are removed on their own (lone C1 string introducers included; BEL ends
# only an OSC, so it is lone after a lone DCS, SOS, PM or APC introducer).
_lone = st.sampled_from(
    ["\x00", "\x07", "\x08", "\x7f", "\x85", "\x90", "\x98", "\x9e", "\x9f"]
)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["text", "seq", "lone"]), st.data()), max_size=30))
def test_sanitizing_never_removes_printable_text(pieces: list[tuple[str, st.DataObject]]) -> None:
    raw, kept = [], []
    for kind, data in pieces:
        if kind == "text":
            piece = data.draw(_printable)
            kept.append(piece)
        else:
            piece = data.draw(_sequence if kind == "seq" else _lone)
        raw.append(piece)
    assert sanitize_text("".join(raw)) == "".join(kept)
    # The same as the bytes a command writes (C1 controls as UTF-8, C2 80 to C2 9F).
    assert sanitize("".join(raw).encode("utf-8")) == "".join(kept)


_noise = st.lists(
    st.one_of(
        _printable, _sequence, _lone, st.sampled_from(["\x1b", "\x1b[", "\x1b]", "\n", "\r",
                                                       "\r\n", "\x9c", "\x9b", "\x1b\\"])
    ),
    max_size=40,
).map("".join)


@settings(max_examples=500, deadline=None)
@given(_noise)
def test_sanitizing_is_idempotent(text: str) -> None:
    once = sanitize_text(text)
    assert sanitize_text(once) == once
    assert "\x1b" not in once
    assert not any(0x80 <= ord(c) <= 0x9F for c in once)


@settings(max_examples=300, deadline=None)
@given(_noise)
def test_sanitizing_keeps_every_line(text: str) -> None:
    assert sanitize_text(text).count("\n") == text.count("\n")


@pytest.mark.parametrize(
    "unit",
    ["\x90", "\x1b]", "\x1bP", "\x1b[1", "\x1b[", "\x1b", "\x1b ", "\x1bP\x1b\x1b", "\x9b1;",
     "\x1b]" + "a" * 50],
)
def test_linear_on_adversarial_input(unit: str) -> None:
    # Quadratic scanning would take minutes on these; linear takes well under a second.
    text = unit * (400_000 // len(unit))
    started = time.perf_counter()
    strip_escapes(text)
    assert time.perf_counter() - started < 5.0


# ------------------------------------------------------------------ native extras


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        # Trojan Source: an RLO/LRI pair that makes code read other than it runs.
        ("access_level != \"user\u202e \u2066// Check if admin\u2069 \u2066\"",
         "access_level != \"user<U+202E> <U+2066>// Check if admin<U+2069> <U+2066>\""),
        ("a\u200bb", "a<U+200B>b"),
        ("\ufeffBOM", "<U+FEFF>BOM"),
        ("x\u061cy\u200ez\u200f", "x<U+061C>y<U+200E>z<U+200F>"),
        ("\u202a\u202b\u202c\u202d", "<U+202A><U+202B><U+202C><U+202D>"),
        ("\u2060\u2066\u2067\u2068\u2069", "<U+2060><U+2066><U+2067><U+2068><U+2069>"),
        # ZWJ and ZWNJ are kept: emoji sequences need them.
        ("Family: 👨\u200d👩\u200d👧", "Family: 👨\u200d👩\u200d👧"),
        ("zw\u200cnj", "zw\u200cnj"),
        ("plain", "plain"),
    ],
)
def test_reveal_invisible(raw: str, shown: str) -> None:
    assert reveal_invisible(raw) == shown


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("50%\r100%\n", "100%\n"),
        ("downloading 1/3\rdownloading 2/3\rdownloading 3/3\rdone\n", "done\n"),
        ("progress\r\n", "progress\n"),  # a CR ending a line leaves an empty frame
        ("a\rb\r", "b"),
        ("keep\n\r\rx\r\nlast", "keep\nx\nlast"),
        ("\r\r", ""),
        ("no carriage return\n", "no carriage return\n"),
    ],
)
def test_last_frames(raw: str, shown: str) -> None:
    assert last_frames(raw) == shown


def test_cap_lines() -> None:
    text = "short\n" + "x" * 2500 + "\nmid\n" + "y" * 2001
    capped, cut = cap_lines(text, 2000)
    lines = capped.split("\n")
    assert cut == (1, 3)
    assert lines[0] == "short" and lines[2] == "mid"
    assert lines[1] == "x" * 2000 + cut_marker(500)
    assert lines[3] == "y" * 2000 + cut_marker(1)
    assert cut_marker(98_000) == "… [98,000 more characters]"
    assert cap_lines("z" * 2000, 2000) == ("z" * 2000, ())


@pytest.mark.parametrize(
    ("sample", "binary"),
    [
        (b"", False),
        (b"Hello, world!\nThis is a test file with normal text content.", False),
        (b"He\x00llo\x00\x00\x00\x00\x00", True),  # NUL bytes (Gemini's isBinary)
        (b"AB\x01\x02\x03\x04\x05CD\x06", True),  # mostly control bytes
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", True),
        (bytes(range(256)) * 4, True),
        ("// Rust\nconst R: char = '\ufffd';\nlet s = \"\ufffd\ufffd\ufffd\";\n".encode(), False),
        ("\ufffd\ufffd hello 世界 😀\n".encode(), False),
        (b"\xef\xbb\xbfHello, world!", False),  # UTF-8 BOM
        (b"\xff\xfe" + "Hello, world!".encode("utf-16-le"), False),  # UTF-16 BOM
        (b"\xfe\xff" + "Hello, world!".encode("utf-16-be"), False),
        (b"\x1b[31mred\x1b[0m\r\n\x07\x08\t\x0b\x0c" * 50, False),  # terminal output
        (b"caf\xe9 au lait, na\xefve r\xe9sum\xe9\n" * 20, False),  # Latin-1: a few bad bytes
        (b"\xff\xd8\xff\xe0" + bytes(range(128, 256)) * 8, True),  # JPEG-like, no NUL
        (b"x" * BINARY_SNIFF + b"\x00", False),  # a NUL past the sniffed bytes
        ("é".encode() * 100 + "é".encode()[:1], False),  # a character cut at the end
    ],
)
def test_looks_binary(sample: bytes, binary: bool) -> None:
    assert looks_binary(sample) is binary


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), max_size=300))
def test_text_never_looks_binary(text: str) -> None:
    assert not looks_binary(text.encode("utf-8"))
    assert not looks_binary(text.encode("utf-8")[:17])


@settings(max_examples=300, deadline=None)
@given(_noise)
def test_extras_keep_lines_and_are_idempotent(text: str) -> None:
    clean = sanitize_text(text)
    revealed = reveal_invisible(clean)
    assert reveal_invisible(revealed) == revealed
    framed = last_frames(revealed)
    assert last_frames(framed) == framed
    assert "\r" not in framed
    assert framed.count("\n") == clean.count("\n")
    capped, cut = cap_lines(framed, 5)
    assert capped.count("\n") == framed.count("\n")
    for number, line in enumerate(capped.split("\n")):
        original = framed.split("\n")[number]
        if number in cut:
            assert len(original) > 5
            assert line == original[:5] + cut_marker(len(original) - 5)
        else:
            assert line == original and len(line) <= 5
