"""What the `bashfleet` command loads before it does anything: `--help` and the parsing of
every command load argparse and the standard library, nothing of the fleet's (pydantic,
redis, Celery, the wire models, the worker). Checked with `python -X importtime`, which
names every module a process imports, not by timing (bench/bench_cli.py has the times).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence

import pytest

from bashfleet.client.cli import arguments

#: What no `--help` may load: the libraries of the fleet client and the worker, and the
#: client's own rooms past the command line.
HEAVY = ("pydantic", "pydantic_core", "pydantic_settings", "celery", "kombu", "redis",
         "cryptography", "psutil", "asyncio", "mcp", "anyio", "bashfleet.worker",
         "bashfleet.client.fleet", "bashfleet.client._core", "bashfleet.client._sync",
         "bashfleet.client._async", "bashfleet.client.dialects",
         "bashfleet.client.integrations", "bashfleet.client.mcp_server",
         "bashfleet.client.local", "bashfleet.client.errors")

#: The console script's own code (`bashfleet = "bashfleet.client.cli:main"`).
ENTRY = "import sys; from bashfleet.client.cli import main; sys.exit(main())"


def imported(*argv: str) -> list[str]:
    """Every module `bashfleet ARGV` imports, as `python -X importtime` names them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BASHFLEET_")}
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", ENTRY, *argv],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    modules = [line.rsplit("|", 1)[1].strip() for line in lines[1:]]  # [0] is the header
    assert "bashfleet.client.cli.arguments" in modules, done.stderr[-3000:]
    return modules


def _within(module: str, name: str) -> bool:
    return module == name or module.startswith(name + ".")


def _commands(parser: argparse.ArgumentParser) -> Iterator[tuple[list[str], str | None]]:
    """Every leaf command of the tree (`["workspace", "create"]`) and its `func`."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        yield [], parser.get_default("func")
        return
    for name, child in subparsers[0].choices.items():
        for path, func in _commands(child):
            yield [name, *path], func


@pytest.mark.parametrize("argv", [
    ["--help"], ["run", "--help"], ["workspace", "create", "--help"], ["mcp", "--help"],
    ["swerex", "--help"], ["images", "pull", "--help"],
])
def test_help_loads_nothing_of_the_fleet(argv: list[str]) -> None:
    modules = imported(*argv)
    assert [m for m in modules if any(_within(m, name) for name in HEAVY)] == []
    # Nor any command's own module: each loads when its command runs.
    assert [m for m in modules if m.startswith("bashfleet.client.cli.")] == [
        "bashfleet.client.cli.arguments", "bashfleet.client.cli.common"]


def test_every_command_names_a_function_that_exists() -> None:
    """`func` is a name (`"run:cmd_run"`), imported when the command is chosen: a typo
    would show only when someone runs it."""
    commands = list(_commands(arguments.build_parser()))
    assert len(commands) > 30
    for path, func in commands:
        if path[0] in arguments.WORKER_SIDE:
            assert func is None, path  # the worker's own module parses its arguments
            continue
        assert isinstance(func, str), path
        assert callable(arguments.command(func)), (path, func)



def _options(parser: argparse.ArgumentParser) -> list[Sequence[str]]:
    return [action.option_strings or [action.dest] for action in parser._actions]


@pytest.mark.parametrize(("argv", "chosen"), [
    (["run", "--workspace", "W", "true"], "run"), (["workspace", "ls"], "workspace"),
    (["--help"], None), (["-h", "run"], "run"),
])
def test_the_parser_of_argv_builds_the_options_of_its_command_alone(
    argv: list[str], chosen: str | None,
) -> None:
    full = dict(_leaf_parsers(arguments.build_parser()))
    asked = dict(_leaf_parsers(arguments.build_parser(argv)))
    assert asked.keys() == full.keys()  # every command listed, as `--help` shows them
    for path, parser in asked.items():
        if path.split()[1] == chosen:
            assert _options(parser) == _options(full[path]), path
        else:
            assert _options(parser) == [], path


def _leaf_parsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        yield parser.prog, parser
        return
    for child in subparsers[0].choices.values():
        yield from _leaf_parsers(child)


#: What `run`'s plain path (`bashfleet.client.cli.plain`, and `plain_image` for `run
#: --image`) may not load: the models and pydantic, the fleet client, redis-py, and
#: `dataclasses` (its `inspect` costs more than the call's round trip).
#: tests/integration/test_cli_imports.py and test_cli_plain_image.py run it on a fleet.
NOT_ON_PLAIN_RUN = ("pydantic", "pydantic_core", "pydantic_settings", "redis", "celery",
                    "kombu", "dataclasses", "inspect", "uuid", "bashfleet.worker.wire.models",
                    "bashfleet.worker.wire.control", "bashfleet.worker.engine",
                    "bashfleet.client.fleet", "bashfleet.client._sync",
                    "bashfleet.client._async", "bashfleet.client._core.messages",
                    "bashfleet.client._core.workspaces", "bashfleet.client._core.records")


def test_the_plain_run_path_loads_no_model_and_no_fleet_client() -> None:
    code = ("import bashfleet.client.cli.run, bashfleet.client.cli.plain, "
            "bashfleet.client.cli.plain_image")
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    modules = [line.rsplit("|", 1)[1].strip() for line in lines[1:]]
    assert {"bashfleet.client.cli.plain", "bashfleet.client.cli.plain_image",
            "bashfleet.client._core.sending", "bashfleet.worker.fleet.resp"} <= set(modules)
    assert [m for m in modules if any(_within(m, name) for name in NOT_ON_PLAIN_RUN)] == []
