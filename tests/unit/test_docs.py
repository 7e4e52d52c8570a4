"""The docs stay complete: every error message the code can raise has a fix on the troubleshooting page, every
platform has a how-to with its connection table, and the generated tables carry what the code declares."""

from __future__ import annotations

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
