"""Secrets planted in the worker's environment and in files; commands try to print them.

The figure the issue asks for: how many leak (a secret value appearing in shown output,
in a check of a background job, or in an output slice). It must be zero. Printing a
secret transformed (base64, split across lines) is out of reach of redaction: commands
run as the worker's user and can read what it reads; that is documented, not tested.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from worker import Call, Settings, check_job, load_record, run_call
from worker.engine.capture import read_slice
from worker.engine.sanitize import REDACTED
from worker.engine.secrets import redaction_pattern

from .engine_helpers import wait_until

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


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Settings, list[str]]:
    for name, value in ENV_SECRETS.items():
        monkeypatch.setenv(name, value)
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine git.internal login ci password {FILE_SECRETS[0]}\n")
    env_file = tmp_path / "worker.env"
    env_file.write_text(f"# deploy secrets\nDEPLOY_SECRET={FILE_SECRETS[1]}\n")
    for path in (netrc, env_file):
        path.chmod(0o600)
    settings = Settings(
        state_dir=tmp_path / "state", host="leaks",
        secret_files=(str(netrc), str(env_file)),
    )
    return settings, [str(netrc), str(env_file)]


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
    planted: tuple[Settings, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    settings, files = planted
    leaked: list[tuple[str, str]] = []
    shown = 0
    for index, command in enumerate(_commands(files)):
        result = run_call(Call(call_id=f"leak-{index}", command=command), settings=settings)
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
    job = run_call(Call(call_id="leak-job", command=printed, background=True),
                   settings=settings)
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
    # The secrets were there and were redacted. (Before #22 point 21 this passed on CA
    # bundle paths from `env`, blanked by the `AWS_*` rule, not on secrets.)
    assert redacted >= len(ENV_SECRETS)
    assert leaked == []
