"""bashfleet as a mini-swe-agent environment (`pip install 'bashfleet[mini-swe-agent]'`).

    environment:
      environment_class: bashfleet.client.integrations.mini_swe_agent.BashfleetEnvironment
      label: linux            # or host: build-1; ttl_s, isolation, network, limits...
      image: python:3.12      # as its docker environment's `image` (or build: ./ctx)

One workspace per environment object, made when the environment is made, renewed while
it lives, deleted by `cleanup()` (or when the object goes). With `image` (or `build`, a
local directory with a Dockerfile) its `/` is that image, pulled (or built) on the host:
commands run as its USER (or `user`), in its WORKDIR, with its ENV. Its protocol is
`LocalEnvironment`'s (minisweagent/environments/local.py), so the agent cannot tell them
apart: `execute(action, cwd="", *, timeout=None)` runs `action["command"]` with stdout
and stderr combined and returns `{"output", "returncode", "exception_info"}` (a timeout:
returncode -1, the partial output, `exception_info` and `extra` as `subprocess`'s
TimeoutExpired gives them); the environment itself raises `Submitted` when the output's
first line is `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` and the command succeeded;
`get_template_vars(**kwargs)` and `serialize()` as its own. The template variables
describe the host the commands run on (its `uname`), not the machine of the agent.

Configured from the BASHFLEET_* settings (the fleet, the owner), overridden by the
environment's own config (`BashfleetEnvironmentConfig`).
"""

from __future__ import annotations

import subprocess
from typing import Any

try:
    from minisweagent.exceptions import Submitted
    from minisweagent.utils.serialize import recursive_merge
except ModuleNotFoundError as exc:  # the extra is not installed: say which
    from bashfleet.client.integrations import missing_extra

    raise missing_extra(__name__, "mini-swe-agent", "mini-swe-agent", exc) from exc
from pydantic import Field

from bashfleet.client.errors import BashfleetError
from bashfleet.client.fleet import Fleet
from bashfleet.client.integrations._backend import LeaseKeeper, WorkspaceOptions
from bashfleet.worker.wire.models import CallResult, Policy

#: The first line of an output that submits (mini-swe-agent's convention).
SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
#: Fields of `platform.uname()`, as `LocalEnvironment.get_template_vars` gives them.
UNAME_FIELDS = ("system", "node", "release", "version", "machine")


class BashfleetEnvironmentConfig(WorkspaceOptions):
    """`LocalEnvironmentConfig` (cwd, env, timeout) plus where the workspace is made."""

    cwd: str = ""
    """Where commands run (default: the workspace's directory)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables set for every command."""
    timeout: int = 30
    """Seconds a command may run before it is killed (`execute(timeout=)` overrides)."""


def policy() -> Policy:
    """Output as LocalEnvironment has it: stdout and stderr in one stream; a command
    past its timeout is killed (its group), never left running."""
    return Policy(name="mini-swe-agent", streams="combined", on_timeout="kill")


def observation(command: str, result: CallResult, timeout: float) -> dict[str, Any]:
    """What `LocalEnvironment.execute` returns for this result."""
    if result.timed_out:
        error = subprocess.TimeoutExpired(command, timeout, output=result.stdout)
        return failure(result.stdout, error, type(error).__name__)
    if result.error is not None and result.exit_code is None:
        return failure(result.stdout, result.error.message, result.error.kind)
    return {"output": result.stdout, "returncode": returncode(result), "exception_info": ""}


def failure(output: str, error: object, kind: str) -> dict[str, Any]:
    """LocalEnvironment's answer when running the command raised."""
    return {
        "output": output,
        "returncode": -1,
        "exception_info": f"An error occurred while executing the command: {error}",
        "extra": {"exception_type": kind, "exception": str(error)},
    }


def returncode(result: CallResult) -> int:
    """The command's status as `subprocess` gives it: -N when signal N ended it."""
    if result.exit_code is not None:
        return result.exit_code
    return -result.signal if result.signal is not None else -1


def submission(output: dict[str, Any]) -> str | None:
    """The submitted text when this output submits (LocalEnvironment's rule), else None."""
    lines = str(output.get("output", "")).lstrip().splitlines(keepends=True)
    if lines and lines[0].strip() == SUBMIT_MARKER and output.get("returncode") == 0:
        return "".join(lines[1:])
    return None


def uname_vars(text: str) -> dict[str, str]:
    """`platform.uname()`'s fields from `uname -s; uname -n; uname -r; uname -v;
    uname -m` on the host (one per line)."""
    values = text.splitlines()
    return {name: values[i] if i < len(values) else ""
            for i, name in enumerate(UNAME_FIELDS)}


class BashfleetEnvironment:
    """A mini-swe-agent environment whose commands run in a bashfleet workspace."""

    def __init__(self, *, config_class: type[BashfleetEnvironmentConfig] = (
                 BashfleetEnvironmentConfig), **kwargs: Any) -> None:
        self.config = config_class(**kwargs)
        self._fleet = Fleet(**self.config.fleet_kwargs())
        try:
            self.workspace = self._fleet.workspace(**self.config.create_kwargs())
        except BaseException:
            self._fleet.close()
            raise
        self._lease = LeaseKeeper(self.workspace.renew, self.workspace.view.ttl_s).start()
        self._uname: dict[str, str] | None = None
        self._closed = False

    def execute(self, action: dict[str, Any], cwd: str = "", *,
                timeout: int | None = None) -> dict[str, Any]:
        """Run `action["command"]` in the workspace (see the module's docstring)."""
        command = str(action.get("command", ""))
        seconds = timeout or self.config.timeout
        if not command.strip():
            output: dict[str, Any] = {"output": "", "returncode": 0, "exception_info": ""}
        else:
            try:
                result = self.workspace.run(
                    command, cwd=cwd or self.config.cwd or None, env=self.config.env,
                    timeout=seconds, policy=policy(), output="full", check=False)
                output = observation(command, result, seconds)
            except BashfleetError as exc:
                output = failure("", exc, type(exc).__name__)
        submitted = submission(output)
        if submitted is not None:
            raise Submitted({"role": "exit", "content": submitted,
                             "extra": {"exit_status": "Submitted", "submission": submitted}})
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The config, the host's `uname` fields, the workspace, then `kwargs`."""
        place = {"workspace": self.workspace.id, "host": self.workspace.host,
                 "cwd": self.config.cwd or self.workspace.path}
        found: dict[str, Any] = recursive_merge(
            self.config.model_dump(), self._host_uname(), place, kwargs)
        return found

    def _host_uname(self) -> dict[str, str]:
        if self._uname is None:
            result = self.workspace.run("uname -s; uname -n; uname -r; uname -v; uname -m",
                                        check=False)
            self._uname = uname_vars(result.stdout)
        return self._uname

    def serialize(self) -> dict[str, Any]:
        """What the trajectory records of the environment."""
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{type(self).__module__}.{type(self).__name__}",
                    "workspace": {"id": self.workspace.id, "host": self.workspace.host,
                                  "path": self.workspace.path},
                }
            }
        }

    def cleanup(self) -> None:
        """Delete the workspace (its processes and files) and close the fleet client."""
        if self._closed:
            return
        self._closed = True
        self._lease.stop()
        try:
            self.workspace.delete()
        except BashfleetError:
            pass  # its host reaps it when its TTL passes unused
        finally:
            self._fleet.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.cleanup()
