"""Tests that need root, and what a run without root does with them.

A container, network, snapshot or image test needs a worker started as root (ids of its
own per workspace, veth links, whiteouts, chown). Such a test says so with the
`needs_root` marker, or calls `require_root` where the need shows only inside it. Run as
root, it runs. Run as another user, it fails, unless the run says it is unprivileged on
purpose (`BASHFLEET_TEST_UNPRIVILEGED=1`, which scripts/test.sh sets, and says it sets,
when a user who is not root runs it): then it is skipped, its reason in the summary. A
run that skipped root's tests therefore never reports green by accident.

Loaded by tests/conftest.py as a plugin; `verdict` is the whole rule, a pure function.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

import pytest

#: The variable a run sets to say it runs without root on purpose.
UNPRIVILEGED_VAR = "BASHFLEET_TEST_UNPRIVILEGED"
MARKER = "needs_root"

Verdict = Literal["run", "skip", "fail"]


def verdict(euid: int, environ: Mapping[str, str]) -> Verdict:
    """What becomes of a test that needs root, for a process of `euid` with `environ`."""
    if euid == 0:
        return "run"
    return "skip" if environ.get(UNPRIVILEGED_VAR) == "1" else "fail"


#: How every skip for want of root ends (the run's summary counts them by it).
SKIPPED = f"an unprivileged run ({UNPRIVILEGED_VAR}=1)"


def message(reason: str, outcome: Verdict) -> str:
    """What the skip or the failure says."""
    if outcome == "skip":
        return f"needs root ({reason}): {SKIPPED}"
    return (f"needs root ({reason}), and this run is not root: run it as root, or set "
            f"{UNPRIVILEGED_VAR}=1 to leave root's tests out on purpose")


def require_root(reason: str) -> None:
    """Inside a test: go on as root; else skip (an unprivileged run) or fail."""
    outcome = verdict(os.geteuid(), os.environ)
    if outcome == "skip":
        pytest.skip(message(reason, outcome))
    if outcome == "fail":
        pytest.fail(message(reason, outcome), pytrace=False)


def needs_root(reason: str) -> pytest.MarkDecorator:
    """The marker, for a test or a module's `pytestmark`."""
    return pytest.mark.needs_root(reason)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(reason): the test needs root; see tests/privilege.py")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker(MARKER)
    if marker is not None:
        require_root(str(marker.args[0]) if marker.args else "a root worker")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    left_out = [report for report in terminalreporter.stats.get("skipped", [])
                if SKIPPED in str(getattr(report, "longrepr", ""))]
    if left_out:
        terminalreporter.write_line(
            f"left out on purpose: {len(left_out)} tests that need root ({SKIPPED})",
            yellow=True)
