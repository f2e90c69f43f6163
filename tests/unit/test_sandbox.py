"""bashfleet.worker.engine.sandbox, the pure parts: isolation decisions, the zygote's command
line, the run user, bubblewrap's version."""

from __future__ import annotations

from pathlib import Path

import pytest

from bashfleet.worker.engine import isolate, sandbox
from bashfleet.worker.engine.sandbox import Choice, IsolationError, User
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.network import NetworkPolicy

BWRAP = "/usr/bin/bwrap"


@pytest.mark.parametrize(
    ("configured", "available", "expected"),
    [
        ("auto", True, "process"),
        ("auto", False, "none"),
        ("none", True, "none"),
        ("process", False, "process"),
        ("strict", True, "strict"),
    ],
)
def test_host_default(configured: str, available: bool, expected: str) -> None:
    assert sandbox.host_default(configured, available) == expected


def test_host_default_rejects_an_unknown_level() -> None:
    with pytest.raises(ValueError, match="unknown isolation"):
        sandbox.host_default("jail", True)


E, N, H = NetworkPolicy(mode="egress"), NetworkPolicy(mode="none"), NetworkPolicy(mode="host")
A = NetworkPolicy(mode="allow", allow=("pypi.org",))

# (configured, available, asked, network, host_network) -> Choice, or the error kind
DECISIONS: list[tuple[str, bool, str | None, NetworkPolicy | None, bool, Choice | str]] = [
    # The host's default.
    ("auto", True, None, None, False, Choice("process", E)),
    ("auto", False, None, None, False, Choice("none", H)),
    ("strict", True, None, None, False, Choice("strict", N)),
    ("strict", True, None, None, True, Choice("strict", E)),
    ("none", True, None, None, False, Choice("none", H)),
    # Stronger is granted.
    ("auto", True, "strict", None, False, Choice("strict", N)),
    ("none", True, "process", None, False, Choice("process", E)),
    # Weaker is refused.
    ("auto", True, "none", None, False, "invalid"),
    ("strict", True, "process", None, True, "invalid"),
    ("process", True, "none", None, False, "invalid"),
    # No sandbox where bubblewrap does not work, even when asked.
    ("auto", False, "process", None, False, "unavailable"),
    ("process", False, None, None, False, "unavailable"),
    ("auto", False, "none", None, False, Choice("none", H)),
    # The network: a call may cut it, and ask for it only where the host grants it.
    ("auto", True, None, N, False, Choice("process", N)),
    ("auto", True, "strict", E, False, "invalid"),
    ("strict", True, None, E, True, Choice("strict", E)),
    ("strict", True, None, N, True, Choice("strict", N)),
    ("none", True, None, N, False, Choice("process", N)),  # needs a sandbox
    ("auto", False, None, N, False, "unavailable"),
    ("auto", True, None, E, False, Choice("process", E)),
    # Policies: host only where the host allows it; egress and allow where it filters.
    ("auto", True, None, H, False, "invalid"),
    ("auto", True, None, A, False, Choice("process", A)),
    ("none", True, None, H, False, Choice("none", H)),
]


Case = tuple[str, bool, str | None, NetworkPolicy | None, bool, Choice | str]


@pytest.mark.parametrize("case", DECISIONS)
def test_decide(case: Case) -> None:
    configured, available, asked, network, host_network, expected = case

    def decision() -> Choice:
        return sandbox.decide(
            configured=configured, available=available, reason="bwrap missing",
            asked=asked, network=network, host_network=host_network,  # type: ignore[arg-type]
        )

    if isinstance(expected, Choice):
        assert decision() == expected
        return
    with pytest.raises(IsolationError) as caught:
        decision()
    assert caught.value.kind == expected
    if expected == "unavailable":
        assert "bwrap missing" in caught.value.message


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("bubblewrap 0.8.0\n", "0.8.0"),
        ("bubblewrap 0.11.0-rc1", "0.11.0-rc1"),
        ("bwrap: Unknown option --version", None),
        ("", None),
    ],
)
def test_parse_bwrap_version(text: str, version: str | None) -> None:
    assert sandbox.parse_bwrap_version(text) == version


def test_the_zygote_runs_in_bubblewrap_with_the_hosts_view() -> None:
    argv = sandbox.zygote_argv(BWRAP, rootless=False)
    assert argv[:5] == [BWRAP, "--dev-bind", "/", "/", "--"]
    assert argv[5:] == isolate.command("launcher")
    assert argv[-4:-2] == ["-I", "-S"]
    assert isolate.runs(argv, "launcher")


def test_a_rootless_zygote_gets_the_capabilities_of_its_user_namespace() -> None:
    argv = sandbox.zygote_argv(BWRAP, rootless=True)
    assert argv[argv.index("--cap-add") + 1] == "ALL"
    assert argv.index("--cap-add") < argv.index("--")


def test_extra_groups() -> None:
    user = User("builder", 1001, 1002, (1002, 27), "/home/builder")
    assert sandbox.extra_groups(user) == (27,)


@pytest.fixture(autouse=True)
def _fresh_run_users() -> None:
    sandbox._run_users.clear()  # the run user is looked up once a minute


def test_a_root_worker_runs_calls_as_its_run_user(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.setattr("bashfleet.worker.engine.sandbox.os.geteuid", lambda: 0)
    monkeypatch.setattr(sandbox, "_exists", lambda name: False)
    user = sandbox.run_user(Settings(state_dir=tmp_path, host="t"))
    assert user is not None and user.name == "nobody" and user.uid != 0


def test_a_run_user_that_is_root_is_refused(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    monkeypatch.setattr("bashfleet.worker.engine.sandbox.os.geteuid", lambda: 0)
    with pytest.raises(OSError, match="never run as root"):
        sandbox.run_user(Settings(state_dir=tmp_path, host="t", run_as="root"))


def test_a_worker_that_is_not_root_runs_calls_as_itself(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    monkeypatch.setattr("bashfleet.worker.engine.sandbox.os.geteuid", lambda: 4242)
    assert sandbox.run_user(Settings(state_dir=tmp_path, host="t")) is None




def test_a_zygote_that_dies_at_start_is_reported_with_its_last_words() -> None:
    # Docker's default capabilities: bwrap says why and exits; the worker's refusal to
    # start used to say only "Connection reset by peer".
    from bashfleet.worker.engine.isolate.launcher import KeeperLostError, LauncherClient  # noqa: PLC0415

    client = LauncherClient(["sh", "-c", "echo 'bwrap: Creating new namespace failed: "
                             "Operation not permitted' >&2; exit 1", "--"], {})
    try:
        client.proc.wait(10)
        with pytest.raises(KeeperLostError, match=r"zygote went away.*\(bwrap: Creating new "
                           r"namespace failed: Operation not permitted\)$"):
            client.keeper({}, [], 2.0)
    finally:
        client.close()
