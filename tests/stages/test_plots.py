"""`dvc plots show` offline: the repository's DVC config points the page at a template with the
plotting JavaScript inlined, so the page loads nothing from a CDN, and every plot renders."""

import json
import re
import shutil
import subprocess

import pytest
import yaml

from conftest import REPO, sh, use_repository_dvc_config

TEMPLATE = REPO / ".dvc" / "offline-plots.html"


@pytest.fixture(scope="module")
def plot_count(trained_project) -> int:
    """How many plots the page must draw: dvc.yaml's top-level ones, each titled; no curve
    is drawn on its own."""
    return len(yaml.safe_load((trained_project / "dvc.yaml").read_text())["plots"])


@pytest.fixture(scope="module")
def plots_page(trained_project, tmp_path_factory) -> str:
    project = tmp_path_factory.mktemp("plots") / "p"
    shutil.copytree(trained_project, project, ignore=shutil.ignore_patterns("__pycache__"))
    use_repository_dvc_config(project)
    sh(["dvc", "plots", "show", "--out", "dvc_plots"], project)
    return (project / "dvc_plots" / "index.html").read_text()


def test_the_page_loads_no_script_from_the_network(plots_page, plot_count):
    assert "window.vegaEmbed=" in plots_page  # DVC filled in the template with the bundle
    assert not re.search(r"<script[^>]*\bsrc=|<link\b", plots_page)
    assert plots_page.count("vegaEmbed('#") == plot_count  # one call per plot


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js to run the page's code")
def test_every_plot_renders_with_the_inlined_javascript(plots_page, plot_count, tmp_path):
    bundle = TEMPLATE.read_text().split("<script>", 1)[1].split("</script>", 1)[0]
    (tmp_path / "bundle.js").write_text(bundle)
    specs = re.findall(r"var spec = (.*?);\s*vegaEmbed", plots_page, flags=re.S)
    (tmp_path / "specs.json").write_text("[" + ",".join(specs) + "]")
    rendered = subprocess.run(
        ["node", str(REPO / "tests" / "render_plots.js"), "bundle.js", "specs.json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    paths = json.loads(rendered.stdout)
    assert len(paths) == len(specs) == plot_count
    assert min(paths) > 10  # axes, ticks and the curves themselves in every plot
