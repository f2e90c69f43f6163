"""worker.engine.sandbox, the pure parts: isolation decisions, the bwrap layout and
command line, bubblewrap's version."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.engine import sandbox
from worker.engine.sandbox import Choice, IsolationError, Kind, Layout, User
from worker.settings import Settings

BWRAP = "/usr/bin/bwrap"
LAUNCHER = ["/py", "-I", "-S", "/launcher.py"]


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


# (configured, available, asked, network, host_network) -> Choice, or the error kind
DECISIONS: list[tuple[str, bool, str | None, bool | None, bool, Choice | str]] = [
    # The host's default.
    ("auto", True, None, None, False, Choice("process", True)),
    ("auto", False, None, None, False, Choice("none", True)),
    ("strict", True, None, None, False, Choice("strict", False)),
    ("strict", True, None, None, True, Choice("strict", True)),
    ("none", True, None, None, False, Choice("none", True)),
    # Stronger is granted.
    ("auto", True, "strict", None, False, Choice("strict", False)),
    ("none", True, "process", None, False, Choice("process", True)),
    # Weaker is refused.
    ("auto", True, "none", None, False, "invalid"),
    ("strict", True, "process", None, True, "invalid"),
    ("process", True, "none", None, False, "invalid"),
    # No sandbox where bubblewrap does not work, even when asked.
    ("auto", False, "process", None, False, "unavailable"),
    ("process", False, None, None, False, "unavailable"),
    ("auto", False, "none", None, False, Choice("none", True)),
    # The network: a call may cut it, and ask for it only where the host grants it.
    ("auto", True, None, False, False, Choice("process", False)),
    ("auto", True, "strict", True, False, "invalid"),
    ("strict", True, None, True, True, Choice("strict", True)),
    ("strict", True, None, False, True, Choice("strict", False)),
    ("none", True, None, False, False, Choice("process", False)),  # needs a sandbox
    ("auto", False, None, False, False, "unavailable"),
    ("auto", True, None, True, False, Choice("process", True)),
]


@pytest.mark.parametrize("case", DECISIONS)
def test_decide(case: tuple[str, bool, str | None, bool | None, bool, Choice | str]) -> None:
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
    ("paths", "expected"),
    [
        ([], ()),
        (["/a", "/a"], ("/a",)),
        (["/a/b", "/a", "/c"], ("/a", "/c")),
        (["/ab", "/a"], ("/a", "/ab")),  # a prefix of the name is not a parent
        (["/a/b/c", "/a/b"], ("/a/b",)),
    ],
)
def test_outermost(paths: list[str], expected: tuple[str, ...]) -> None:
    assert sandbox.outermost(paths) == expected


def test_plan_layout_hidden_wins_over_writable() -> None:
    layout = sandbox.plan_layout(
        strict=True,
        hidden=[("/srv/state", True), ("/srv/state/jobs", True), ("/etc/netrc", False),
                ("/srv/state/key", False), ("/home/u/.netrc", False)],
        writable=["/home/u", "/srv/state/ws", "/home/u/src"],
        rootless=False,
    )
    assert layout == Layout(
        strict=True, hidden_dirs=("/srv/state",), hidden_files=("/etc/netrc", "/home/u/.netrc"),
        writable=("/home/u",),
    )


def test_plan_layout_process_has_no_writable_paths() -> None:
    layout = sandbox.plan_layout(strict=False, hidden=[], writable=["/w"], rootless=True)
    assert layout == Layout(strict=False, rootless=True)


def test_bwrap_args_process() -> None:
    layout = Layout(strict=False, hidden_dirs=("/s",), hidden_files=("/k",))
    assert sandbox.bwrap_args(BWRAP, layout, LAUNCHER) == [
        BWRAP, "--dev-bind", "/", "/", "--dev", "/dev", "--ro-bind", "/sys", "/sys",
        "--tmpfs", "/s", "--remount-ro", "/s", "--ro-bind", "/dev/null", "/k",
        "--", *LAUNCHER,
    ]


def test_bwrap_args_strict_binds_workspaces_before_hiding() -> None:
    layout = Layout(strict=True, hidden_dirs=("/w/.secrets",), writable=("/w", "/x"),
                    rootless=True)
    args = sandbox.bwrap_args(BWRAP, layout, LAUNCHER)
    assert args[:5] == [BWRAP, "--ro-bind", "/", "/", "--dev"]
    assert args.index("--bind") < args.index("--tmpfs")
    assert args[args.index("--bind"):args.index("--bind") + 6] == [
        "--bind", "/w", "/w", "--bind", "/x", "/x",
    ]
    assert args[-7:] == ["--cap-add", "ALL", "--", *LAUNCHER]
    assert "--dev-bind" not in args


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


@pytest.mark.parametrize(
    ("writable", "cwd", "paths"),
    [
        ((), "/src", [("/src", True)]),  # no workspace configured: the cwd
        (("/ws",), "/src", [("/ws", True), ("/src", False)]),  # the cwd visible, read-only
        (("/ws",), "/ws/sub", [("/ws", True)]),
        (("/ws", "/cache"), "/ws", [("/ws", True), ("/cache", True)]),
    ],
)
def test_strict_paths(writable: tuple[str, ...], cwd: str, paths: list[tuple[str, bool]]) -> None:
    assert sandbox.strict_paths(writable, cwd) == paths


def test_strict_layout_keeps_existing_workspaces(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    settings = Settings(state_dir=tmp_path / "state", host="t",
                        sandbox_writable=(str(workspace), str(tmp_path / "missing")))
    assert sandbox.layout_for(settings, strict=True).writable == (str(workspace),)
    assert sandbox.layout_for(settings, strict=False).writable == ()


def test_hidden_paths_are_real_and_existing(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "default_state_dir", lambda: tmp_path / "default-missing")
    secret = tmp_path / "secret.env"
    secret.write_text("X=1")
    link = tmp_path / "link.env"
    link.symlink_to(secret)
    settings = Settings(state_dir=tmp_path / "state", host="t",
                        secret_files=(str(link), str(tmp_path / "gone")))
    assert sandbox.hidden_paths(settings) == [
        (str(tmp_path / "state"), True), (str(secret), False),
    ]


def test_kind_spec_and_user_env() -> None:
    user = User("builder", 1001, 1002, (1002, 27), "/home/builder")
    assert Kind(False, user).spec() == {"network": False, "uid": 1001, "gid": 1002,
                                        "groups": [1002, 27]}
    assert Kind(True, None).spec() == {"network": True}
    assert sandbox.user_env(user) == {"HOME": "/home/builder", "USER": "builder",
                                      "LOGNAME": "builder"}
    assert sandbox.user_env(None) == {}
    assert sandbox.extra_groups(user) == (27,)


def test_ulimit_leaves_to_the_cgroup_what_it_carries(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    from worker.engine import cgroups  # noqa: PLC0415 - only this test needs it

    settings = Settings(state_dir=tmp_path, host="t", limit_memory_mb=100, limit_procs=10,
                        limit_file_mb=5, limit_cpu_s=7)
    monkeypatch.setattr(sandbox, "_detect", lambda wanted: cgroups.Support(None, problem="x"))
    sandbox._cgroup_support.clear()
    everything = sandbox.ulimit_limits(settings)
    assert (everything.memory_mb, everything.procs) == (100, 10)
    monkeypatch.setattr(sandbox, "_detect", lambda wanted: cgroups.Support("v1"))
    sandbox._cgroup_support.clear()
    try:
        left = sandbox.ulimit_limits(settings)
        assert (left.memory_mb, left.procs, left.file_mb, left.cpu_s) == (None, None, 5, 7)
    finally:
        sandbox._cgroup_support.clear()
