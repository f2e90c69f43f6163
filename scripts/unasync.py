"""Generate the blocking fleet client from the asyncio one (httpcore's scheme).

The client's I/O layer is written once, for asyncio, in `client/_async/`; this script
writes its blocking twin, `client/_sync/`, by rewriting each module line by line:
`async`/`await` dropped, `AsyncX` names become `X`, `AsyncGenerator[Y, None]` becomes
`Generator[Y, None, None]`, `aclose`/`anext`/`__aenter__`... their blocking names (the
table below). Then the imports are sorted again (ruff's isort), since `bashfleet.client._sync`
sorts after `bashfleet.client._core` where `bashfleet.client._async` sorted before it. The output is
checked in; `tests/unit/test_unasync.py` fails when it differs from what this script
writes, so an edit of a generated file (or a forgotten run) never goes unnoticed.

What cannot be written the same way for both (events, slots, background work, three
Redis calls typed differently by redis-py) is in `concurrency.py`, written by hand in
both folders and left alone here.

    python scripts/unasync.py            # (re)write client/_sync/
    python scripts/unasync.py --check    # exit 1, naming the files that differ
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "client" / "_async"
TARGET = ROOT / "client" / "_sync"
#: Modules written by hand in both folders.
HAND_WRITTEN = frozenset({"__init__.py", "concurrency.py"})

#: (pattern, replacement), applied in this order to every line.
SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    (r"\bAsyncGenerator\[([^\[\]]*), None\]", r"Generator[\1, None, None]"),
    (r"\bAwaitable\[([^\[\]]+)\]", r"\1"),
    (r"^(from collections\.abc import .*)\bAwaitable, ", r"\1"),
    (r"\bclient\._async\b", "client._sync"),
    (r"\basync_redis_client\b", "redis_client"),
    (r"\basynccontextmanager\b", "contextmanager"),
    # `AsyncFleet` -> `Fleet`, but not after a dot: prose may name
    # `bashfleet.client.aio.AsyncFleet`.
    (r"(?<![.\w])Async([A-Z]\w*)", r"\1"),
    (r"\basync (def|with|for)\b", r"\1"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\baclose\b", "close"),
    (r"\banext\b", "next"),
)
_COMPILED = tuple((re.compile(pattern), replacement) for pattern, replacement in SUBSTITUTIONS)


def header(name: str) -> str:
    """The first line of a generated module."""
    return (f"# Generated from client/_async/{name} by scripts/unasync.py:\n"
            "# edit that file and run the script.\n")


def unasync_line(line: str) -> str:
    """One line of asyncio code as its blocking twin."""
    for pattern, replacement in _COMPILED:
        line = pattern.sub(replacement, line)
    return line


def unasync_text(text: str) -> str:
    """A module's text, line by line (imports not sorted yet)."""
    return "".join(unasync_line(line) for line in text.splitlines(keepends=True))


def sort_imports(text: str, filename: str) -> str:
    """`text` with its imports sorted as the project's ruff sorts them."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "I", "--fix-only", "--quiet",
         "--stdin-filename", filename, "-"],
        input=text, capture_output=True, text=True, check=True, cwd=ROOT,
    )
    return done.stdout


def generate(source: Path) -> str:
    """The blocking module generated from one asyncio module."""
    text = header(source.name) + unasync_text(source.read_text(encoding="utf-8"))
    return sort_imports(text, str((TARGET / source.name).relative_to(ROOT)))


def sources() -> list[Path]:
    """The asyncio modules to generate from."""
    return sorted(p for p in SOURCE.glob("*.py") if p.name not in HAND_WRITTEN)


def differing() -> list[str]:
    """The generated modules whose checked-in text is not what `generate` writes (or
    that are missing)."""
    found = []
    for source in sources():
        target = TARGET / source.name
        if not target.exists() or target.read_text(encoding="utf-8") != generate(source):
            found.append(str(target.relative_to(ROOT)))
    return found


def main(argv: list[str]) -> int:
    if "--check" in argv:
        stale = differing()
        for name in stale:
            print(f"{name} differs from what scripts/unasync.py generates", file=sys.stderr)
        return 1 if stale else 0
    for source in sources():
        (TARGET / source.name).write_text(generate(source), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
