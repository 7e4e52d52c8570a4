"""The orphan sweeper: every 5 minutes, cancel the TAO jobs no Airflow task watches any more.

Airflow does not always tell a task that it was killed: a task marked failed (or cleared) in the first seconds after
it deferred, before a triggerer picked its trigger up, gets no ``on_kill``, so its job keeps running; a worker or a
triggerer host can die for good. The sweeper asks every ``tao_*`` connection in use for the jobs this provider started
that still run -- ONE list call per connection -- and cancels, through the same cancel routine as the task's own
``on_kill``, every job whose task instance is no longer running or deferred and whose task kept
``cancel_on_kill=True`` (plus any job past its lease or its task's deadline). It never touches a job of a live task,
a job whose task set ``cancel_on_kill=False``, or a job this Airflow has no record of. The task log has one line per
job (and per Brev instance, whose leases it reaps too): what was done and why; the task's XCom lists them all.

It is ``airflow tao reap`` run by the worker. Airflow 3 keeps task code away from the metadata database, so the sweep
is given the database's URL through a connection made for it, ``tao_metadata_db`` (extra ``sql_alchemy_conn``: the
value of ``[database] sql_alchemy_conn``), and the worker must be able to reach the database. Any task can read any
connection in Airflow 3, so that connection gives the database to every DAG author: use this DAG only where they are
all trusted with it. Everywhere else run the same sweep OUTSIDE task code instead -- ``airflow tao reap --every 5`` as
a service beside the scheduler (a docker-compose service, a Kubernetes sidecar, a systemd unit), which needs no
connection and no worker access to the database -- and leave this DAG off (see ``docs/security.md``). Trigger it with
``{"dry_run": true}`` to see what it would cancel.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import Param, dag, task


@dag(
    dag_id="tao_orphan_sweeper",
    schedule=timedelta(minutes=5),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params={
        "dry_run": Param(False, type="boolean", description="Decide and report; cancel nothing"),
        "min_age_minutes": Param(0, type="number", minimum=0, description="Keep jobs younger than this"),
        "metadata_conn_id": Param(
            "tao_metadata_db", type="string", description="The connection holding the metadata database's URL"
        ),
    },
    default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
    tags=["tao", "maintenance"],
)
def tao_orphan_sweeper():
    @task(execution_timeout=timedelta(minutes=15))
    def sweep(params: dict | None = None) -> list[dict]:
        """Cancel the orphans of every connection; returns every decision with its reason."""
        from airflow_provider_tao.sweeper import sweep_from_a_task

        params = params or {}
        return sweep_from_a_task(
            dry_run=bool(params.get("dry_run")),
            min_age_minutes=float(params.get("min_age_minutes") or 0),
            metadata_conn_id=str(params.get("metadata_conn_id") or "tao_metadata_db"),
        )

    sweep()


tao_orphan_sweeper()
