"""Secrets planted in the worker's environment and in files; commands try to print them.

The figure that matters: how many leak (a secret value appearing in shown output, in a
check of a background job, or in an output slice). It must be zero. The secret files lie
in the call's own workspace, readable by the run user, so only the engine stands between
them and the output: a file a setting names as secret is hidden from the call (and its
values redacted). Transformed secrets (base64, `sed 's/./&./g'`) are the trust
boundary's to refuse (test_trust_boundary), not redaction's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bashfleet.worker import check_job, load_record
from bashfleet.worker.engine.output.capture import read_slice
from bashfleet.worker.engine.output.sanitize import REDACTED
from bashfleet.worker.engine.secrets import redaction_pattern

from .engine_helpers import (
    Engine,
    Janitor,
    _janitor_fixture,  # noqa: F401 - fixture
    engine_with,
    wait_until,
)

ENV_SECRETS = {
    "MY_API_TOKEN": "tok-7f3a9c1e5b2d4f60",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "DATABASE_URL": "postgres://app:db-Pa55-w0rd-91@db.internal:5432/app",
    "BASHFLEET_REDIS_URL": "redis://:r3dis-s3cret-pw@127.0.0.1:6379/0",
    "GITHUB_TOKEN": "ghp_1234567890abcdefABCDEF1234567890ab",
}
URL_PASSWORDS = ["db-Pa55-w0rd-91", "r3dis-s3cret-pw"]
FILE_SECRETS = ["netrc-pass-44f1c0de", "envfile-secret-0b9e7a"]

ATTEMPTS = [
    "env",
    "printenv",
    "cat /proc/$PPID/environ | tr '\\0' '\\n'",
    "cat /proc/$PPID/environ",
    "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f 2>/dev/null; done | sort -u",
    "echo $MY_API_TOKEN $AWS_SECRET_ACCESS_KEY $GITHUB_TOKEN",
    "cat {files}",
    "grep -h -o 'pass.*' {files}",
    "echo '{url_secret_printed}'",
    "echo '{url_password_printed}' >&2",
    "python3 -c 'import os; print(open(\"/proc/%d/environ\" % os.getppid()).read())'",
]


#: A file beside the secret ones, not named secret: the calls do see that directory.
CONTROL = "control-file-text-5e1d"


@pytest.fixture
def planted(
    tmp_path: Path, janitor: Janitor, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Engine, list[str]]]:
    for name, value in ENV_SECRETS.items():
        monkeypatch.setenv(name, value)
    work = tmp_path / "work"  # the engine's work directory: the calls' workspace
    work.mkdir()
    netrc = work / "netrc"
    netrc.write_text(f"machine git.internal login ci password {FILE_SECRETS[0]}\n")
    env_file = work / "worker.env"
    env_file.write_text(f"# deploy secrets\nDEPLOY_SECRET={FILE_SECRETS[1]}\n")
    (work / "control.txt").write_text(f"{CONTROL}\n")
    for path in (netrc, env_file):
        path.chmod(0o644)  # the run user could read them: only the engine hides them
    with engine_with(tmp_path, janitor, secret_files=(str(netrc), str(env_file))) as engine:
        assert engine.tmp == work
        yield engine, [str(netrc), str(env_file)]


def _commands(files: list[str]) -> list[str]:
    return [
        attempt.format(
            files=" ".join(files),
            url_secret_printed=ENV_SECRETS["DATABASE_URL"],
            url_password_printed=URL_PASSWORDS[1],
        )
        for attempt in ATTEMPTS
    ]


def _leaks(text: str) -> list[str]:
    secrets = [*ENV_SECRETS.values(), *URL_PASSWORDS, *FILE_SECRETS]
    return [secret for secret in secrets if secret in text]


def test_no_planted_secret_leaks(
    planted: tuple[Engine, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    engine, files = planted
    settings = engine.settings
    control = engine.run(f"cat {engine.tmp}/control.txt")
    assert control.stdout == f"{CONTROL}\n", "the secret files' directory is in view"
    leaked: list[tuple[str, str]] = []
    shown = 0
    for command in _commands(files):
        result = engine.run(command)
        text = result.stdout + result.stderr
        shown += len(text)
        leaked += [(command, secret) for secret in _leaks(text)]
        # The same output fetched later (spill slices) is redacted too.
        pattern = redaction_pattern(settings, ENV_SECRETS.values())
        for path in (result.spill.stdout_path, result.spill.stderr_path) if result.spill else ():
            if path:
                sliced, _, _ = read_slice(Path(path), 0, 1 << 20, pattern)
                leaked += [(command, secret) for secret in _leaks(sliced)]
    # A background job printing them (its environment is scrubbed and the files hidden:
    # the command spells each value out, one a line), checked later.
    printed = "env; printf '%s\\n' " + " ".join(f"'{v}'" for v in ENV_SECRETS.values())
    job = engine.run(printed, background=True)
    assert job.job is not None
    record = load_record(job.job.id, settings)
    wait_until(lambda: not check_job(record, settings=settings).running, what="the job's end")
    final = check_job(record, offset=0, settings=settings)
    redacted = final.output.count(REDACTED)
    leaked += [("background env", secret) for secret in _leaks(final.output)]
    with capsys.disabled():
        print(f"\nsecret leaks: {len(leaked)} of {len(ATTEMPTS) + 1} attempts "
              f"({shown} characters shown)")
    assert shown > 0
    # The secrets were there and were redacted. (This once passed on CA bundle paths
    # from `env`, blanked by the `AWS_*` rule, not on secrets.)
    assert redacted >= len(ENV_SECRETS)
    assert leaked == []
