"""README and docs/: README short enough to read in ten minutes, every page of docs/
reachable from it, every link landing, every example at least well-formed (the ones a
fleet can run as written, tests/e2e/test_readme.py runs)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]

#: README's length, at most: what it is, the two commands, an example a side, a paragraph
#: per capability, the life of a call. The rest is in docs/.
README_MAX_LINES = 300

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """`text` without its fenced blocks and inline code, where links are not links."""
    text = re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def links(page: Path) -> list[str]:
    return [target for target in LINK.findall(prose(page.read_text(encoding="utf-8")))
            if not re.match(r"[a-z]+:", target)]  # not https:, mailto:


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in prose(page.read_text(encoding="utf-8"))
            .splitlines() if line.startswith("#")}


def blocks(language: str) -> list[tuple[Path, str]]:
    """Every ```LANGUAGE block of the pages: its page and its text."""
    found = []
    for page in PAGES:
        for match in re.finditer(rf"^```{language}\n(.*?)^```$", page.read_text(encoding="utf-8"),
                                 flags=re.M | re.S):
            found.append((page, match.group(1)))
    return found


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert 50 < len(lines) <= README_MAX_LINES


def test_readme_links_every_page_of_docs_and_only_pages_that_exist() -> None:
    linked = {target.split("#")[0] for target in links(README) if target.startswith("docs/")}
    pages = {f"docs/{page.name}" for page in DOCS.glob("*.md")}
    assert len(pages) >= 10
    assert linked == pages, (sorted(linked - pages), sorted(pages - linked))


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_link_lands(page: Path) -> None:
    targets = links(page)
    if page == README:
        assert targets  # a README without links would pass for the wrong reason
    for target in targets:
        path, _, anchor = target.partition("#")
        landing = (page.parent / path).resolve() if path else page
        assert landing.exists(), f"{page.name}: {target} does not exist"
        if anchor and landing.suffix == ".md":
            assert anchor in anchors(landing), f"{page.name}: no heading #{anchor} in {path}"


def test_the_python_examples_parse() -> None:
    examples = blocks("python")
    assert len(examples) >= 11  # the pages' python examples: none may drop out unseen
    for page, text in examples:
        try:
            compile(text, page.name, "exec",
                    flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        except SyntaxError as exc:
            pytest.fail(f"{page.name}: {exc}\n{text}")


def test_the_bash_examples_parse() -> None:
    bash = shutil.which("bash")
    assert bash is not None
    examples = blocks("bash")
    assert len(examples) >= 8  # the same for bash
    for page, text in examples:
        done = subprocess.run([bash, "-n"], input=text, capture_output=True, text=True,
                              timeout=10, check=False)
        assert done.returncode == 0, f"{page.name}: {done.stderr}\n{text}"


@pytest.mark.parametrize(("heading", "page"), [
    ("The life of a call", "README.md"),
    ("Two commands", "README.md"),
    ("Owners and keys", "docs/security.md"),
    ("Isolation", "docs/security.md"),
    ("Control plane under attack", "docs/performance.md"),
    ("Scaling", "docs/performance.md"),
    ("Reliability", "docs/operations.md"),
    ("Redis Sentinel", "docs/redis.md"),
])
def test_sections_are_where_readme_and_the_code_say(heading: str, page: str) -> None:
    assert slug(heading) in anchors(ROOT / page)


def test_the_audit_table_is_whole() -> None:
    text = (DOCS / "security.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+(?:\.\w+)?) \|", text, flags=re.M)
    assert {"1", "11", "20.1", "27.1", "28.5", "34.1", "34.20"} <= set(rows)
    assert len(rows) == len(set(rows)) >= 50


#: A test a page names: `tests/…/test_x.py::test_y`, `test_x.py::test_y*`, or `::test_y`
#: after a file named earlier in the same table cell (the name may end or start with `*`).
TEST_REFERENCE = re.compile(r"((?:tests/[\w/]+/)?test_\w+\.py)?::(\*?\w+\*?)")


def defined_tests(file_name: str) -> set[str] | None:
    """The test functions of the test file `file_name` (a path under tests/, or a bare
    name: every file of that name under tests/), or None when there is no such file."""
    found = ([ROOT / file_name] if "/" in file_name
             else list((ROOT / "tests").rglob(file_name)))
    found = [path for path in found if path.is_file()]
    if not found:
        return None
    return {node.name for path in found
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name.startswith("test")}


def test_every_test_the_pages_name_exists_where_they_say() -> None:
    missing = []
    for page in PAGES:
        for line in page.read_text(encoding="utf-8").splitlines():
            for cell in line.split("|"):
                current: str | None = None
                for file_name, name in TEST_REFERENCE.findall(cell):
                    current = file_name or current
                    if current is None:
                        continue
                    tests = defined_tests(current)
                    pattern = re.compile(re.escape(name).replace(r"\*", r"\w*"))
                    if tests is None or not any(pattern.fullmatch(t) for t in tests):
                        missing.append(f"{page.name}: {current}::{name}")
    assert not missing, "\n".join(missing)
