"""Sphinx configuration of cyto's documentation (see docs/README.md: why Sphinx, MyST and furo,
and how to build). The pages are Markdown (MyST); the API reference is autodoc over docstrings."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # the checkout's cyto, also without an editable install

import cyto  # noqa: E402

project = "cyto"
author = "cyto developers"
copyright = "cyto developers, Apache-2.0"  # noqa: A001 (Sphinx's name for it)
release = version = cyto.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
root_doc = "index"
# docs/README.md is about building this site (GitHub shows it in the folder), not a page of it;
# the images and the scripts that draw them are no sources either (only .md files are)
exclude_patterns = ["_build", "README.md", ".*"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# the API reference: Google-style docstrings, signatures as written (no module paths in types)
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
add_module_names = False

html_theme = "furo"
html_title = f"cyto {release}"
html_static_path: list[str] = []
