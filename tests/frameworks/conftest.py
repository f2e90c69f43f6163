"""The framework adapters' tests (issue #21): each framework installed from PyPI, run
against a real fleet (the integration fixtures: a Redis server, real workers).

They run in environments of their own (`scripts/frameworks.sh`: .venv-frameworks, and
.venv-harbor for Harbor, which needs Python 3.12), so a test module whose framework this
interpreter does not have is not collected here (`./scripts/test.sh` runs each in its
environment, where it is).
"""

from __future__ import annotations

import importlib.util

from integration.conftest import (  # noqa: F401 - fixtures
    redis_client,
    redis_server,
    session_workers,
    workers,
)

#: Test module -> the package it needs.
NEEDS = {
    "test_inspect_ai.py": "inspect_ai",
    "test_openai_agents.py": "agents",
    "test_swerex.py": "swerex",
    "test_mini_swe_agent.py": "minisweagent",
    "test_harbor.py": "harbor",
}

collect_ignore = [module for module, package in NEEDS.items()
                  if importlib.util.find_spec(package) is None]
