"""Operator extra links: the job on its platform, and its results.

Airflow 3 computes a link on the worker after each run of the task -- also the one that ends in DEFERRED -- and
keeps it as an XCom; the operator pushes what the links need before it defers, so both work while the job runs. A
run that submitted nothing has no link, and looks up nothing (a missing XCom is an error line in the task log).
A platform with a web console (Lepton, Brev, a Kubernetes dashboard) gives its job page through
``TAOPlatformHook.job_url``; the others link to the provider's job page in Airflow (the TAO plugin), which says
where the job is on its platform and shows its log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

#: XCom keys the operator pushes right after submission, before deferring, so links work while deferred.
XCOM_JOB_ID = "tao_job_id"
XCOM_RESULTS_DIR = "tao_results_dir"
XCOM_CONSOLE_URL = "tao_console_url"
#: Where the TAO plugin's FastAPI app is mounted in the API server.
PLUGIN_URL_PREFIX = "/tao"


def job_page_path(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """Path (under the API server's root) of the provider's page of a task instance's job."""
    path = f"{PLUGIN_URL_PREFIX}/jobs/{quote(dag_id, safe='')}/{quote(run_id, safe='')}/{quote(task_id, safe='')}"
    return path if map_index < 0 else f"{path}?map_index={map_index}"


def _nothing_submitted(operator: BaseOperator) -> bool:
    """The task's run that just ended submitted no job (bad input, a refused submission): none of the XComs the
    links read exists, and every lookup of a missing XCom is an error line in the task log."""
    return getattr(operator, "_handle", False) is None


def _job_page(ti_key: TaskInstanceKey) -> str:
    from airflow.sdk import conf

    base = str(conf.get("api", "base_url", fallback="") or "").rstrip("/")
    return base + job_page_path(ti_key.dag_id, ti_key.run_id, ti_key.task_id, ti_key.map_index)


def safe_url(url: str) -> str:
    """``url`` when it is a web link (http, https, or a path of this server), else "" -- no ``javascript:``, no
    ``//host`` or ``/\\host`` (browsers read both as another host), no control characters or blanks (browsers drop
    them before reading the scheme: ``java\\tscript:``)."""
    if not isinstance(url, str) or any(ord(char) <= 0x20 or ord(char) == 0x7F or char == "\\" for char in url):
        return ""
    if url.lower().startswith(("http://", "https://")):
        return url
    return url if url.startswith("/") and not url.startswith("//") else ""


class TAOJobLink(BaseOperatorLink):
    """The job on its platform: its console page where the platform has one, else the provider's job page."""

    name = "TAO job"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        if _nothing_submitted(operator):
            return ""
        if url := safe_url(str(XCom.get_value(key=XCOM_CONSOLE_URL, ti_key=ti_key) or "")):
            return url  # a javascript: console URL (from whoever edits the connection) is no link
        return _job_page(ti_key) if XCom.get_value(key=XCOM_JOB_ID, ti_key=ti_key) else ""


class TAOResultsLink(BaseOperatorLink):
    """The job's results: the S3 console for ``s3://`` results, else the results part of the job page."""

    name = "TAO results"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        if _nothing_submitted(operator):
            return ""
        results_dir = XCom.get_value(key=XCOM_RESULTS_DIR, ti_key=ti_key)
        if not results_dir:
            return ""
        return safe_url(results_link(str(results_dir))) or _job_page(ti_key) + "#results"


def results_link(uri: str) -> str:
    """A web link of a results location: the S3 console for ``s3://bucket/key``, http(s) URIs as they are, else ""."""
    from urllib.parse import quote

    if uri.startswith(("http://", "https://")):
        return uri
    if uri.startswith("s3://"):
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        prefix = quote(key.rstrip("/") + "/", safe="/") if key else ""
        return f"https://s3.console.aws.amazon.com/s3/buckets/{quote(bucket)}?prefix={prefix}"
    return ""
