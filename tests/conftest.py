"""Suite-wide guard: the test session leaves no process behind.

At the end of the session every process created during it that is still alive and is
ours is reported and the session fails; the reported processes are then ended by pid,
since this session started them. Ours: a descendant of pytest, or a process whose
environment carries this session's tag. The tag is set in pytest's own environment, so
Redis servers, workers and the commands they run inherit it (its name matches no
secret pattern, so the engine's scrubbing keeps it), and several test sessions on one
machine never mistake each other's processes for leaks.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

# privilege: tests that need root fail in a run without root unless it says it is
# unprivileged on purpose. pytester: the suite's tests of its own plugins.
pytest_plugins = ["privilege", "pytester"]

TAG_VAR = "PYTEST_FLEET_SESSION_TAG"
#: A file ./scripts/test.sh writes scripts/frameworks.sh's exit status to when it ends
#: (it runs beside pytest); unset, .venv-frameworks is as it is.
FRAMEWORKS_STATUS_VAR = "BASHFLEET_TEST_FRAMEWORKS_STATUS"
_tag = os.environ.setdefault(TAG_VAR, uuid.uuid4().hex)
_session_start = time.time()


def _hermetic_environment() -> None:
    """Keep the suite off the user's own fleet: no BASHFLEET_* of the user's, and a
    state directory of the session's own (where `bashfleet up` records its fleet), set
    before anything reads the settings (`get_settings` is cached per process)."""
    for name in [n for n in os.environ if n.startswith("BASHFLEET_")]:
        # The suite's own switches: the leak check's, read at its end, an unprivileged
        # run's (tests/privilege.py), and where ./scripts/test.sh says the frameworks'
        # environment it makes beside pytest is ready (tests/integration/test_benchmarks.py).
        if name not in ("BASHFLEET_SKIP_LEAK_CHECK", "BASHFLEET_TEST_UNPRIVILEGED",
                        FRAMEWORKS_STATUS_VAR):
            del os.environ[name]
    state = tempfile.mkdtemp(prefix="bashfleet-tests-")
    atexit.register(shutil.rmtree, state, ignore_errors=True)
    os.environ["BASHFLEET_STATE_DIR"] = state
    os.environ["XDG_STATE_HOME"] = os.path.join(state, "xdg")
    # Every client of the suite signs, and every worker it starts requires it, as a
    # deployment does (a worker without a key refuses to start).
    os.environ["BASHFLEET_SIGNING_KEY"] = SUITE_SIGNING_KEY
    _shared_holder()


def _shared_holder() -> None:
    """One holder and one spawner binary for every worker of the suite, built once per
    user and source: each test's state directory would build its own (~0.5 s of a
    compiler each). In the
    user's own cache folder (0700), never a shared one such as /tmp: another account
    could put a binary there that a root worker would run. Where it cannot be built, the
    workers build (or go without) as a deployment's do."""
    from bashfleet.worker.engine import holder  # noqa: PLC0415 - after the environment

    cache = Path.home() / ".cache" / "bashfleet-tests"
    try:
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        owned = cache.stat().st_uid == os.geteuid() and not cache.stat().st_mode & 0o022
    except OSError:
        return
    path, _ = holder.build_into(cache) if owned else (None, None)
    if path is not None:
        os.environ["BASHFLEET_HOLDER"] = path
    spawner, _ = holder.build_spawner_into(cache) if owned else (None, None)
    if spawner is not None:
        os.environ["BASHFLEET_SPAWNER"] = spawner


#: The signing key of the suite's clients and workers.
SUITE_SIGNING_KEY = "suite-key-" + uuid.uuid4().hex


_hermetic_environment()


def _is_ours(proc: psutil.Process) -> bool:
    try:
        return bool(proc.environ().get(TAG_VAR) == _tag)
    except psutil.Error:
        return False


def leftover_processes(since: float) -> list[psutil.Process]:
    """Our processes created after `since` that are still alive (zombies excluded)."""
    me = psutil.Process()
    descendants = {p.pid for p in me.children(recursive=True)}
    found = []
    for proc in psutil.process_iter(["pid", "create_time", "status"]):
        try:
            if proc.pid == me.pid or proc.info["create_time"] < since - 0.5:
                continue
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if proc.pid in descendants or _is_ours(proc):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid}: {' '.join(proc.cmdline())[:160]}"
    except psutil.Error:
        return f"pid {proc.pid}: (gone)"


def _settle(since: float, timeout: float = 5.0) -> list[psutil.Process]:
    # Processes killed by the last test may need a moment to be gone.
    deadline = time.monotonic() + timeout
    left = leftover_processes(since)
    while left and time.monotonic() < deadline:
        psutil.wait_procs(left, timeout=0.2)
        left = leftover_processes(since)
    return left


@pytest.fixture(autouse=True)
def _end_hosts_left_in_tmp_path(request: pytest.FixtureRequest) -> Iterator[None]:
    """The hosts a test kept in its `tmp_path` end with it, once its workers stopped: a
    worker it killed (or an in-process caller that died) leaves its workspaces' records,
    cgroups and keepers to a reaper that never comes, and the cgroups would outlive the
    directory for good (`teardown.end_hosts_under`)."""
    if "tmp_path" not in request.fixturenames:
        yield
        return
    tmp: Path = request.getfixturevalue("tmp_path")  # set up first: torn down after us
    yield
    from bashfleet.worker.engine import teardown  # noqa: PLC0415 - only for such tests

    teardown.end_hosts_under(tmp)


@pytest.fixture(autouse=True)
def _end_sandbox_pools() -> Iterator[None]:
    """The sandbox launchers and idle runners a test's in-process calls started end with
    the test (each layout, a state directory, has its own), and so does the nftables
    helper its workspaces' rules started."""
    yield
    pools = sys.modules.get("bashfleet.worker.engine.sandbox")
    if pools is not None:
        pools.close_all()
    network = sys.modules.get("bashfleet.worker.engine.network.network")
    if network is not None:
        network.end_helper()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that run with .venv-frameworks' interpreter run last: ./scripts/test.sh
    makes that environment beside pytest, and they wait for it (the others need not)."""
    items.sort(key=lambda item: item.get_closest_marker("frameworks_venv") is not None)


@pytest.hookimpl(trylast=True)  # after pytest-xdist has ended its workers
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    del exitstatus
    if os.environ.get("BASHFLEET_SKIP_LEAK_CHECK") == "1":
        return
    # A pytest-xdist worker leaves the check to the session that started it: what the
    # worker started carries the same tag, and its sibling workers would look leaked.
    if hasattr(session.config, "workerinput"):
        return
    left = _settle(_session_start)
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [_describe(p) for p in left]
    message = "the test session left processes behind:\n  " + "\n  ".join(lines)
    if reporter is not None:
        reporter.write_line(message, red=True)
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            continue
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
