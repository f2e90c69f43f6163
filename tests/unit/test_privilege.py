"""Tests that need root (tests/privilege.py): the rule as a table, and real pytest runs
(pytester, in this process, with the effective uid made another user's) showing that a
run without root fails them unless it says it is unprivileged on purpose."""

from __future__ import annotations

import os
import re
from pathlib import Path

import privilege
import pytest
from privilege import UNPRIVILEGED_VAR, verdict

TESTS = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("euid", "environ", "expected"), [
    (0, {}, "run"),
    (0, {UNPRIVILEGED_VAR: "1"}, "run"),  # root runs them whatever the run says
    (1000, {}, "fail"),
    (1000, {UNPRIVILEGED_VAR: "1"}, "skip"),
    (1000, {UNPRIVILEGED_VAR: "0"}, "fail"),
    (1000, {UNPRIVILEGED_VAR: "yes"}, "fail"),  # only "1" says it
    (1000, {UNPRIVILEGED_VAR: ""}, "fail"),
    (65534, {UNPRIVILEGED_VAR: "1"}, "skip"),
])
def test_verdict(euid: int, environ: dict[str, str], expected: str) -> None:
    assert verdict(euid, environ) == expected


SAMPLE = '''
import pytest
from privilege import needs_root, require_root

@needs_root("a root worker's workspaces")
def test_marked():
    assert True

def test_inside():
    require_root("chown to another user")
    assert True

def test_plain():
    assert True
'''


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, euid: int,
         unprivileged: str | None) -> pytest.RunResult:
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    if unprivileged is None:
        monkeypatch.delenv(UNPRIVILEGED_VAR, raising=False)
    else:
        monkeypatch.setenv(UNPRIVILEGED_VAR, unprivileged)
    pytester.makepyfile(test_sample=SAMPLE)
    return pytester.runpytest_inprocess("-p", "privilege", "-rs", "--strict-markers")


def test_a_run_without_root_fails_root_tests(pytester: pytest.Pytester,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(pytester, monkeypatch, 1000, None)
    result.assert_outcomes(passed=1, errors=1, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.re_match_lines([
        r".*needs root \(a root worker's workspaces\), and this run is not root: .*"
        rf"set {UNPRIVILEGED_VAR}=1.*",
        r".*needs root \(chown to another user\), and this run is not root.*",
    ], consecutive=False)
    assert "left out on purpose" not in result.stdout.str()


def test_an_unprivileged_run_skips_them_and_says_how_many(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(pytester, monkeypatch, 1000, "1")
    result.assert_outcomes(passed=1, skipped=2)
    assert result.ret == pytest.ExitCode.OK
    # One line says how many were left out, then the summary says which, and why.
    result.stdout.fnmatch_lines([
        f"left out on purpose: 2 tests that need root ({privilege.SKIPPED})",
        f"SKIPPED*needs root (a root worker's workspaces): {privilege.SKIPPED}",
        f"SKIPPED*needs root (chown to another user): {privilege.SKIPPED}",
    ])


def test_as_root_they_run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    for unprivileged in (None, "1"):
        result = _run(pytester, monkeypatch, 0, unprivileged)
        result.assert_outcomes(passed=3)
        assert "left out on purpose" not in result.stdout.str()


#: A skip decided by the effective uid in place of the marker or `require_root`.
BYPASS = re.compile(r"skip(if)?\(\s*os\.geteuid\(\)|if os\.geteuid\(\) != 0:\s*\n\s*pytest\.skip")


def test_no_test_skips_for_want_of_root_by_itself() -> None:
    found = [str(path.relative_to(TESTS)) for path in sorted(TESTS.rglob("*.py"))
             if path != Path(__file__).resolve()
             and BYPASS.search(path.read_text(encoding="utf-8"))]
    assert found == []
    assert BYPASS.search('pytest.mark.skipif(os.geteuid() != 0, reason="x")')
    assert BYPASS.search('    if os.geteuid() != 0:\n        pytest.skip("x")')
