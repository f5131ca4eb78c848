"""The README stays a short guide and the docs stay true to the code: the generated references
match the Typer app and the params schema, the results tables the committed metrics, and no
relative link points at nothing. (MkDocs's
own `--strict` build, anchors included, runs in the README's test command, not here.)"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", flags=re.M | re.S)
CODE_SPAN = re.compile(r"`[^`]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
EXTERNAL = ("http://", "https://", "mailto:", "#")


@pytest.mark.parametrize("generator", ["docs/generate.py", "docs/results.py"])
def test_generated_pages_are_up_to_date(generator):
    """The CLI and params references from the code; the results tables from the committed
    metrics (a new `dvc repro` that moves a number fails here until they are regenerated)."""
    result = subprocess.run(
        [sys.executable, generator, "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_is_at_most_300_lines():
    assert len((REPO / "README.md").read_text().splitlines()) <= 300


def relative_links(page: Path) -> list[str]:
    """The targets of a page's Markdown links that are files of this repository: code blocks
    and spans are left out, since `[x](y)` there is code, not a link."""
    text = CODE_SPAN.sub("", FENCE.sub("", page.read_text()))
    return [target for target in LINK.findall(text) if not target.startswith(EXTERNAL)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_relative_links_point_at_files(page):
    missing = [
        target
        for target in relative_links(page)
        if not (page.parent / target.split("#")[0]).exists()
    ]
    assert missing == [], f"{page.relative_to(REPO)} links to files that do not exist"
