#!/usr/bin/env python3
"""Write the docs' generated sections (connection tables, example DAGs, error tables) into the Markdown pages.

Run it after changing a connection form, an error message, a ``[tao]`` option or an example DAG:
``python scripts/docs-generate.py`` (``--check``: only list the stale pages, exit 1 if any).
See ``docs/_ext/generated_sections.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "docs" / "_ext")]

from generated_sections import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
