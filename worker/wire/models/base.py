"""What every wire model stands on: the base `Model`, the limits and patterns several
concerns share, tags, network policies as asked and as kept, isolation levels and stdin
kinds."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict

from bashfleet.worker.wire import names
from bashfleet.worker.wire.network import NetworkPolicy, parse

#: Largest command accepted, in bytes of UTF-8. The `modes` dialect asks agents for
#: < 60k tokens; 1 MiB leaves room for heredocs while keeping messages small on Redis.
MAX_COMMAND_BYTES = 1024 * 1024

#: Longest working directory path accepted (Linux's PATH_MAX).
MAX_PATH_CHARS = 4096

#: Longest timeout any call may ask for: the `modes` dialect's background mode runs 24 hours.
MAX_TIMEOUT_S = 24 * 60 * 60.0

#: A workspace id (the names' pattern).
WORKSPACE_ID_PATTERN = names.WORKSPACE_ID_PATTERN
#: A snapshot's id (`bashfleet.worker.engine.snapshots.snapshot_store.new_id`).
SNAPSHOT_ID_PATTERN = r"^s[0-9a-f]{15}$"

#: What an owner may be (the names' pattern, which a client checks without the models).
OWNER_PATTERN = names.OWNER_PATTERN

#: Variables that make bash, or the loader under it, run code of their own: a call may
#: not set them (nor a session carry them), whoever sent it.
CODE_VARIABLES = frozenset(
    {"BASH_ENV", "ENV", "PROMPT_COMMAND", "SHELLOPTS", "BASHOPTS", "IFS", "PS4"}
)
#: Prefixes of such variables: exported functions and the dynamic loader's settings.
CODE_VARIABLE_PREFIXES = ("BASH_FUNC_", "LD_")


def runs_code(name: str) -> bool:
    """True for a variable a call may not set: BASH_ENV, ENV, BASH_FUNC_*, LD_*,
    PROMPT_COMMAND, SHELLOPTS, BASHOPTS, IFS, PS4."""
    return name in CODE_VARIABLES or name.startswith(CODE_VARIABLE_PREFIXES)


#: Most tags a call or job carries; the longest tag name and value.
MAX_TAGS = 16
MAX_TAG_NAME_CHARS = 64
MAX_TAG_VALUE_CHARS = 256
_TAG_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


def _tags_are_sane(tags: dict[str, str]) -> dict[str, str]:
    """Tags an orchestrator gives a job (`{"agent": "a17"}`): few, short, one line each,
    names that a `--tag NAME=VALUE` filter can spell."""
    if len(tags) > MAX_TAGS:
        raise ValueError(f"at most {MAX_TAGS} tags, not {len(tags)}")
    for name, value in tags.items():
        if not name or len(name) > MAX_TAG_NAME_CHARS or not set(name) <= _TAG_NAME_CHARS:
            raise ValueError(
                f"invalid tag name {name!r}: use 1-{MAX_TAG_NAME_CHARS} letters, digits, "
                "'.', '_' or '-'"
            )
        if len(value) > MAX_TAG_VALUE_CHARS or any(c in value for c in "\x00\n\r"):
            raise ValueError(
                f"invalid value of tag {name!r}: one line of at most {MAX_TAG_VALUE_CHARS} "
                "characters"
            )
    return tags


Tags = Annotated[dict[str, str], AfterValidator(_tags_are_sane)]
"""Tags of a call and of the job it starts: name -> value."""

AskedNetwork = Annotated[NetworkPolicy | None, BeforeValidator(parse)]
"""A network policy a caller asks for (`bashfleet.worker.wire.network`): a policy, its spelling
(`none`, `egress`, `host`, `allow=a.com,10.1.0.0/16`) or an older caller's bool (False:
`none`, True: the host's default). None: the host's default."""
KeptNetwork = Annotated[NetworkPolicy, BeforeValidator(
    lambda value: parse(value, legacy_true="host"))]
"""A workspace's network policy as its host keeps it (an older record's True: it shared
the host's namespace)."""


class Model(BaseModel):
    """Base of every wire model: strict about unknown fields, immutable once built.

    A model's validators and serializers are built at its first use, not at import
    (`defer_build`): a process builds those of the models it uses (a CLI's `run` a few
    of the hundred), and importing the wire costs a third of what it would."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


Isolation = Literal["none", "process", "strict"]
"""How a call is sandboxed, weakest first. `none`: plain `bash -c`; `process`: its own
PID namespace and /proc, the worker's state and secrets hidden; `strict`: also a
read-only root with writable workspace paths, a private /tmp and no network."""

Stdin = Literal["null", "closed", "pipe", "pty"]
"""A call's standard input. `null`: /dev/null, the call runs to its end or timeout as
always. The others make it an interactive session (a job of its own supervisor, whose
output is read as it comes): `closed`: stdin is /dev/null but the process keeps running
past the call's wait (codex `tty: false`); `pipe`: a pipe the fleet writes to
(`write_stdin`); `pty`: a pseudo-terminal, its controlling terminal, stdout and stderr in
one stream (Ctrl-C, window size, prompts that read /dev/tty)."""
