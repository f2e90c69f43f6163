"""Which values are secrets, so that output showing them is redacted.

Three sources: the values of variables scrubbed from the child environment, the
password inside any of those that is a URL (a command may print it alone), and the
files an operator names in `BASHFLEET_SECRET_FILES` (an env file, a .netrc, ...),
whose `KEY=VALUE` values and the words after password/token/secret/key are taken.
The worker's own secrets (its keys, its Redis password) are known to be secrets.

The first and the third are guesses by name, and a name rule such as `AWS_*` takes
settings too: `AWS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt`, a logging level
`WARNING`. Redacting those blanked ordinary output (every `WARNING` of a pytest run),
so a guessed value is redacted only when it can be a secret: long enough, not shaped as
a setting (`sanitize.may_be_secret`: a word, a version, a region) and not the path of a
file anyone on the host may read.
"""

from __future__ import annotations

import base64
import os
import re
import stat
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

from bashfleet.worker.engine.environment import build_env, process_environ
from bashfleet.worker.engine.output.sanitize import may_be_secret, secret_pattern, worth_redacting
from bashfleet.worker.settings import Settings

_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?[A-Za-z_][A-Za-z0-9_.-]*\s*[=:]\s*(.+?)\s*$")
_AFTER_KEYWORD = re.compile(
    r"(?:password|passwd|token|secret|apikey|api_key|key)\s*[=: ]\s*(\S+)", re.IGNORECASE
)


def url_password(value: str) -> str | None:
    """The password of a URL such as redis://:pw@host/0, or None."""
    if "://" not in value or "@" not in value:
        return None
    try:
        password = urlsplit(value.strip()).password
    except ValueError:
        return None
    return unquote(password) if password else None


def values_in_text(text: str) -> tuple[str, ...]:
    """Secret-looking values in a file's text: assignments' values, words after keywords."""
    found: list[str] = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        assigned = _ASSIGNMENT.match(line)
        if assigned:
            found.append(assigned.group(1).strip("'\""))
        found.extend(match.strip("'\"") for match in _AFTER_KEYWORD.findall(line))
    with_passwords = found + [pw for v in found if (pw := url_password(v))]
    return guessed_secrets(with_passwords)


#: An absolute path as a setting holds one: no whitespace, no URL.
_PATH = re.compile(r"/[^\s:]*")


@lru_cache(maxsize=256)
def is_public_path(value: str) -> bool:
    """True when `value` is the absolute path of a file or directory every user of this
    host may read (`/etc/ssl/certs/ca-certificates.crt`): printing it reveals nothing.
    Cached: a worker's scrubbed values are the same on every call."""
    if _PATH.fullmatch(value) is None:
        return False
    try:
        mode = os.stat(value).st_mode
    except (OSError, ValueError):
        return False
    return bool(mode & stat.S_IROTH)


def guessed_secrets(values: Iterable[str]) -> tuple[str, ...]:
    """The values, found by a name rule, that can be secrets (see the module's doc)."""
    return tuple(dict.fromkeys(
        v for v in values if may_be_secret(v) and not is_public_path(v.strip())
    ))


@lru_cache(maxsize=64)
def _file_values(path: str, mtime_ns: int, size: int) -> tuple[str, ...]:
    del mtime_ns, size  # the cache key: a changed file is read again
    try:
        return values_in_text(Path(path).read_text("utf-8", errors="replace"))
    except OSError:
        return ()


def file_secrets(paths: Iterable[str]) -> tuple[str, ...]:
    """Secret values in the operator's secret files (missing files are skipped)."""
    values: list[str] = []
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            continue
        values.extend(_file_values(path, info.st_mtime_ns, info.st_size))
    return tuple(values)


def encoded_forms(value: str) -> tuple[str, ...]:
    """`value` as a command could print it to get it past a literal redaction: itself,
    reversed, in hex, and in base64 at each of the three alignments a byte stream can
    put it at (the characters that depend on the value's bytes alone)."""
    raw = value.encode("utf-8", "surrogatepass")
    forms = [value, value[::-1], raw.hex()]
    for align in range(3):
        encoded = base64.b64encode(bytes(align) + raw).decode("ascii")
        # Skip the characters the padding bytes reach into, and the last group, which
        # the bytes after the value change.
        forms.append(encoded[(align * 4 + 2) // 3 + 1 : -4])
    return tuple(form for form in forms if form)


def own_secrets(settings: Settings) -> tuple[str, ...]:
    """The worker's own secrets (its keys, its Redis password) and their encodings.

    They are never in a call's environment nor readable in its sandbox; redacting them
    too is defence in depth, should a command reach them anyway (a host run with
    isolation `none`)."""
    values = list(settings.secrets().values())
    values += [pw for value in values if (pw := url_password(value))]
    keys = [part.strip() for value in values for part in value.split(",")]
    return tuple(form for value in keys if worth_redacting(value)
                 for form in encoded_forms(value))


def redaction_pattern(
    settings: Settings, scrubbed_values: Iterable[str]
) -> re.Pattern[str] | None:
    """One pattern for every secret value a call's output must not show."""
    scrubbed = tuple(scrubbed_values)
    passwords = tuple(pw for value in scrubbed if (pw := url_password(value)))
    return secret_pattern(
        guessed_secrets(scrubbed + passwords) + file_secrets(settings.secret_files)
        + own_secrets(settings)
    )


def worker_redaction(settings: Settings) -> re.Pattern[str] | None:
    """The redaction pattern for output read back later (checks, output slices): the
    same secrets a call's own output is redacted of, from this worker's environment."""
    child = build_env(
        process_environ(), marker="", deny=settings.secret_deny, allow=settings.secret_allow
    )
    return redaction_pattern(settings, child.scrubbed_values)
