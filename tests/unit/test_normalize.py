"""bashfleet.worker.engine.output.normalize:
the pi dialect's head/tail lifting, limit merging and interception."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bashfleet.worker.engine.output.normalize import (
    DEFAULT_INTERCEPT_RULES,
    Normalized,
    blocked_message,
    check_interception,
    merge_limits,
    normalize_command,
)
from bashfleet.worker.wire.models import InterceptRule

# ------------------------------------------------------------------ normalization


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("cmd | head -n 5", Normalized("cmd", head=5)),
        ("cmd | head -5", Normalized("cmd", head=5)),
        ("cmd | head -n5", Normalized("cmd", head=5)),
        ("cmd|head -n 5", Normalized("cmd", head=5)),
        ("cmd | tail -n 3", Normalized("cmd", tail=3)),
        ("cmd | tail -3", Normalized("cmd", tail=3)),
        ("  cmd | tail -n 3  \n", Normalized("cmd", tail=3)),
        # head then tail: both lifted (limits apply head first, then tail).
        ("cmd | head -n 100 | tail -n 5", Normalized("cmd", head=100, tail=5)),
        # tail then head: lifting the tail too would change the meaning.
        ("cmd | tail -n 5 | head -n 2", Normalized("cmd | tail -n 5", head=2)),
        ("cmd | tail -n 5 | tail -n 2", Normalized("cmd | tail -n 5", tail=2)),
        # A pipe with nothing before it is not lifted.
        ("| head -n 5", Normalized("| head -n 5")),
        ("  | tail -3", Normalized("| tail -3")),
        # Internal whitespace is kept; only the ends are trimmed.
        (
            "  echo  'a   b'\t|  grep   x | head -n 5",
            Normalized("echo  'a   b'\t|  grep   x", head=5),
        ),
        ("printf 'a\\n  b'  ", Normalized("printf 'a\\n  b'")),
        # Not a trailing head/tail: unchanged.
        ("cmd | head -n 5 file", Normalized("cmd | head -n 5 file")),
        ("cmd | head -c 5", Normalized("cmd | head -c 5")),
        ("cmd | tail -n +5", Normalized("cmd | tail -n +5")),
        ("cmd | tail -f", Normalized("cmd | tail -f")),
        ("head -n 5 file", Normalized("head -n 5 file")),
        ("cmd | header -n 5", Normalized("cmd | header -n 5")),
        # `||` runs head only when cmd fails: not a pipe into head.
        ("make || head -n 5", Normalized("make || head -n 5")),
        ("make || tail -n 5 log", Normalized("make || tail -n 5 log")),
        # An escaped bar is a literal character.
        ("echo a \\| head -n 5", Normalized("echo a \\| head -n 5")),
        ("", Normalized("")),
    ],
)
def test_normalize_command(command: str, expected: Normalized) -> None:
    assert normalize_command(command) == expected


@pytest.mark.parametrize(
    ("lifted", "head", "tail", "merged"),
    [
        (Normalized("c", head=5), None, None, (5, None)),
        (Normalized("c", head=5), 7, None, (7, None)),  # explicit arg wins
        (Normalized("c", tail=3), None, 9, (None, 9)),
        (Normalized("c", head=1, tail=2), 10, 20, (10, 20)),
        (Normalized("c", head=1, tail=2), None, 20, (1, 20)),
        (Normalized("c"), 4, None, (4, None)),
        (Normalized("c"), None, None, (None, None)),
        (Normalized("c", head=5), 0, None, (0, None)),  # 0 is explicit, not missing
    ],
)
def test_merge_limits(
    lifted: Normalized, head: int | None, tail: int | None, merged: tuple[int | None, int | None]
) -> None:
    assert merge_limits(lifted, head, tail) == merged


_words = st.text(alphabet="abcxyz -_./'\"=$", min_size=1, max_size=20).filter(
    lambda s: s.strip() != ""
)


@settings(max_examples=300, deadline=None)
@given(_words, st.sampled_from(["head", "tail"]), st.integers(0, 10**6),
       st.sampled_from(["-n ", "-n", "-"]), st.sampled_from([" | ", "|", "  |  "]))
def test_lifting_recovers_the_limit(
    base: str, kind: str, count: int, flag: str, bar: str
) -> None:
    normalized = normalize_command(f"{base}{bar}{kind} {flag}{count}")
    assert normalized.command == base.strip()
    assert (normalized.head if kind == "head" else normalized.tail) == count
    assert (normalized.tail if kind == "head" else normalized.head) is None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_normalize_is_stable_and_only_shortens(command: str) -> None:
    normalized = normalize_command(command)
    assert command.strip().startswith(normalized.command)
    assert normalized.command == normalized.command.strip()
    if normalized.head is None and normalized.tail is None:
        assert normalized.command == command.strip()


# -------------------------------------------------------------------- interception

_RULE = InterceptRule(pattern=r"^\s*cat\s", tool="read", message="Use read.")


def test_interception_blocks_only_when_the_tool_is_available() -> None:
    assert check_interception("cat x", [_RULE], ["read", "bash"]) == _RULE
    assert check_interception("cat x", [_RULE], ["bash"]) is None
    assert check_interception("cat x", [_RULE], []) is None
    assert check_interception("ls x", [_RULE], ["read"]) is None


def test_interception_skips_invalid_regex_rules() -> None:
    broken = InterceptRule(pattern="cat(", tool="read", message="broken")
    assert check_interception("cat x", [broken], ["read"]) is None
    assert check_interception("cat x", [broken, _RULE], ["read"]) == _RULE


def test_interception_returns_the_first_matching_rule() -> None:
    other = InterceptRule(pattern="cat", tool="read", message="second")
    assert check_interception("cat x", [_RULE, other], ["read"]) == _RULE
    assert check_interception("cat x", [other, _RULE], ["read"]) == other


def test_interception_accepts_iterators() -> None:
    assert check_interception("cat x", iter([_RULE]), iter(["read"])) == _RULE


def test_blocked_message_includes_the_command() -> None:
    text = blocked_message(_RULE, "cat /etc/hosts")
    assert text.startswith("Blocked: Use read.")
    assert "cat /etc/hosts" in text


_ALL_TOOLS = ["read", "grep", "find", "edit", "write"]


@pytest.mark.parametrize(
    ("command", "tool"),
    [
        ("cat README.md", "read"),
        ("head -n 20 src/main.py", "read"),
        ("tail log.txt", "read"),
        ("less file", "read"),
        ("grep -rn TODO src", "grep"),
        ("rg pattern", "grep"),
        ("find . -name '*.py'", "find"),
        ("fd foo", "find"),
        ("sed -i 's/a/b/' file", "edit"),
        ("sed -i.bak 's/a/b/' file", "edit"),
        ("sed --in-place 's/a/b/' f", "edit"),
        ("git add . && sed -i 's/a/b/' f", "edit"),
        ("perl -pi -e 's/a/b/' f", "edit"),
        ("awk -i inplace '{print}' f", "edit"),
        ("echo hello > out.txt", "write"),
        ("printf 'x' >> notes.md", "write"),
        ("cat <<EOF > file.txt", "write"),
        # Allowed: pipelines, other commands, non-in-place sed.
        ("cat file | wc -l", None),
        ("ls -la", None),
        ("make test", None),
        ("sed -n 5p file", None),
        ("sed 's/a/b/' file", None),
        ("echo hello", None),
        ("git commit -m 'use sed -i'", None),
        ("pytest -q", None),
    ],
)
def test_default_rules(command: str, tool: str | None) -> None:
    rule = check_interception(command, DEFAULT_INTERCEPT_RULES, _ALL_TOOLS)
    assert (rule.tool if rule else None) == tool
    # Without the suggested tools, nothing is ever blocked.
    assert check_interception(command, DEFAULT_INTERCEPT_RULES, ["bash"]) is None


def test_default_rules_compile() -> None:
    for rule in DEFAULT_INTERCEPT_RULES:
        re.compile(rule.pattern)
        assert rule.tool in _ALL_TOOLS
        assert rule.message
