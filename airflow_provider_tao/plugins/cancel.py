"""The job page's **Cancel** button: for the users who may edit the job's DAG, the same routine as ``airflow tao
cancel`` (:func:`airflow_provider_tao.canceling.cancel_as_person`), recorded as theirs (``ui:<user>``).

The button is a form that POSTs to ``/tao/jobs/<dag>/<run>/<task>/cancel`` with a token bound to the user and the
task instance (an HMAC with the API server's secret key): the UI authenticates with a cookie, which a page of another
site could make a browser send, but it cannot know the token (CSRF). The POST checks again that the user may edit
the DAG (``PUT`` on it, as the auth manager decides): a read-only user gets 403 and nothing is canceled.
"""

from __future__ import annotations

import hashlib
import hmac
import html
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException

from airflow_provider_tao.links import job_page_path

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.models.base_user import BaseUser

    from airflow_provider_tao.jobindex import IndexedJob


def may_cancel(user: BaseUser, dag_id: str) -> bool:
    """Whether ``user`` may edit ``dag_id`` (what canceling its task's job needs)."""
    from airflow.api_fastapi.app import get_auth_manager

    return dag_id in get_auth_manager().get_authorized_dag_ids(user=user, method="PUT")


def _secret() -> bytes:
    from airflow.configuration import conf

    secret = conf.get("api", "secret_key", fallback="") or conf.get("api_auth", "jwt_secret", fallback="")
    if not secret:
        raise HTTPException(500, "the API server has no [api] secret_key to protect the Cancel button with")
    return str(secret).encode()


def token(user: BaseUser, job: IndexedJob) -> str:
    """The form's token: the user and the task instance, signed with the API server's secret key."""
    subject = f"{user.get_id()}\n{job.dag_id}\n{job.run_id}\n{job.task_id}\n{job.map_index}"
    return hmac.new(_secret(), subject.encode(), hashlib.sha256).hexdigest()


def form(user: BaseUser, job: IndexedJob) -> str:
    """The Cancel button, for a user who may cancel a job that has not ended ("" otherwise)."""
    if job.state in ("Complete", "Error", "Canceled") or not may_cancel(user, job.dag_id):
        return ""
    action = job_page_path(job.dag_id, job.run_id, job.task_id) + "/cancel"
    action += f"?map_index={job.map_index}" if job.map_index >= 0 else ""
    e = html.escape
    return (
        f'<form method="post" action="{e(action)}" class="cancel">'
        f'<input type="hidden" name="token" value="{e(token(user, job))}">'
        '<button type="submit">Cancel this job</button> '
        '<span class="sub">its task fails with ERR_CANCELED, not retried</span></form>'
    )


def check(user: BaseUser, job: IndexedJob, given: str) -> None:
    """Refuse a cancel the user may not make (403) or that no form of theirs sent (403)."""
    if not may_cancel(user, job.dag_id):
        raise HTTPException(403, f"you may not edit DAG {job.dag_id}, so you may not cancel its jobs")
    if not hmac.compare_digest(given.encode(), token(user, job).encode()):
        raise HTTPException(403, "the cancel did not come from this job's page: open the page and press Cancel again")


def cancel(user: BaseUser, job: IndexedJob) -> dict[str, Any]:
    """Run ``airflow tao cancel``'s routine on ``job`` as ``ui:<user>``."""
    from airflow_provider_tao.canceling import cancel_as_person
    from airflow_provider_tao.hooks import get_platform_hook

    hook = get_platform_hook(job.platform, job.conn_id)
    hook.load_connection()
    return cancel_as_person(job, hook, f"ui:{user.get_name()}")
