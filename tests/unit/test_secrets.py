"""bashfleet.worker.engine.secrets: URL passwords and secret files feed redaction."""

from __future__ import annotations

from pathlib import Path

import pytest

from bashfleet.worker.engine.output.sanitize import REDACTED, redact
from bashfleet.worker.engine.secrets import (
    file_secrets,
    guessed_secrets,
    is_public_path,
    redaction_pattern,
    url_password,
    values_in_text,
    worker_redaction,
)
from bashfleet.worker.settings import Settings


@pytest.mark.parametrize(
    ("value", "password"),
    [
        ("redis://:s3cret-pw@127.0.0.1:6379/0", "s3cret-pw"),
        ("postgres://app:p%40ss-word@db/app", "p@ss-word"),
        ("rediss://user:tls-pw-123@host:6380", "tls-pw-123"),
        ("redis://127.0.0.1:6379/0", None),
        ("not a url", None),
        ("http://[::1", None),
    ],
)
def test_url_password(value: str, password: str | None) -> None:
    assert url_password(value) == password


def test_values_in_text_reads_assignments_and_keywords() -> None:
    text = (
        "# comment PASSWORD=ignored-comment-value\n"
        "export API_TOKEN='abc123def456'\n"
        "DB_URL=postgres://u:db-pass-777@h/d\n"
        "machine x login y password netrc-pass-1234\n"
        "DEBUG=true\n"
    )
    found = set(values_in_text(text))
    assert {"abc123def456", "db-pass-777", "netrc-pass-1234"} <= found
    assert "true" not in found and "ignored-comment-value" not in found


def test_file_secrets_reread_a_changed_file_and_skip_missing(tmp_path: Path) -> None:
    path = tmp_path / "env"
    path.write_text("A_SECRET=first-secret-1\n")
    assert file_secrets([str(path), str(tmp_path / "missing")]) == ("first-secret-1",)
    path.write_text("A_SECRET=second-secret-22\n")
    assert file_secrets([str(path)]) == ("second-secret-22",)


def test_redaction_pattern_covers_all_sources(tmp_path: Path) -> None:
    secret_file = tmp_path / "netrc"
    secret_file.write_text("password from-the-file-99\n")
    settings = Settings(state_dir=tmp_path, host="t", secret_files=(str(secret_file),))
    pattern = redaction_pattern(settings, ["redis://:url-pw-4242@h:1/0", "plain-secret-55"])
    text = "url-pw-4242 plain-secret-55 from-the-file-99 redis://:url-pw-4242@h:1/0"
    out = redact(text, pattern)
    assert out.count(REDACTED) >= 4
    for secret in ("url-pw-4242", "plain-secret-55", "from-the-file-99"):
        assert secret not in out


def test_worker_redaction_covers_env_urls_and_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pattern checks and `bashfleet output` redact with: the same sources as a call.
    monkeypatch.setenv("MY_API_TOKEN", "env-token-31337")
    monkeypatch.setenv("BASHFLEET_REDIS_URL", "redis://:url-pass-2718@h:1/0")
    secret_file = tmp_path / "env"
    secret_file.write_text("DEPLOY_SECRET=file-secret-1414\n")
    settings = Settings(state_dir=tmp_path, host="t", secret_files=(str(secret_file),))
    out = redact("env-token-31337 url-pass-2718 file-secret-1414", worker_redaction(settings))
    for secret in ("env-token-31337", "url-pass-2718", "file-secret-1414"):
        assert secret not in out


# Redaction once blanked ordinary text (every `WARNING`, a CA bundle's path).


@pytest.mark.parametrize(
    "value",
    [
        "WARNING", "warning", "Warning", "production", "postgres", "INFO", "DEBUG",
        "v1.2.3", "3.11.4", "us-east-1", "eu-central-1", "europe-west1", "us-gov-west-1",
        "/etc/ssl/certs", "/etc/passwd", "true", "12345",
    ],
)
def test_settings_guessed_by_name_are_not_redacted(value: str) -> None:
    assert guessed_secrets([value]) == ()


@pytest.mark.parametrize(
    "value",
    [
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "AKIAIOSFODNN7EXAMPLE", "ghp_abcdef123456",
        "hunter22", "plain-secret-55", "correcthorsebatterystaple", "MixedCaseLetters",
        "redis://:pw-4242@h:1/0", "/not/a/file/anywhere-8812", "s3cr3t pass phrase",
    ],
)
def test_values_that_can_be_secrets_stay_redacted(value: str) -> None:
    assert guessed_secrets([value]) == (value,)


def test_a_public_files_path_is_not_a_secret_a_private_ones_is(tmp_path: Path) -> None:
    public = tmp_path / "ca-bundle.crt"
    public.write_text("cert")
    public.chmod(0o644)
    private = tmp_path / "key.pem"
    private.write_text("key")
    private.chmod(0o600)
    assert is_public_path(str(public))
    assert not is_public_path(str(private))
    assert not is_public_path("relative/path")
    assert not is_public_path("https://example.com/etc")
    assert guessed_secrets([str(public), str(private)]) == (str(private),)


def test_the_newcomers_output_comes_back_whole_and_real_secrets_do_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replayed trajectories: `AWS_CA_BUNDLE` and a logging level scrubbed by name,
    a real key beside them. Output naming the first two is left alone; the key is not."""
    bundle = tmp_path / "ca-certificates.crt"
    bundle.write_text("cert")
    bundle.chmod(0o644)
    monkeypatch.setenv("AWS_CA_BUNDLE", str(bundle))
    monkeypatch.setenv("CELERY_LOG_LEVEL", "WARNING")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    settings = Settings(state_dir=tmp_path, host="t")
    text = (f"WARNING: deprecated\nSSL_CERT_FILE={bundle}\n"
            "key wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n")
    assert redact(text, worker_redaction(settings)) == (
        f"WARNING: deprecated\nSSL_CERT_FILE={bundle}\nkey {REDACTED}\n"
    )


def test_the_workers_own_secrets_are_redacted_whatever_their_shape(tmp_path: Path) -> None:
    """A Redis password that is a plain word is still the worker's secret: known, not
    guessed, so it is redacted (with its encodings) even in the shape of a setting."""
    settings = Settings(state_dir=tmp_path, host="t", redis_url="redis://:foobared@h:1/0")
    out = redact("auth foobared; hex 666f6f6261726564", redaction_pattern(settings, []))
    assert "foobared" not in out and "666f6f6261726564" not in out
