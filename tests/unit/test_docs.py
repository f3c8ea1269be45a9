"""The documentation: generated pages match the code, every option written exists, the site
builds with warnings as errors."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

# options written in the docs that belong to other programs than cyto, each with why
NOT_CYTO = {
    "--check": "python docs/generate.py --check: name the generated pages that differ",
    "--keep-going": "sphinx-build: go on after a warning, to report them all (docs/README.md)",
    "--head": "ray start --head: the Ray cluster's head node (cohorts on Ray)",
    "--address": "ray start --address: a Ray worker node joins the head (cohorts on Ray)",
}


def _generator():
    spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generate():
    return _generator()


@pytest.mark.parametrize("page", ["reference/cli.md", "reference/config.md"])
def test_generated_pages_match_the_code(generate, page):
    committed = (DOCS / page).read_text() if (DOCS / page).is_file() else ""
    assert committed == generate.PAGES[page](), (
        f"docs/{page} differs from the code: run python docs/generate.py"
    )


def test_the_cli_page_has_every_command_and_option_and_no_markup(generate):
    page = generate.cli_page()
    commands = generate.cli_commands()
    assert len(commands) > 20
    for path, _cmd, _ctx in commands:
        assert f"## `{path}`" in page, path
    for option in generate.cli_options():
        assert option in page, option
    assert "[bold" not in page and "[/" not in page  # no rich markup leaks into the page
    assert "--top-k" in generate.cli_options() and "cyto score" in generate.cli_options()["--top-k"]


def test_the_config_page_has_every_method_field_and_preset(generate):
    import dataclasses

    from cyto.train.registry import get_method, method_names

    page = generate.config_page()
    for name in method_names():
        cfg = get_method(name).Config
        section = page.split(f"## `{name}`", 1)[1].split("\n## ", 1)[0]
        for field in dataclasses.fields(cfg):
            assert f"- `{field.name}` (" in section, (name, field.name)
        for preset in cfg.presets:
            assert f"- `{preset}`: " in section, (name, preset)
    # a source comment becomes the field's description
    assert "resize patches once at load time" in page


CODE = re.compile(r"```.*?```|``.+?``|`[^`\n]+`", re.S)
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def written_options(text: str) -> set[str]:
    """The ``--options`` in the code spans and blocks of a Markdown text."""
    return {m for block in CODE.findall(text) for m in OPTION.findall(block)}


def test_the_option_finder_reads_code_only():
    text = (
        "Use `cyto score s.ndpi --top-k 400`.\n```bash\ncyto train --set a=1 \\\n  --resume\n```\n"
    )
    assert written_options(text + "plain --prose-option") == {"--top-k", "--set", "--resume"}


def test_every_option_written_in_the_readme_and_docs_exists(generate):
    known = set(generate.cli_options()) | set(NOT_CYTO)
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    unknown = {
        f"{page.relative_to(ROOT)}: {option}"
        for page in pages
        if "_build" not in page.parts
        for option in written_options(page.read_text())
        if option not in known
    }
    assert sorted(unknown) == [], "options that no cyto command takes"


@pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("sphinx", "myst_parser", "furo")),
    reason="sphinx, myst-parser or furo is not installed (the docs extra: pip install -e "
    "'.[docs]'; the test extra has them)",
)
def test_the_site_builds_with_warnings_as_errors(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
        + ["-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert (tmp_path / "html" / "reference" / "api.html").is_file()
    api = (tmp_path / "html" / "reference" / "api.html").read_text()
    for name in ("load_model", "score_slide", "train", "export", "predict", "calibrate"):
        assert f'id="cyto.{name}"' in api, name  # autodoc found each public call


def test_every_environment_variable_cyto_reads_is_in_the_reference():
    """The remote variables (CYTO_REMOTE_TIMEOUT, CYTO_BEARER_TOKEN, CYTO_REMOTE_BLOCKS_MB,
    CYTO_READ_AHEAD_MB) were described in a how-to only, not in the reference of the
    environment (hostile round 30, 13): every ``CYTO_*`` name the package reads is listed."""
    root = Path(__file__).resolve().parents[2]
    read = {
        m
        for f in (root / "src" / "cyto").rglob("*.py")
        for m in re.findall(r"[\"'](CYTO_[A-Z_]+)[\"']", f.read_text())
    }
    listed = set(
        re.findall(r"`(CYTO_[A-Z_]+)", (root / "docs/reference/environment.md").read_text())
    )
    assert len(read) >= 9 and read - listed == set()
