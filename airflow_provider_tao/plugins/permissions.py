"""Who may see what in the TAO plugin: the same questions Airflow's own routes ask the auth manager.

Every route needs a logged-in user and shows only the DAGs that user may read (DAG ``GET``). A job's log is a task's
log: it needs ``TASK_LOGS`` (Airflow's log routes ask for it). What the job page and ``/tao/api/jobs`` read from a
task's XCom -- results folders, connection ids, the platform's ids, console links, outputs, where the job runs --
needs ``XCOM`` (Airflow's XCom routes ask for it). A viewer without them sees the job's state, GPUs and times only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Request

from airflow_provider_tao.jobindex import IndexedJob

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.models.base_user import BaseUser

#: What a job's handle shows instead of a value read from its XCom, to a viewer who may not read XComs.
HIDDEN = "hidden (needs permission to read this DAG's XComs)"
#: Handle fields that come from the task's XCom (results folders, connection ids, the platform's ids, links).
XCOM_HANDLE_FIELDS = ("conn_id", "backend_job_id", "results_dir", "console_url")


@dataclass
class Viewer:
    """The request's user and what they may see.

    :param dags: the DAGs the user may read.
    :param is_authorized: ``(access entity name, dag_id) -> bool``, the auth manager's answer.
    :param user: the auth manager's user (what the Cancel button asks about: may they edit the DAG).
    """

    dags: set[str]
    is_authorized: Callable[[str, str], bool]
    user: Any = None
    _answers: dict[tuple[str, str], bool] = field(default_factory=dict)

    def _may(self, entity: str, dag_id: str) -> bool:
        if dag_id not in self.dags:
            return False
        if (entity, dag_id) not in self._answers:
            self._answers[(entity, dag_id)] = bool(self.is_authorized(entity, dag_id))
        return self._answers[(entity, dag_id)]

    def may_read_logs(self, dag_id: str) -> bool:
        """Whether the user may read the task logs of ``dag_id`` (``DagAccessEntity.TASK_LOGS``)."""
        return self._may("TASK_LOGS", dag_id)

    def may_read_xcoms(self, dag_id: str) -> bool:
        """Whether the user may read the XComs of ``dag_id`` (``DagAccessEntity.XCOM``)."""
        return self._may("XCOM", dag_id)

    def shown(self, job: IndexedJob) -> IndexedJob:
        """``job`` as this user may see it: without what its XCom says when they may not read the DAG's XComs."""
        if self.may_read_xcoms(job.dag_id):
            return job
        handle = {**job.record.handle, **{name: HIDDEN for name in XCOM_HANDLE_FIELDS}}
        record = dataclasses.replace(job.record, handle=handle, outputs={}, history=[])
        return dataclasses.replace(job, record=record)


def _auth_manager_question(user: BaseUser) -> Callable[[str, str], bool]:
    """The auth manager's answer for ``user``, asked as Airflow's own routes ask it (the DAG's team included)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
    from airflow.models.dag import DagModel

    def ask(entity: str, dag_id: str) -> bool:
        details = DagDetails(id=dag_id, team_name=DagModel.get_team_name(dag_id))
        return get_auth_manager().is_authorized_dag(
            method="GET", access_entity=DagAccessEntity[entity], details=details, user=user
        )

    return ask


async def viewer(request: Request) -> Viewer:
    """The request's user and the DAGs they may read (401 without a valid login, as every Airflow route)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.core_api.security import bearer_scheme, get_user

    user: Any = await get_user(request, None, await bearer_scheme(request))
    dags = set(get_auth_manager().get_authorized_dag_ids(user=user, method="GET"))
    return Viewer(dags=dags, is_authorized=_auth_manager_question(user), user=user)


CurrentViewer = Annotated[Viewer, Depends(viewer)]
