"""What `bashfleet run` loads on its way to a real fleet and back: a plain call
(`--workspace W` or `--host H`, `bashfleet.client.cli.plain`) the light Redis client
(not redis-py: its import alone outlasts the call) and the wire's standard-library
parts, with no model built (neither pydantic nor the fleet client); and nothing of
the worker's side (Celery, the engine, the
worker's settings, the supervisor), of the other commands (the MCP server, the dialects,
the SWE-ReX server) or of `bashfleet up` (psutil). Checked with `python -X importtime`,
which names every module the process imports; bench/bench_cli.py has the times.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bashfleet.client import Fleet
from bashfleet.client.redis_server import RedisServer

from .conftest import WorkerProcess

#: What `run` may not load.
NOT_ON_RUN = ("redis", "celery", "kombu", "vine", "psutil", "pydantic_settings", "mcp", "anyio",
              "bashfleet.worker.engine", "bashfleet.worker.settings",
              "bashfleet.worker.fleet.tasks", "bashfleet.worker.fleet.registry",
              "bashfleet.worker.fleet.supervisor", "bashfleet.client.local",
              "bashfleet.client.mcp_server", "bashfleet.client.dialects",
              "bashfleet.client.integrations", "bashfleet.client.cli.workspaces",
              "bashfleet.client.cli.agents", "bashfleet.client.cli.interactive",
              "bashfleet.client.cli.jobs", "bashfleet.client.attach")

#: What a plain `run` may not load either: the models and the fleet client, whose
#: imports take longer than the call.
NOT_ON_PLAIN_RUN = ("pydantic", "pydantic_core", "bashfleet.worker.wire.models",
                    "bashfleet.worker.wire.control", "bashfleet.client.fleet",
                    "bashfleet.client._sync", "bashfleet.client._async",
                    "bashfleet.client._core.messages", "bashfleet.client._core.workspaces")

#: The console script's own code (`bashfleet = "bashfleet.client.cli:main"`).
ENTRY = "import sys; from bashfleet.client.cli import main; sys.exit(main())"


def _run_imports(url: str, *argv: str, stdout: str | None = "ran\n") -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "BASHFLEET_REDIS_URL"}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", ENTRY, "run", *argv],
        env={**env, "BASHFLEET_REDIS_URL": url}, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert stdout is None or done.stdout == stdout, done.stdout
    assert stdout is not None or '"stdout": "ran\\n"' in done.stdout, done.stdout
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    return [line.rsplit("|", 1)[1].strip() for line in lines[1:]]  # [0] is the header


def _within(module: str, name: str) -> bool:
    return module == name or module.startswith(name + ".")


@pytest.mark.parametrize("where", ["host", "workspace"])
def test_run_loads_the_client_and_nothing_of_the_worker(
    two_hosts: tuple[WorkerProcess, WorkerProcess], redis_server: RedisServer,
    fleet: Fleet, where: str,
) -> None:
    host = two_hosts[0].host
    if where == "workspace":
        workspace = fleet.workspace(host=host)
        modules = _run_imports(redis_server.url, "--workspace", workspace.id, "echo ran")
        workspace.delete()
    else:
        modules = _run_imports(redis_server.url, "--host", host, "echo ran")
    # It did reach the fleet, on the plain path: its sending and the light client...
    assert {"bashfleet.client.cli.plain", "bashfleet.client._core.sending",
            "bashfleet.worker.fleet.resp"} <= {*modules}
    # ...and nothing it does not use.
    assert [m for m in modules if any(_within(m, name) for name in NOT_ON_RUN)] == []
    assert [m for m in modules if any(_within(m, name) for name in NOT_ON_PLAIN_RUN)] == []


def test_run_through_the_fleet_client_loads_it_and_nothing_of_the_worker(
    two_hosts: tuple[WorkerProcess, WorkerProcess], redis_server: RedisServer,
) -> None:
    """A call the plain path leaves to the fleet client (`--json`, here)."""
    modules = _run_imports(redis_server.url, "--host", two_hosts[0].host, "--json",
                           "echo ran", stdout=None)
    assert {"bashfleet.client._sync.fleet", "bashfleet.worker.wire.models",
            "bashfleet.worker.fleet.resp"} <= {*modules}
    assert [m for m in modules if any(_within(m, name) for name in NOT_ON_RUN)] == []
