"""What is installed is whole: every module of the two packages imports, and the console
script answers for every dialect. CI runs this directory against the package installed
from exactly the files the Dockerfile copies, in a fresh virtualenv outside the
checkout (`scripts/test_installed.sh`, which first checks the packages load from there).
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess

import pytest

from bashfleet import client, worker

from .helpers import bashfleet_command

PACKAGES = (worker, client)


def _all_modules() -> list[str]:
    found = []
    for package in PACKAGES:
        found.append(package.__name__)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."):
            found.append(info.name)
    return sorted(found)


def test_every_module_of_the_installed_packages_imports() -> None:
    modules = _all_modules()
    # The rooms and the modules every deployment needs are all there.
    for expected in (
        "bashfleet.client.dialects.claude", "bashfleet.client.mcp_server",
        "bashfleet.worker.wire.control", "bashfleet.worker.engine.isolate.job_supervisor",
        "bashfleet.worker.fleet.supervisor", "bashfleet.worker.fleet.consumer",
    ):
        assert expected in modules
    for name in modules:
        if name in EXTRAS:
            _imports_or_names_its_extra(name, EXTRAS[name])
        else:
            importlib.import_module(name)


#: The framework adapters and the install extra each needs (the core install pulls none).
EXTRAS = {
    "bashfleet.client.integrations.harbor": "harbor",
    "bashfleet.client.integrations.inspect_ai": "inspect",
    "bashfleet.client.integrations.mini_swe_agent": "mini-swe-agent",
    "bashfleet.client.integrations.openai_agents": "openai-agents",
}


def _imports_or_names_its_extra(name: str, extra: str) -> None:
    """An adapter imports where its framework is installed; elsewhere its error says
    which extra to install."""
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        assert f"pip install 'bashfleet[{extra}]'" in str(exc), exc


def test_the_core_install_pulls_no_framework() -> None:
    import importlib.util  # noqa: PLC0415

    for framework in ("inspect_ai", "harbor", "agents", "minisweagent", "swerex"):
        assert importlib.util.find_spec(framework) is None, framework


@pytest.mark.parametrize("dialect", ["pipe", "modes", "pi", "claude", "native"])
def test_schema_of_every_dialect(dialect: str) -> None:
    done = subprocess.run(
        [*bashfleet_command(), "schema", "--dialect", dialect], capture_output=True, text=True,
        timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.lstrip().startswith("[")
