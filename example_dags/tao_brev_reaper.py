"""The Brev cost guard: every hour, delete the GPU instances this provider created whose lease has run out or whose
task has finished -- the ones a crashed worker, a killed triggerer or a lost Airflow left running.

Every instance the ``brev`` platform creates carries a lease on the instance itself (``~/.tao-brev/lease.json``:
its creation time, ``lease_hours`` from the connection or the job, and the dag / task / run that owns it).
``reap`` lists the instances with one ``brev ls --json``, reads each running instance's lease with one ``brev exec``,
asks Airflow for the state of the owning task instance, and deletes (plain ``brev delete <name>``) those whose lease
expired or whose task is ``success``, ``failed``, ``skipped``, ``upstream_failed`` or ``removed``. An expired
instance whose task still runs is not pulled from under it: its jobs are canceled (the task fails with
``ERR_CANCELED`` and deletes the instance; the next run deletes it if the task never resumes). An instance without
this provider's lease -- one you made yourself, or one an ``instance_id`` names -- is never touched. The task log has
one line per instance: what was done and why. ``airflow tao reap`` (``--dry-run`` to look first) runs the same guard
from the command line.

Uses the same ``tao_brev`` connection as the training DAGs (``TAO_BREV_CONN_ID`` overrides it).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import dag, get_current_context, task

CONN_ID = os.environ.get("TAO_BREV_CONN_ID", "tao_brev_default")


@dag(
    dag_id="tao_brev_reaper",
    schedule="@hourly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
    tags=["tao", "brev", "maintenance"],
)
def tao_brev_reaper():
    @task
    def reap() -> list[dict[str, str]]:
        """Delete expired or orphaned instances of this provider; returns every decision."""
        from airflow_provider_tao.hooks.brev import BrevHook
        from airflow_provider_tao.hooks.brev.lease import task_state_lookup

        decisions = BrevHook(conn_id=CONN_ID).reap(task_state=task_state_lookup(get_current_context()["ti"]))
        deleted = [d.instance for d in decisions if d.action == "deleted"]
        print(f"Deleted {len(deleted)} instance(s): {', '.join(deleted) or 'none'}")
        return [{"instance": d.instance, "action": d.action, "reason": d.reason} for d in decisions]

    reap()


tao_brev_reaper()
