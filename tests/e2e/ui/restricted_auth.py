"""An auth manager for the permissions browser test: Airflow's simple auth manager, whose ``viewer`` role reads
DAGs but neither their task logs nor their XComs -- a role a deployment makes with its own auth manager (FAB's
"can read on DAGs" without "can read on Task Logs" / "XComs"). ``airflow standalone`` always uses the plain simple
auth manager, so the test serves this one from a second ``airflow api-server`` on the standalone's database."""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

#: What the ``viewer`` role may not read.
WITHHELD = frozenset({DagAccessEntity.TASK_LOGS, DagAccessEntity.XCOM})


class DagReadOnlyViewerAuthManager(SimpleAuthManager):
    """The simple auth manager with a ``viewer`` role that may read DAGs but not their task logs nor XComs."""

    def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None) -> bool:
        if (user.role or "").upper() == "VIEWER" and access_entity in WITHHELD:
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
