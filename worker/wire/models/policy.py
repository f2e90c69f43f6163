"""How a dialect wants a call run and its output shaped: truncation policies, the
interception rules, `Policy`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from bashfleet.worker.wire.models.base import MAX_TIMEOUT_S, Model


class TailLines(Model):
    """Keep the end of a stream: at most `max_lines` lines and `max_bytes` bytes."""

    kind: Literal["tail_lines"] = "tail_lines"
    max_lines: int = Field(2000, ge=1)
    """Most lines shown (the `pipe` dialect: 2000)."""
    max_bytes: int = Field(50 * 1024, ge=1)
    """Most bytes of UTF-8 shown (the `pipe` dialect: 51,200)."""


class Middle(Model):
    """Past `max_bytes`, keep only the first and last `keep_bytes` (the `modes` dialect)."""

    kind: Literal["middle"] = "middle"
    max_bytes: int = Field(128 * 1024, ge=1)
    """Output up to this size is shown whole."""
    keep_bytes: int = Field(4 * 1024, ge=1)
    """Bytes kept at each end when the output is larger."""


class CharCap(Model):
    """Keep the first `max_chars` characters (the `claude` dialect: 30,000)."""

    kind: Literal["char_cap"] = "char_cap"
    max_chars: int = Field(30_000, ge=1)
    """Most characters shown."""


class ByteTail(Model):
    """Keep the last `max_bytes` bytes, never splitting a UTF-8 character (the `pi` dialect)."""

    kind: Literal["byte_tail"] = "byte_tail"
    max_bytes: int = Field(50 * 1024, ge=1)
    """Most bytes of UTF-8 shown."""


class HeadTailTokens(Model):
    """Past `max_tokens` tokens (a token is 4 bytes), keep half of those bytes from the
    head and half from the tail, at UTF-8 boundaries, with `…N tokens truncated…` between
    them (N: tokens left out) (codex)."""

    kind: Literal["head_tail_tokens"] = "head_tail_tokens"
    max_tokens: int = Field(10_000, ge=0)
    """Most tokens shown."""


Truncation = Annotated[
    TailLines | Middle | CharCap | ByteTail | HeadTailTokens, Field(discriminator="kind")
]


class InterceptRule(Model):
    """Refuse commands that another tool does better (the `pi` dialect's interceptor)."""

    pattern: str
    """Regular expression searched in the normalized command."""
    tool: str
    """The tool the agent should use instead."""
    message: str
    """Why the command is refused; shown after `Blocked: `."""


#: The `pi` dialect's default interception rules: commands a dedicated tool does better.
#: Data of the wire contract, so a dialect (client side) can put them in its policy.
DEFAULT_INTERCEPT_RULES: tuple[InterceptRule, ...] = (
    InterceptRule(
        pattern=r"^\s*(cat|head|tail|less|more)\s+[^|;&<>]+$",
        tool="read",
        message="Use the read tool to read files instead of cat/head/tail.",
    ),
    InterceptRule(
        pattern=r"^\s*(grep|rg|ag|ack)\s",
        tool="grep",
        message="Use the grep tool to search file contents instead of grep/rg.",
    ),
    InterceptRule(
        pattern=r"^\s*(find|fd)\s",
        tool="find",
        message="Use the find tool to find files instead of find/fd.",
    ),
    InterceptRule(
        pattern=r"(^|[;&|]\s*)(sed\s+(-[a-zA-Z]*i|--in-place)|perl\s+-[a-zA-Z]*i|awk\s+-i\s+inplace)",
        tool="edit",
        message="Use the edit tool to change files instead of in-place editors.",
    ),
    InterceptRule(
        pattern=r"^\s*(echo|printf|cat)\b[^|]*(>|>>)\s*[\w./~-]+\s*$|<<-?\s*['\"]?\w+['\"]?\s*>",
        tool="write",
        message="Use the write tool to create files instead of shell redirection.",
    ),
)


class Policy(Model):
    """How one dialect wants a call run and its output shaped."""

    name: str = "native"
    """Dialect name, for logs and notices."""
    streams: Literal["separate", "combined"] = "separate"
    """`separate`: stdout and stderr apart; `combined`: one stream in arrival order."""
    truncation: Truncation = Field(default_factory=TailLines)
    """How shown output is cut."""
    digest_errors: bool = False
    """List error-looking lines from the part that was cut (native dialect)."""
    default_timeout_s: float = Field(120.0, gt=0, le=MAX_TIMEOUT_S)
    """Timeout when the call gives none."""
    max_timeout_s: float = Field(MAX_TIMEOUT_S, gt=0, le=MAX_TIMEOUT_S)
    """Largest timeout a foreground call may ask for; larger ones are refused."""
    background_timeout_s: float | None = Field(None, gt=0, le=MAX_TIMEOUT_S)
    """A background job is ended (group SIGTERM, grace, SIGKILL) after this; None: never."""
    on_timeout: Literal["kill", "background"] = "background"
    """`kill`: end the process group; `background`: leave it running as a job."""
    kill_grace_s: float = Field(2.0, ge=0, le=60)
    """Seconds between SIGTERM and SIGKILL when a call is killed."""
    spill_min_bytes: int = Field(0, ge=0)
    """Keep the spill file only when output was cut and is larger than this (`pipe`: 50 KB)."""
    lift_head_tail: bool = False
    """Lift a trailing `| head -n N` / `| tail -n N` into limits (`pi`)."""
    intercept: tuple[InterceptRule, ...] = ()
    """Commands to refuse, with the tool to use instead (`pi`)."""
    available_tools: tuple[str, ...] = ()
    """Tools the agent has; an intercept rule only blocks when its tool is among them."""
    detect_binary: bool = False
    """Show a stream whose first 8 KiB look binary (a NUL byte, or mostly invalid UTF-8
    and control bytes) as a count of its bytes, not as text; its spill file is kept
    (native)."""
    reveal_invisible: bool = False
    """Show bidirectional controls and zero-width characters as `<U+202E>` markers, so the
    text a model reads is the text the bytes hold (native)."""
    last_frame: bool = False
    """A line rewritten with carriage returns (a progress bar) shows only its last frame
    (native)."""
    max_line_chars: int | None = Field(None, ge=1)
    """Lines longer than this many characters are cut to it, and the cut is counted, so
    one minified line cannot fill the output budget (native: 2000). None: no cap."""
