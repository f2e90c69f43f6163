"""README's examples, and those of docs/ this file names, run as written: a newcomer
copies them line by line into a shell (or a Python file) on a machine with nothing but the
installed package, and every line does what its comment says, on the fleet the CLI
block's first line brings up, or on one shaped as the quickstart's."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from .helpers import Cli, bashfleet_command, kill_recorded, local_fleet

ROOT = Path(__file__).resolve().parents[2]
#: README, then every page of docs/ (scripts/test_installed.sh copies both beside the tests).
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: The examples this file runs, each a fenced block named by its language and first line.
RUN = [
    ("bash", "bashfleet up --hosts a,b"),  # README: the CLI
    ("python", "import threading"),  # README: the Python API
    ("python", "from bashfleet.client import CallNotRun"),  # docs/api.md: a call not run
    ("python", "from pathlib import Path"),  # docs/workspaces.md: a workspace and its files
]


def fenced_blocks() -> list[tuple[Path, str, list[str]]]:
    """Every fenced block of PAGES: its page, its language (after the fence), its lines."""
    found = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        start = None
        for i, line in enumerate(lines):
            if line.startswith("```") and start is None:
                start, language = i, line[3:].strip()
            elif line == "```" and start is not None:
                found.append((page, language, lines[start + 1:i]))
                start = None
    return found


def example(language: str, first_line: str) -> list[str]:
    """The lines of the one ```LANGUAGE block of PAGES that starts with `first_line`."""
    matches = [lines for _, lang, lines in fenced_blocks()
               if lang == language and lines and lines[0].startswith(first_line)]
    assert len(matches) == 1, f"{len(matches)} ```{language} blocks start with {first_line!r}"
    return matches[0]


def test_every_example_this_file_runs_is_on_a_page_once() -> None:
    assert len(PAGES) >= 10, PAGES  # docs/ is there, not only README
    assert len([example(language, first) for language, first in RUN]) == len(RUN) == 4


def run_lines(lines: list[str], cwd: Path, env: dict[str, str]) -> list[tuple[int, str]]:
    """Each line in one bash, as typed at a prompt; (status, output) of each."""
    marker = "@@status"
    script = "".join(f"{line}\necho \"{marker} $?\"\n" for line in lines)
    done = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600, check=False, stdin=subprocess.DEVNULL)
    pieces = re.split(rf"^{marker} (\d+)\n", done.stdout, flags=re.M)
    results = [(int(status), output) for output, status in zip(pieces[::2], pieces[1::2],
                                                                 strict=False)]
    assert len(results) == len(lines), done.stdout + done.stderr
    return results


@pytest.mark.timeout(300)  # two fleets started (the quickstart's, the block's) and 17 CLI runs
def test_the_example_block_runs_as_written(tmp_path: Path) -> None:
    lines = example(*RUN[0])
    cli = Cli(tmp_path / "state")
    env = dict(cli.env)
    bin_dir = str(Path(bashfleet_command()[0]).parent)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', os.defpath)}"
    env["XDG_STATE_HOME"] = str(tmp_path / "xdg")
    home = tmp_path / "home"
    home.mkdir()
    try:
        # After the quickstart, as README says: its fleet (one host, `local`) runs first.
        quickstart = cli("up", "--detach", "--no-flower", timeout=120)
        assert quickstart.returncode == 0, quickstart.stderr + quickstart.stdout
        results = dict(zip(lines, run_lines(lines, home, env), strict=True))
    finally:
        cli("down", timeout=120)
        kill_recorded(cli)
    by_start = {line.split("#")[0].strip(): result for line, result in results.items()}

    def result(prefix: str) -> tuple[int, str]:
        return next(r for line, r in by_start.items() if line.startswith(prefix))

    expected_failures = {"bashfleet run --host b": 3, "bashfleet run --json 'ls /nope'": 2}
    for line, (status, output) in by_start.items():
        wanted = next((code for prefix, code in expected_failures.items()
                       if line.startswith(prefix)), 0)
        assert status == wanted, f"{line!r} exited {status}: {output}"
    assert result("bashfleet run --follow")[1].splitlines() == ["step 1", "step 2", "step 3"]
    job = result("J=$(")[1]
    assert job == ""  # the id went into J
    assert "started" in result('bashfleet check "$J"')[1]
    pwd, variable = result("bashfleet run --session s1 'pwd")[1].splitlines()
    assert pwd.endswith("/app") and variable == "test"
    assert (home / "report").read_text() == "all tests pass\n"
    # The block's last line, `down`, stopped all that `up` started: no process whose
    # environment names this test's directory is left (the fleet's all do).
    assert leftovers(str(tmp_path)) == []


def leftovers(marker: str) -> list[str]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid != os.getpid() and any(marker in value
                                               for value in proc.environ().values()):
                found.append(f"{proc.pid}: {proc.info['cmdline']}")
        except psutil.Error:
            continue
    return found


def test_the_block_starts_with_its_fleet_and_ends_it() -> None:
    lines = example(*RUN[0])
    commands = [shlex.split(line.split("#")[0])[:2] for line in lines]
    assert commands[0] == ["bashfleet", "up"] and commands[-1] == ["bashfleet", "down"]


def test_the_python_examples_run_as_written_after_the_quickstart(tmp_path: Path) -> None:
    # The quickstart's fleet: `bashfleet up`, one host of no label.
    first, second, workspace = ("\n".join(example(*which)) + "\n" for which in RUN[1:])
    project = tmp_path / "project"
    project.mkdir()
    with local_fleet(tmp_path / "state", "--no-flower") as cli:
        done = subprocess.run([sys.executable, "-c", first + second], env=cli.env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, check=False)
        files = subprocess.run([sys.executable, "-c", workspace], env=cli.env, cwd=project,
                               capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line]
    assert lines[0] == "0 42"
    assert lines[1] == "listening on 8000"
    assert lines[2].endswith("/app") and lines[3] == "2"
    assert lines[4] == "cancelled"
    assert lines[5].startswith("bad_cwd ") and "/nope" in lines[5]
    # The workspace example: built there, read, downloaded, a file up and back.
    assert files.returncode == 0, files.stderr
    assert files.stdout == "b'built\\n'\n"
    assert (project / "dist" / "out").read_text() == "built\n"
    assert (project / "copy.bin").read_bytes() == (project / "data.bin").read_bytes()
