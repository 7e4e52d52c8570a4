"""The docs stay complete: every error message the code can raise has a fix on the troubleshooting page, every
platform has a how-to with its connection table, and the generated tables carry what the code declares."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from airflow_provider_tao.failures import SUGGESTIONS
from airflow_provider_tao.hooks import PLATFORMS
from airflow_provider_tao.jobs import ErrClass

DOCS = Path(__file__).resolve().parents[2] / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import tao_docs  # noqa: E402  (the docs' Sphinx extension)


def test_every_error_message_has_a_fix() -> None:
    sites = tao_docs.message_sites()
    assert len(sites) > 150  # the scan sees the package (a broken scan would pass with nothing)
    missing = [f"{s.module}:{s.line} {s.kind}: {s.message}" for s in sites if not tao_docs.fix_of(s)]
    assert not missing, "add a fix to docs/_ext/tao_docs.py FIXES for:\n" + "\n".join(missing)


def test_no_fix_is_left_for_a_message_that_is_gone() -> None:
    sites = tao_docs.message_sites()
    stale = [fragment for fragment in tao_docs.FIXES if not any(fragment in s.message for s in sites)]
    assert not stale, f"FIXES entries whose message no longer exists: {stale}"


def test_the_scan_finds_every_kind_of_site() -> None:
    kinds = {site.kind for site in tao_docs.message_sites()}
    assert {"JobValidationError", "ConnectionProblem", "JobSubmitError", "AirflowFailException", "_fail"} <= kinds
    bad_input = [s for s in tao_docs.message_sites() if s.kind == "JobValidationError"]
    assert all(s.parameter and s.fix for s in bad_input)


def test_the_troubleshooting_page_renders_the_generated_tables() -> None:
    page = (DOCS / "troubleshooting.md").read_text()
    assert "```{tao-error-messages}" in page and "```{tao-error-classes}" in page
    table = tao_docs.error_messages_table()
    for site in tao_docs.message_sites():
        assert tao_docs._cell(site.message) in table
    classes = tao_docs.error_classes_table()
    for err_class in ErrClass:
        assert f"`{err_class.value}`" in classes and err_class in SUGGESTIONS


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_every_platform_has_a_how_to_with_its_connection_form(platform: str) -> None:
    page = DOCS / "howto" / f"{platform}.md"
    assert page.is_file(), f"docs/howto/{platform}.md is missing"
    conn_type = PLATFORMS[platform][0]
    text = page.read_text()
    assert f"```{{tao-connection-fields}} {conn_type}" in text
    assert "## A minimal DAG" in text and "## Failures you will see" in text
    assert f"howto/{platform}" in (DOCS / "index.md").read_text()


def test_the_connection_table_lists_every_field_and_hides_secrets_examples() -> None:
    from airflow_provider_tao.get_provider_info import CONNECTION_FORMS

    for conn_type, form in CONNECTION_FORMS.items():
        table = tao_docs.connection_fields_table(conn_type)
        for name, field in form()["conn-fields"].items():
            row = next(line for line in table.splitlines() if line.startswith(f"| `{name}` |"))
            assert field["label"] in row
            if field["schema"].get("format") == "password":
                assert "(secret)" in row


def test_html_in_a_message_is_text_in_the_table() -> None:
    assert tao_docs._cell("results in <root>/<id> | pipe") == "results in &lt;root&gt;/&lt;id&gt; \\| pipe"


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_every_how_to_shows_its_connection_as_a_variable_and_as_connections_add(platform: str) -> None:
    """The example's fields are fields of the platform's form, and the variable and the command make one connection."""
    import json
    import shlex

    from airflow.models.connection import Connection

    from airflow_provider_tao.get_provider_info import CONNECTION_FORMS

    conn_type = PLATFORMS[platform][0]
    assert f"```{{tao-connection-example}} {conn_type}" in (DOCS / "howto" / f"{platform}.md").read_text()
    form = CONNECTION_FORMS[conn_type]()
    example = tao_docs.CONNECTION_EXAMPLES[conn_type]
    hidden = set(form["ui-field-behaviour"]["hidden-fields"])
    assert not (set(example) - {"extra"}) & hidden, "the example sets a field the form hides"
    assert set(example["extra"]) <= set(form["conn-fields"])

    text = tao_docs.connection_example(conn_type)
    variable = re.search(r"^export (AIRFLOW_CONN_\w+)=(.*)$", text, re.M)
    assert variable
    from_env = Connection.from_json(shlex.split(variable.group(2))[0], conn_id="x")
    command = shlex.split(text[text.index("airflow connections add ") : text.rindex("```")].replace("\\\n", " "))
    flags = dict(zip(command[4::2], command[5::2], strict=True))
    assert variable.group(1) == f"AIRFLOW_CONN_{command[3].upper()}"
    assert flags.pop("--conn-type") == from_env.conn_type == conn_type
    assert json.loads(flags.pop("--conn-extra")) == from_env.extra_dejson == example["extra"]
    assert {k.removeprefix("--conn-"): v for k, v in flags.items()} == {
        k: str(getattr(from_env, k)) for k in ("host", "port", "login", "password") if k in example
    }


def test_the_reference_documents_every_platform_hook() -> None:
    reference = (DOCS / "reference.md").read_text()
    for _, class_path in PLATFORMS.values():
        assert f".. autoclass:: {class_path}" in reference


def test_a_module_path_in_the_messages_table_is_code_not_markdown() -> None:
    """``hooks/__init__.py`` rendered as plain Markdown reads as hooks/**init**.py."""
    rows = [line for line in tao_docs.error_messages_table().splitlines() if "__init__" in line]
    assert rows and all("`hooks/__init__.py` (" in row for row in rows)


def test_the_docs_name_no_file_the_repository_lacks_and_the_real_output_folders() -> None:
    from airflow_provider_tao.runner.job.paths import output_dir_name

    repo = DOCS.parent
    texts = [repo / "README.md", *DOCS.rglob("*.md"), *(repo / "airflow_provider_tao").rglob("*.py")]
    for path in texts:
        assert "DESIGN.md" not in path.read_text(), f"{path} names DESIGN.md, which the repository does not have"
    readme = (repo / "README.md").read_text()
    assert "<key>/" not in readme
    assert output_dir_name("train.results_dir", "config") == "train_results_dir" and "train_results_dir" in readme


def test_installation_is_the_first_page_and_shows_every_extra() -> None:
    import tomllib

    index = (DOCS / "index.md").read_text()
    assert index.index("installation") < index.index("howto/local")
    assert '```{include} ../README.md\n:start-after: "## Installation"' in (DOCS / "installation.md").read_text()
    readme = (DOCS.parent / "README.md").read_text()
    section = readme[readme.index("## Installation") : readme.index("## Your first DAG")]
    extras = tomllib.loads((DOCS.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in extras:
        assert f"| `{extra}` |" in section, f"the README's install table lacks the extra {extra!r}"
    for platform in PLATFORMS:
        assert f"| `{platform}` |" in section
    assert "brev` CLI" in section
