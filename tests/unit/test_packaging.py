"""What the published package declares: its license (the file and the SPDX expression), where it lives, the Python
versions CI runs, extras that hold only what users need (the project's own tools are dependency groups), and a
README whose links work on PyPI, where relative links point nowhere."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
#: The project's own tools: never an extra a user could install.
DEV_TOOLS = {"pytest", "mypy", "ruff", "playwright", "psycopg2-binary", "moto", "hypothesis", "sphinx", "myst-parser"}


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~;\s]", requirement, maxsplit=1)[0].lower()


def test_the_license_is_apache_2_in_spdx_form_with_its_text() -> None:
    assert PROJECT["license"] == "Apache-2.0"  # the table form is deprecated (a warning per build)
    assert PROJECT["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    assert not any(c.startswith("License ::") for c in PROJECT["classifiers"])  # not beside an SPDX expression


def test_extras_are_for_users_and_the_tools_are_dependency_groups() -> None:
    extras = PROJECT["optional-dependencies"]
    assert set(extras) == {"s3", "slurm", "docker", "kubernetes", "lepton", "openlineage", "automl", "all"}
    published = {_name(r) for requirements in extras.values() for r in requirements}
    assert not published & DEV_TOOLS
    groups = {_name(r) for requirements in PYPROJECT["dependency-groups"].values() for r in requirements}
    assert groups >= DEV_TOOLS
    script = (REPO / "scripts" / "test.sh").read_text()
    assert '-e ".[all]" --group test --group docs' in script and 'pip>=25.1"' in script  # --group: pip 25.1


def test_classifiers_name_every_python_ci_runs() -> None:
    script = (REPO / "scripts" / "test.sh").read_text()
    ci = {"3.11"} | set(re.findall(r"python(3\.\d+)", script))
    assert ci == {"3.11", "3.12"}
    for version in ci:
        assert f"Programming Language :: Python :: {version}" in PROJECT["classifiers"]
    assert PROJECT["requires-python"] == ">=3.11"


def test_project_urls_and_every_readme_link_is_absolute() -> None:
    urls = PROJECT["urls"]
    assert {"Homepage", "Documentation", "Repository", "Issues"} <= set(urls)
    readme = (REPO / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert targets
    relative = [t for t in targets if not t.startswith(("https://", "http://"))]
    assert not relative, f"links PyPI cannot follow: {relative}"
    for target in targets:
        if target.startswith(urls["Repository"] + "/blob/main/"):
            assert (REPO / target.removeprefix(urls["Repository"] + "/blob/main/")).exists(), target
