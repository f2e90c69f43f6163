"""bashfleet.worker.engine.environment: a clean environment (only the names a call takes
of the worker's), secrets scrubbed by name, hardening, the call marker."""

from __future__ import annotations

import fnmatch
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bashfleet.worker.engine.environment import (
    DEFAULT_ALLOW,
    DEFAULT_DENY,
    HARDENING,
    HOST_INHERITED,
    MARKER_VAR,
    WORKER_INTERNALS,
    build_env,
    is_secret_name,
    process_environ,
)


@pytest.mark.parametrize(
    "name",
    [
        "AWS_SECRET_ACCESS_KEY",
        "AWS_ACCESS_KEY_ID",
        "aws_session_token",
        "github_token",
        "GITHUB_TOKEN",
        "GH_TOKEN",
        "MY_PASSWORD",
        "db_password",
        "BASHFLEET_REDIS_URL",
        "bashfleet_anything",
        "CELERY_BROKER_URL",
        "BROKER_URL",
        "REDIS_URL",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "Api_Key",
        "SSH_PRIVATE_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "AZURE_CLIENT_SECRET",
        "SENTRY_DSN",
        "DATABASE_URL",
        "NPM_TOKEN",
        "GPG_PASSPHRASE",
        "FLOWER_BASIC_AUTH",
    ],
)
def test_secret_names_are_scrubbed_case_insensitively(name: str) -> None:
    assert is_secret_name(name, DEFAULT_DENY, DEFAULT_ALLOW)
    assert is_secret_name(name.lower(), DEFAULT_DENY, DEFAULT_ALLOW)
    assert is_secret_name(name.upper(), DEFAULT_DENY, DEFAULT_ALLOW)


@pytest.mark.parametrize(
    "name", ["PATH", "HOME", "USER", "LANG", "PWD", "SHELL", "TERM", "LC_ALL", "VIRTUAL_ENV"]
)
def test_ordinary_names_are_kept(name: str) -> None:
    assert not is_secret_name(name, DEFAULT_DENY, DEFAULT_ALLOW)


def test_allow_list_wins_over_deny() -> None:
    assert is_secret_name("GITHUB_ACTIONS", DEFAULT_DENY, ())
    assert not is_secret_name("GITHUB_ACTIONS", DEFAULT_DENY, ("GITHUB_ACTIONS",))
    assert not is_secret_name("github_actions", DEFAULT_DENY, ("GitHub_*",))
    assert is_secret_name("GITHUB_TOKEN", DEFAULT_DENY, ("GITHUB_ACTIONS",))


def test_custom_deny_patterns() -> None:
    assert is_secret_name("INTERNAL_THING", ("internal_*",), ())
    assert not is_secret_name("PATH", ("internal_*",), ())
    assert not is_secret_name("AWS_SECRET_ACCESS_KEY", (), ())


def test_build_env_scrubs_and_reports_values() -> None:
    base = {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI",
        "github_token": "ghp_abcdef",
        "MY_PASSWORD": "hunter22",
        "BASHFLEET_REDIS_URL": "redis://:pw@h:6379/0",
        "CELERY_BROKER_URL": "redis://h/1",
    }
    child = build_env(base, marker="call-1", passed=("*",))
    assert child.env["PATH"] == "/usr/bin"
    assert child.env["HOME"] == "/home/u"
    scrubbed = {
        "AWS_SECRET_ACCESS_KEY",
        "github_token",
        "MY_PASSWORD",
        "BASHFLEET_REDIS_URL",
        "CELERY_BROKER_URL",
    }
    for name in scrubbed:
        assert name not in child.env
    assert set(child.scrubbed_names) == scrubbed
    assert set(child.scrubbed_values) == {base[name] for name in scrubbed}
    # Names and values line up.
    for name, value in zip(child.scrubbed_names, child.scrubbed_values, strict=True):
        assert base[name] == value


def test_build_env_allow_list_keeps_a_denied_name() -> None:
    base = {"GITHUB_WORKSPACE": "/w", "GITHUB_TOKEN": "t0k3n"}
    child = build_env(base, marker="m", passed=("GITHUB_*",), allow=("GITHUB_WORKSPACE",))
    assert child.env["GITHUB_WORKSPACE"] == "/w"
    assert "GITHUB_TOKEN" not in child.env
    assert child.scrubbed_names == ("GITHUB_TOKEN",)
    # Allowed but not passed: not taken (the allow list only lifts the scrubbing).
    child = build_env(base, marker="m", allow=("GITHUB_WORKSPACE",))
    assert "GITHUB_WORKSPACE" not in child.env


def test_hardening_is_present_and_a_default() -> None:
    expected = {
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "GIT_EDITOR": "true",
        "EDITOR": "true",
        "GIT_TERMINAL_PROMPT": "0",
        "CI": "1",
        "DEBIAN_FRONTEND": "noninteractive",
        "TERM": "dumb",
        "NO_COLOR": "1",
    }
    for name, value in expected.items():
        assert HARDENING[name] == value
    # The worker's own values never reach a call: the hardening is laid over them.
    base = {"PAGER": "less", "TERM": "xterm-256color", "EDITOR": "vim"}
    child = build_env(base, marker="the-marker")
    for name, value in HARDENING.items():
        assert child.env[name] == value
    # What the session exported wins over the defaults; the marker is never overridden.
    extra = {name: "overridden" for name in HARDENING} | {MARKER_VAR: "forged"}
    child = build_env(base, marker="the-marker", extra=extra)
    for name in HARDENING:
        assert child.env[name] == "overridden"
    assert child.env[MARKER_VAR] == "the-marker"


@pytest.mark.parametrize(
    ("extra", "unset", "name", "expected"),
    [
        # `unset PAGER` in a session sticks on its later calls.
        ({}, ("PAGER",), "PAGER", None),
        ({}, ("TERM", "NO_COLOR"), "NO_COLOR", None),
        ({"PAGER": "less"}, (), "PAGER", "less"),
        ({}, (), "PAGER", "cat"),
        # An unset names what the session removed last: it wins over an old export.
        ({"PAGER": "less"}, ("PAGER",), "PAGER", None),
        # The marker is set whatever the session did.
        ({}, (MARKER_VAR,), MARKER_VAR, "m"),
    ],
)
def test_a_sessions_exports_and_unsets_win_over_the_hardening(
    extra: dict[str, str], unset: tuple[str, ...], name: str, expected: str | None
) -> None:
    child = build_env({"PAGER": "more"}, marker="m", extra=extra, unset=unset)
    assert child.env.get(name) == expected


@pytest.mark.parametrize(
    "name",
    ["_MP_FORK_LOGLEVEL_", "_MP_FORK_LOGFILE_", "_MP_FORK_LOGFORMAT_", "OLDPWD", "PWD", "_",
     "FORKED_BY_MULTIPROCESSING", "MP_MAIN_FILE", "INVOCATION_ID", "JOURNAL_STREAM",
     "NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "WATCHDOG_USEC", "oldpwd"],
)
def test_worker_internals_never_reach_a_call_and_are_not_redacted(name: str) -> None:
    # Not even when the operator passes every name through.
    child = build_env({name: "[%(levelname)s] internal", "PATH": "/bin"}, marker="m",
                      passed=("*",))
    assert name not in child.env
    assert child.env["PATH"] == "/bin"
    # Not a secret: its value must not be redacted from output.
    assert child.scrubbed_names == ()
    assert child.scrubbed_values == ()


def test_names_that_only_look_internal_are_kept() -> None:
    base = {"MP_THREADS": "4", "PWD_HINT": "x", "__X": "1", "HOME_PWD": "/h"}
    child = build_env(base, marker="m", passed=("*",))
    assert {k: v for k, v in child.env.items() if k in base} == base


def test_extra_is_added_unscrubbed() -> None:
    # Session variables the caller set on purpose stay, even with a secret-looking name.
    child = build_env({"PATH": "/bin"}, marker="m", extra={"MY_TOKEN": "abc", "FOO": "1"})
    assert child.env["MY_TOKEN"] == "abc"
    assert child.env["FOO"] == "1"
    assert child.scrubbed_names == ()
    assert child.scrubbed_values == ()


def test_marker_is_set_and_base_is_not_mutated() -> None:
    base = {"PATH": "/bin", "API_KEY": "k3y-value"}
    snapshot = dict(base)
    child = build_env(base, marker="abc123")
    assert child.env[MARKER_VAR] == "abc123"
    assert base == snapshot
    assert MARKER_VAR.startswith("BASHFLEET_")


def test_marker_from_base_is_replaced() -> None:
    # A worker started from inside another call carries a marker: the call's own wins.
    child = build_env({MARKER_VAR: "outer"}, marker="inner")
    assert child.env[MARKER_VAR] == "inner"
    assert child.scrubbed_values == ("outer",)


def _internal(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name.upper(), p) for p in WORKER_INTERNALS)


_names = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_0123456789",
                 min_size=1, max_size=24)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_names, st.text(max_size=10), max_size=12), st.text(max_size=10))
def test_build_env_partitions_the_base(base: dict[str, str], marker: str) -> None:
    child = build_env(base, marker=marker, passed=("*",))
    assert child.env[MARKER_VAR] == marker
    for name, value in base.items():
        if name == MARKER_VAR or name in HARDENING:
            continue
        if _internal(name):
            assert name not in child.env and name not in child.scrubbed_names
            continue
        secret = is_secret_name(name, DEFAULT_DENY, DEFAULT_ALLOW)
        assert (name in child.scrubbed_names) == secret
        assert (child.env.get(name) == value) != secret
        assert (name in child.env) != secret
    assert len(child.scrubbed_names) == len(child.scrubbed_values)
    for name in child.env:
        assert name in base or name in HARDENING or name == MARKER_VAR


@settings(max_examples=200, deadline=None)
@given(_names)
def test_secret_names_ignore_case(name: str) -> None:
    verdict = is_secret_name(name, DEFAULT_DENY, DEFAULT_ALLOW)
    assert is_secret_name(name.lower(), DEFAULT_DENY, DEFAULT_ALLOW) == verdict
    assert is_secret_name(name.upper(), DEFAULT_DENY, DEFAULT_ALLOW) == verdict
    assert not is_secret_name(name, DEFAULT_DENY, (name.swapcase(),))


def test_process_environ_follows_every_change(monkeypatch: pytest.MonkeyPatch) -> None:
    assert process_environ() == dict(os.environ)
    assert process_environ() is process_environ(), "unchanged: the same snapshot"
    monkeypatch.setenv("BASHFLEET_TEST_ADDED", "caf\u00e9")
    assert process_environ()["BASHFLEET_TEST_ADDED"] == "caf\u00e9"
    monkeypatch.setenv("BASHFLEET_TEST_ADDED", "changed")
    assert process_environ()["BASHFLEET_TEST_ADDED"] == "changed"
    monkeypatch.delenv("BASHFLEET_TEST_ADDED")
    assert "BASHFLEET_TEST_ADDED" not in process_environ()
    assert process_environ() == dict(os.environ)


#: A worker started from a person's shell: their session, agent socket, virtualenv,
#: credentials and exported passwords.
_SHELL_ENV = {
    "PATH": "/home/u/.venv/bin:/usr/bin:/bin", "LANG": "en_US.UTF-8",
    "LC_ALL": "en_US.UTF-8", "LC_TIME": "de_DE.UTF-8", "HOME": "/home/u", "USER": "u",
    "LOGNAME": "u", "SHELL": "/bin/zsh", "TERM": "xterm-256color", "TMPDIR": "/home/u/tmp",
    "SSH_AUTH_SOCK": "/tmp/ssh-XXXX/agent.1", "DOCKER_AUTH_CONFIG": '{"auths":{"r":{}}}',
    "MY_APP_PASS": "s3cr3t-pass", "PYTHONPATH": "/home/u/src", "VIRTUAL_ENV": "/home/u/.venv",
    "PIP_FIND_LINKS": "/home/u/wheels", "DISPLAY": ":0", "XDG_RUNTIME_DIR": "/run/user/1000",
    "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/1000/bus", "KUBECONFIG": "/home/u/.kube/c",
    "HTTPS_PROXY": "http://proxy.corp:3128", "NPM_TOKEN": "npm_abcdef123456",
}


@pytest.mark.parametrize(
    ("inherit", "passed", "allow", "taken"),
    [
        # On the host's root: where programs are and the language, nothing else.
        (HOST_INHERITED, (), (), {"PATH", "LANG"}),
        # On an image: nothing of the worker's.
        ((), (), (), set()),
        # What the operator names passes (patterns, any case): LC_* only when named.
        (HOST_INHERITED, ("LC_*", "https_proxy"), (), {"PATH", "LANG", "LC_ALL", "LC_TIME",
                                                        "HTTPS_PROXY"}),
        ((), ("LC_ALL",), (), {"LC_ALL"}),
        # Named, but a deny pattern scrubs it: still out (the password, the token, the
        # registry credentials), unless the operator also allows it.
        (HOST_INHERITED, ("MY_APP_PASS", "NPM_TOKEN", "DOCKER_AUTH_CONFIG"), (),
         {"PATH", "LANG"}),
        (HOST_INHERITED, ("NPM_TOKEN",), ("NPM_TOKEN",), {"PATH", "LANG", "NPM_TOKEN"}),
        # Allowed but not named: allowing lifts the scrubbing, it does not pass a name.
        (HOST_INHERITED, (), ("NPM_TOKEN",), {"PATH", "LANG"}),
    ],
)
def test_a_call_takes_only_the_named_variables_of_the_workers_environment(
    inherit: tuple[str, ...], passed: tuple[str, ...], allow: tuple[str, ...], taken: set[str]
) -> None:
    child = build_env(_SHELL_ENV, marker="m", inherit=inherit, passed=passed, allow=allow)
    got = {k: v for k, v in child.env.items() if k not in HARDENING and k != MARKER_VAR}
    assert got == {name: _SHELL_ENV[name] for name in taken}
    assert child.env["TERM"] == "dumb"  # the hardening's, never the worker's terminal


@pytest.mark.parametrize("name", ["MY_APP_PASS", "DOCKER_AUTH_CONFIG", "NPM_TOKEN"])
def test_the_workers_secrets_are_redacted_whether_passed_or_not(name: str) -> None:
    for passed in ((), (name,)):
        child = build_env(_SHELL_ENV, marker="m", passed=passed)
        assert name in child.scrubbed_names and _SHELL_ENV[name] in child.scrubbed_values


def test_the_workspace_goes_under_the_hardening_and_the_caller_over_both() -> None:
    own = {"HOME": "/root", "USER": "root", "PATH": "/opt/conda/bin:/usr/bin", "TERM": "xterm",
           "GPG_KEY": "A035C8C19219BA821ECEA86B64E628F8D684696D"}
    child = build_env(_SHELL_ENV, marker="m", inherit=(), own=own,
                      extra={"PATH": "/mine:/usr/bin", "MY_TOKEN": "t"})
    assert child.env["HOME"] == "/root" and child.env["USER"] == "root"
    # An image's ENV is the image's: a secret-looking name of it is not scrubbed.
    assert child.env["GPG_KEY"] == own["GPG_KEY"]
    assert child.env["TERM"] == "dumb"
    assert child.env["PATH"] == "/mine:/usr/bin" and child.env["MY_TOKEN"] == "t"
    assert "PYTHONPATH" not in child.env and "VIRTUAL_ENV" not in child.env
