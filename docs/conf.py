"""Sphinx configuration of the provider's docs (built in CI with warnings as errors: ``scripts/test.sh``).

Sphinx, as the official providers use, because the operator reference is generated from the ``:param:`` docstrings
with autodoc; pages are Markdown (MyST) so they read well on GitHub too.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS.parent), str(DOCS / "_ext")]
# autodoc imports the provider, which imports Airflow: give it a private home, never the user's
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="tao-docs-airflow-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

project = "airflow-provider-tao"
author = "airflow-provider-tao developers"
release = "0.1.0"
extensions = ["myst_parser", "sphinx.ext.autodoc", "tao_docs"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_ext"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": False}
html_theme = "alabaster"
html_theme_options = {"page_width": "1240px", "sidebar_width": "240px"}
smartquotes = False  # "--account" stays two dashes
html_title = "airflow-provider-tao"
# README sections included in the how-tos link to repository files (example DAGs), which are not doc pages
suppress_warnings = ["myst.xref_missing"]
