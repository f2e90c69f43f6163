"""The child environment: secrets scrubbed, hardened for unattended runs, marked.

Pure functions over mappings, so the rules are table-tested without spawning anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

#: Variable that every process of a call inherits; its value is the call's marker.
#: Kill sweeps find escaped processes (setsid, double fork) by it.
MARKER_VAR = "BASHFLEET_CALL_MARKER"

#: Names scrubbed by default (case-insensitive shell patterns).
DEFAULT_DENY: tuple[str, ...] = (
    "*KEY*",
    "*SECRET*",
    "*TOKEN*",
    "*PASSWORD*",
    "*PASSWD*",
    "*PASSPHRASE*",
    "*CREDENTIAL*",
    "*PRIVATE*",
    "*SESSION_ID*",
    "*DSN*",
    "*DATABASE_URL*",
    "AWS_*",
    "AZURE_*",
    "GCP_*",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GH_*",
    "GITHUB_*",
    "DIGITALOCEAN_*",
    "HEROKU_*",
    "OPENAI_*",
    "ANTHROPIC_*",
    "BASHFLEET_*",
    "CELERY_*",
    "BROKER_URL",
    "*BROKER_URL*",
    "*REDIS_URL*",
    "FLOWER_*",
)

#: Names kept even when a deny pattern matches (none by default; settings add some).
DEFAULT_ALLOW: tuple[str, ...] = ()

#: Set for every call so that tools never wait for a person.
HARDENING: Mapping[str, str] = {
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "MANPAGER": "cat",
    "GIT_EDITOR": "true",
    "EDITOR": "true",
    "VISUAL": "true",
    "GIT_TERMINAL_PROMPT": "0",
    "CI": "1",
    "DEBIAN_FRONTEND": "noninteractive",
    "TERM": "dumb",
    "NO_COLOR": "1",
    "PYTHONUNBUFFERED": "1",
    "PIP_NO_INPUT": "1",
}


@dataclass(frozen=True)
class ChildEnv:
    """The environment to spawn with, and the values that were scrubbed from it."""

    env: dict[str, str]
    scrubbed_names: tuple[str, ...]
    scrubbed_values: tuple[str, ...]


def is_secret_name(name: str, deny: Iterable[str], allow: Iterable[str]) -> bool:
    """True when `name` matches a deny pattern and no allow pattern (case-insensitive)."""
    upper = name.upper()
    if any(fnmatchcase(upper, pattern.upper()) for pattern in allow):
        return False
    return any(fnmatchcase(upper, pattern.upper()) for pattern in deny)


def build_env(
    base: Mapping[str, str],
    *,
    marker: str,
    extra: Mapping[str, str] | None = None,
    deny: Iterable[str] = DEFAULT_DENY,
    allow: Iterable[str] = DEFAULT_ALLOW,
) -> ChildEnv:
    """Scrub `base`, apply the hardening, add `extra` (session variables), then the marker.

    `extra` is what the caller asked for explicitly, so it is not scrubbed; the
    hardening and the marker cannot be overridden by it.
    """
    deny, allow = tuple(deny), tuple(allow)
    env: dict[str, str] = {}
    names: list[str] = []
    values: list[str] = []
    for name, value in base.items():
        if is_secret_name(name, deny, allow):
            names.append(name)
            values.append(value)
        else:
            env[name] = value
    env.update(extra or {})
    env.update(HARDENING)
    env[MARKER_VAR] = marker
    return ChildEnv(env=env, scrubbed_names=tuple(names), scrubbed_values=tuple(values))
