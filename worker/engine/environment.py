"""The child environment: clean, not the worker's. A call takes of the worker's own
environment only the few names it needs (`PATH`, `LANG` on the host's root) and those the
operator names, never its internals nor, unless allowed, a name that looks secret; over
them what its workspace says of it (who it is, its image's ENV), the hardening for
unattended runs (defaults a session's own exports and unsets win over), what the caller
or session set, and the marker.

Pure functions over mappings, so the rules are table-tested without spawning anything;
`process_environ` is the one that reads this process's own environment.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import translate
from functools import lru_cache

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
    "*PASS",
    "*_AUTH",
    "*AUTH_CONFIG*",
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

#: The worker's own workings, never passed to a call (case-insensitive shell patterns):
#: Celery's and billiard's fork settings (`_MP_FORK_LOGFORMAT_`...), the shell state of
#: whoever started the worker (`OLDPWD`, `PWD`: bash sets `PWD` to the call's cwd
#: itself; `_`), and systemd's service plumbing (`NOTIFY_SOCKET`, `LISTEN_FDS`...).
#: Not secrets: dropped, not scrubbed, so their values are never redacted from output.
WORKER_INTERNALS: tuple[str, ...] = (
    "_MP_*",
    "FORKED_BY_MULTIPROCESSING",
    "MP_MAIN_FILE",
    "MULTIPROCESSING_FORKING_DISABLE",
    "OLDPWD",
    "PWD",
    "_",
    "INVOCATION_ID",
    "JOURNAL_STREAM",
    "NOTIFY_SOCKET",
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
    "WATCHDOG_PID",
    "WATCHDOG_USEC",
    "MAINPID",
    "MANAGERPID",
    "SYSTEMD_EXEC_PID",
)

#: What a call on the host's own root takes of the worker's environment, besides what
#: the operator names: where its programs are and its language. A call on an image takes
#: none of them (its PATH is the image's, else `DEFAULT_PATH`).
HOST_INHERITED: tuple[str, ...] = ("PATH", "LANG")

#: The PATH of a call on an image whose ENV sets none, the one container engines give.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

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


@lru_cache(maxsize=64)
def _matcher(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    """One compiled regex for a set of shell patterns, matched against upper-cased names.

    Compiled once per pattern set: matching 40 variables against 27 patterns with
    fnmatch on every call cost a third of a millisecond per call.
    """
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{translate(pattern.upper())})" for pattern in patterns))


def is_secret_name(name: str, deny: Iterable[str], allow: Iterable[str]) -> bool:
    """True when `name` matches a deny pattern and no allow pattern (case-insensitive)."""
    upper = name.upper()
    allowed = _matcher(tuple(allow))
    if allowed is not None and allowed.match(upper):
        return False
    denied = _matcher(tuple(deny))
    return denied is not None and denied.match(upper) is not None


@lru_cache(maxsize=8)
def _scrub(
    items: tuple[tuple[str, str], ...], deny: tuple[str, ...], allow: tuple[str, ...]
) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...], tuple[str, ...]]:
    """Split an environment into kept items and scrubbed names and values.

    Cached: a worker's own environment does not change between calls.
    """
    kept: list[tuple[str, str]] = []
    names: list[str] = []
    values: list[str] = []
    internal = _matcher(WORKER_INTERNALS)
    for name, value in items:
        if internal is not None and internal.match(name.upper()):
            continue
        if is_secret_name(name, deny, allow):
            names.append(name)
            values.append(value)
        else:
            kept.append((name, value))
    return tuple(kept), tuple(names), tuple(values)


@lru_cache(maxsize=16)
def _inherited(
    kept: tuple[tuple[str, str], ...], inherit: tuple[str, ...], passed: tuple[str, ...]
) -> tuple[tuple[str, str], ...]:
    """What a call takes of the kept (neither internal nor secret) worker variables: the
    names in `inherit` (exactly) and those matching a `passed` pattern (ignoring case).

    Cached: a worker's own environment does not change between calls.
    """
    named = _matcher(passed)
    return tuple((name, value) for name, value in kept
                 if name in inherit or (named is not None and named.match(name.upper())))


def build_env(
    base: Mapping[str, str],
    *,
    marker: str,
    inherit: Iterable[str] = HOST_INHERITED,
    passed: Iterable[str] = (),
    own: Mapping[str, str] | None = None,
    extra: Mapping[str, str] | None = None,
    unset: Iterable[str] = (),
    deny: Iterable[str] = DEFAULT_DENY,
    allow: Iterable[str] = DEFAULT_ALLOW,
) -> ChildEnv:
    """A call's environment, from nothing: of the worker's environment `base`, the names
    in `inherit` and those matching a `passed` pattern (the operator's), minus the
    worker's internals and the names a `deny` pattern scrubs (unless an `allow` pattern
    keeps them); then `own` (what the workspace says: who the call is, its image's ENV),
    the hardening over it, `extra` (the session's exported variables, the call's own),
    minus `unset` (what the session unset), and the marker.

    `scrubbed_values` are those of every scrubbed variable of `base`, passed or not: the
    values output is redacted of. The hardening is a default for unattended runs: a
    session that exported `PAGER=less` or ran `unset PAGER` keeps that on its later
    calls, as a shell would. `extra` is what the caller asked for explicitly, so it is not
    scrubbed. The marker is set last: nothing overrides it (kill sweeps find a call's
    processes by it).
    """
    kept, names, values = _scrub(tuple(base.items()), tuple(deny), tuple(allow))
    env = dict(_inherited(kept, tuple(inherit), tuple(passed)))
    env.update(own or {})
    env.update(HARDENING)
    env.update(extra or {})
    for name in unset:
        env.pop(name, None)
    env[MARKER_VAR] = marker
    return ChildEnv(env=env, scrubbed_names=names, scrubbed_values=values)


#: The last snapshot of os.environ: its raw bytes (to see a change) and decoded copy.
_environ_snapshot: dict[str, tuple[dict[bytes, bytes], dict[str, str]]] = {}


def process_environ() -> Mapping[str, str]:
    """This process's environment (os.environ) as a read-only snapshot.

    Reading os.environ decodes every name and value in Python, tens of microseconds on
    every call; the snapshot is decoded again only when os.environ changed, which one
    C-level comparison of its raw bytes tells.
    """
    # CPython keeps os.environ's raw bytes in `_data`; elsewhere, no shortcut.
    raw = getattr(os.environ, "_data", None)
    if not isinstance(raw, dict):
        return dict(os.environ)
    cached = _environ_snapshot.get("environ")
    if cached is not None and cached[0] == raw:
        return cached[1]
    copied = dict(raw)  # decode this copy: os.environ may change meanwhile
    decoded = {
        os.environ.decodekey(name): os.environ.decodevalue(value)
        for name, value in copied.items()
    }
    _environ_snapshot["environ"] = (copied, decoded)  # one tuple, replaced whole
    return decoded
