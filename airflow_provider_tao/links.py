"""Operator extra links: the job's page (or, on ``local``, its log file) in the Airflow UI."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

#: XCom keys the operator pushes right after submission, before deferring, so links work while deferred.
XCOM_JOB_ID = "tao_job_id"
XCOM_RESULTS_DIR = "tao_results_dir"
XCOM_CONSOLE_URL = "tao_console_url"


class TAOJobLink(BaseOperatorLink):
    """Link to the job on its platform's console (the log file of a ``local`` job)."""

    name = "TAO job"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        return XCom.get_value(key=XCOM_CONSOLE_URL, ti_key=ti_key) or ""
