"""The docs read complete where people read them (issue 36 point 1): on the repository's page, without Sphinx. The
generated sections (connection tables, example DAGs, error tables) are written into the Markdown and must be what
the code renders now; no page leans on a directive a Markdown reader cannot run."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import generated_sections  # noqa: E402  (the docs' generator)

#: Directives whose text only Sphinx can produce (``toctree`` and ``eval-rst`` autodoc of the reference excepted).
SPHINX_ONLY = re.compile(r"^```\{(include|literalinclude|tao-[\w-]+)\}", re.M)


def test_every_generated_section_is_what_the_code_renders_now() -> None:
    stale = [str(page.relative_to(DOCS.parent)) for page in generated_sections.stale_pages()]
    assert not stale, f"stale generated docs sections in {stale}: run python scripts/docs-generate.py and commit"


def test_a_changed_connection_form_makes_its_page_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    page = DOCS / "howto" / "slurm.md"
    text = page.read_text()
    assert generated_sections.regenerated(text) == text
    real = generated_sections.GENERATORS["connection-fields"]
    monkeypatch.setitem(generated_sections.GENERATORS, "connection-fields", lambda t: real(t) + "| `new` | |\n")
    assert generated_sections.regenerated(text) != text
    assert "| `new` | |" in generated_sections.regenerated(text)


@pytest.mark.parametrize("page", sorted(p.name if p.parent == DOCS else f"howto/{p.name}" for p in DOCS.rglob("*.md")))
def test_no_page_needs_sphinx_to_show_its_text(page: str) -> None:
    text = (DOCS / page).read_text()
    assert not SPHINX_ONLY.search(text), f"docs/{page} uses {SPHINX_ONLY.search(text)[0]!r}: generate it instead"


@pytest.mark.parametrize("platform", ["slurm", "kubernetes"])
def test_the_how_to_reads_complete_on_the_repository(platform: str) -> None:
    """A new user's trial: the field table, the connection, the DAG and the behaviour are in the page's own text."""
    text = (DOCS / "howto" / f"{platform}.md").read_text()
    conn_type = f"tao_{platform}"
    assert f"| `results_{'root' if platform == 'slurm' else 'pvc'}` |" in text  # a row of the fields table
    assert f"export AIRFLOW_CONN_{conn_type.upper()}_DEFAULT=" in text and "airflow connections add" in text
    assert "```python\n" in text and "TAOSubmitOperator(" in text  # the DAG itself
    behaviour = text[text.index("## How it behaves, and its limits") : text.index("## Failures you will see")]
    assert len(behaviour.split()) > 200, "the behaviour section is empty"
    other = "brev" if platform == "slurm" else "lepton"
    assert f"The `{other}` platform" not in text  # another platform's section no longer rides along


def test_the_package_points_to_the_hosted_docs_built_by_read_the_docs() -> None:
    import tomllib

    import yaml

    project = tomllib.loads((DOCS.parent / "pyproject.toml").read_text())["project"]
    assert project["urls"]["Documentation"] == "https://airflow-provider-tao.readthedocs.io/"
    rtd = yaml.safe_load((DOCS.parent / ".readthedocs.yaml").read_text())
    assert rtd["version"] == 2 and rtd["sphinx"]["configuration"] == "docs/conf.py"
    assert rtd["sphinx"]["fail_on_warning"] is True


def test_the_slurm_how_to_has_the_admins_checklist() -> None:
    text = (DOCS / "howto" / "slurm.md").read_text()
    checklist = text[text.index("## What the cluster needs") : text.index("## Connection")]
    for item in (
        "`python3` >= 3.8 where the job runs",
        "the login nodes **and** every compute node",
        "~/.config/enroot/.credentials",
        "machine nvcr.io login $oauthtoken password <NGC API key>",
        "Pyxis and enroot on the compute nodes",
    ):
        assert item in checklist, item


def test_the_slurm_example_runs_one_gpu_on_one_node_with_the_operators_own_inputs() -> None:
    import ast

    tree = ast.parse((DOCS.parent / "example_dags" / "tao_slurm_train.py").read_text())
    (call,) = [
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "TAOSubmitOperator"
    ]
    kwargs = {k.arg: k.value for k in call.keywords}
    assert "inputs" in kwargs and "num_nodes" not in kwargs  # one node: the default
    assert "inputs" not in ast.unparse(kwargs["backend_details"])  # not backend_details={"inputs": ...}
    gpus = next(n for n in ast.walk(tree) if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "GPUS")
    assert "'TAO_SLURM_GPUS', '1'" in ast.unparse(gpus.value)


def test_the_readme_keeps_to_what_a_user_does() -> None:
    """Issue 36 point 7: internals (Brev's ssh config, OpenShift's admission, the runner's packaging, the triggerer's
    heap) live in the how-tos and the architecture page; the README links each how-to."""
    readme = (DOCS.parent / "README.md").read_text()
    assert len(readme.splitlines()) < 400
    for internal in ("OpenShift", "ssh_config", "~/.ssh/config", "runner.pyz", "freeze_triggerer_heap", "asyncssh"):
        assert internal not in readme, internal
    for platform in ("local", "slurm", "docker", "kubernetes", "lepton", "brev"):
        assert f"docs/howto/{platform}.md" in readme
    assert "docs/development.md" in readme and (DOCS / "development.md").is_file()
