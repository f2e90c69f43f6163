"""Screenshots of Flower's pages in headless Chromium, to look at what an operator sees.

    .venv/bin/python scripts/flower_screenshot.py OUT_DIR [--demo]
    .venv/bin/python scripts/flower_screenshot.py OUT_DIR --url URL --user U --password P

With no --url, the Flower of the local fleet (`bashfleet up`) is used, with its password
from the fleet's state file. `--demo` first makes the calls that show what Flower tells
apart: a success, `exit 42`, a timeout kill, a bad cwd, a job that succeeds and one that
fails. Writes `tasks.png` and `workers.png` (and `tasks.html`, the page as rendered, for
a test to read) into OUT_DIR and prints their paths. Needs Chromium (`apt-get install
chromium`); each run uses a fresh profile, removed afterwards.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

#: Flags for a headless run that talks to nothing but the page (and needs no sandbox
#: setup, which a container may not allow).
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
    "--disable-dev-shm-usage", "--window-size=1500,1000",
    # Virtual time: the page's own requests (the task table is loaded by script) finish
    # before the picture is taken.
    "--virtual-time-budget=8000",
)
PAGES = ("tasks", "workers")


def chromium() -> str:
    """The Chromium (or Chrome) binary on PATH."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    sys.exit("no chromium on PATH: apt-get install chromium")


def with_credentials(url: str, user: str, password: str) -> str:
    """`url` with basic-auth credentials in it (Chromium sends them for the page)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}"))


def local_flower() -> tuple[str, str, str]:
    """URL, user and password of the local fleet's Flower."""
    from bashfleet.client.local import load_state  # noqa: PLC0415 - only without --url

    state = load_state()
    if state is None or not state.flower_url:
        sys.exit("no local fleet with Flower: run `bashfleet up` (or give --url)")
    return state.flower_url, state.flower_user or "", state.flower_password or ""


def demo() -> None:
    """Calls of every kind Flower tells apart (see the module)."""
    from bashfleet.client import Fleet  # noqa: PLC0415
    from bashfleet.worker.wire.models import Policy  # noqa: PLC0415

    with Fleet() as fleet:
        fleet.run("echo fine")
        fleet.run("exit 42")
        fleet.run("sleep 30", timeout=2, policy=Policy(name="cli", on_timeout="kill"))
        fleet.run("true", cwd="/nonexistent/dir")
        fleet.run("sleep 1", mode="background")
        fleet.run("sleep 1; exit 3", mode="background")
    time.sleep(4)  # the jobs end, and their ends reach Flower (within 2 s of the end)


def capture(binary: str, url: str, out: Path) -> list[Path]:
    """Screenshot each page (and keep the tasks page's rendered HTML); the files."""
    written = []
    with tempfile.TemporaryDirectory(prefix="bashfleet-chromium-") as profile:
        for page in PAGES:
            target = out / f"{page}.png"
            subprocess.run(
                [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                 f"--screenshot={target}", f"{url}/{page}"],
                check=True, capture_output=True, timeout=120,
            )
            written.append(target)
        dom = subprocess.run(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom",
             f"{url}/tasks"],
            check=True, capture_output=True, text=True, timeout=120,
        )
        html = out / "tasks.html"
        html.write_text(dom.stdout)
        written.append(html)
    return written


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="directory for the screenshots")
    parser.add_argument("--url", help="Flower's URL (default: the local fleet's)")
    parser.add_argument("--user", default="")
    parser.add_argument("--password", default="")
    parser.add_argument("--demo", action="store_true", help="make sample calls first")
    args = parser.parse_args(argv)
    url, user, password = (args.url, args.user, args.password) if args.url else local_flower()
    if args.demo:
        demo()
    args.out.mkdir(parents=True, exist_ok=True)
    if user:
        url = with_credentials(url, user, password)
    for path in capture(chromium(), url.rstrip("/"), args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
