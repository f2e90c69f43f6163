"""The framework adapters' tests: each framework installed from PyPI, run against a real
fleet (the integration fixtures: a Redis server, real workers).

They run in environments of their own (`scripts/frameworks.sh`: .venv-frameworks, and
.venv-harbor for Harbor, which needs Python 3.12), so a test module whose framework this
interpreter does not have is not collected here (`./scripts/test.sh` runs each in its
environment, where it is).
"""

from __future__ import annotations

import importlib.util

from integration.conftest import (  # noqa: F401 - fixtures
    image_registry,
    redis_client,
    redis_server,
    registry_images,
    session_workers,
    workers,
)
from integration.registry import Registry

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


def registry_env(registry: Registry) -> dict[str, str]:
    """A worker's settings that pull and build from the test registry (`image_registry`)
    with its credentials and CA certificate."""
    return {"BASHFLEET_REGISTRY_AUTH_FILE": str(registry.auth_file),
            "BASHFLEET_REGISTRY_CERTS_DIR": str(registry.certs_dir)}
