"""Pi's input handling: lift trailing head/tail into limits, intercept misuses.

Pure functions: the engine calls them when a policy asks (`lift_head_tail`,
`intercept`), and the pi dialect shows their effect to the model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from bashfleet.worker.wire.models import DEFAULT_INTERCEPT_RULES, InterceptRule

__all__ = [
    "DEFAULT_INTERCEPT_RULES",
    "Normalized",
    "blocked_message",
    "check_interception",
    "merge_limits",
    "normalize_command",
]

# `| head -n N`, `| head -N`, `| head -n=N`... at the very end of the command. The bar
# must be a pipe: not half of `||` (run head only when the command fails) and not an
# escaped `\|` (a literal bar).
_TRAILING = re.compile(r"(?<![|\\])\|(?!\|)\s*(head|tail)\s+(?:-n\s*=?\s*|-)(\d+)\s*$")


@dataclass(frozen=True)
class Normalized:
    """A command with its trailing head/tail pipes lifted out."""

    command: str
    head: int | None = None
    tail: int | None = None


def normalize_command(command: str) -> Normalized:
    """Trim the command and lift a trailing `| head -n N` and/or `| tail -n N`.

    Only forms whose meaning the lifted limits keep are lifted: `... | tail -n N`,
    `... | head -n N`, and `... | head -n N | tail -n M` (limits apply head, then
    tail). A pipe left with nothing before it is not lifted. Internal whitespace is kept.
    """
    text = command.strip()
    head: int | None = None
    tail: int | None = None
    match = _TRAILING.search(text)
    if match is None or not text[: match.start()].strip():
        return Normalized(text)
    kind, count = match.group(1), int(match.group(2))
    text = text[: match.start()].rstrip()
    if kind == "head":
        return Normalized(text, head=count)
    tail = count
    before = _TRAILING.search(text)
    if before is not None and before.group(1) == "head" and text[: before.start()].strip():
        head = int(before.group(2))
        text = text[: before.start()].rstrip()
    return Normalized(text, head=head, tail=tail)


def merge_limits(
    normalized: Normalized, head: int | None, tail: int | None
) -> tuple[int | None, int | None]:
    """Explicit head/tail arguments win; lifted values are the fallback."""
    return (
        head if head is not None else normalized.head,
        tail if tail is not None else normalized.tail,
    )


def check_interception(
    command: str, rules: Iterable[InterceptRule], available_tools: Iterable[str]
) -> InterceptRule | None:
    """The first rule that blocks `command`, or None.

    A rule blocks only when its pattern matches and the tool it suggests is one the
    agent has. Rules with an invalid regular expression are skipped, as pi skips them.
    """
    tools = set(available_tools)
    for rule in rules:
        if rule.tool not in tools:
            continue
        try:
            pattern = re.compile(rule.pattern)
        except re.error:
            continue
        if pattern.search(command):
            return rule
    return None


def blocked_message(rule: InterceptRule, command: str) -> str:
    """The text of a blocked call: `Blocked: ...` with the original command."""
    return f"Blocked: {rule.message}\n\nOriginal command: {command}"
