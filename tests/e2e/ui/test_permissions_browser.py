"""The TAO plugin's permissions as a person with a restricted role sees them (issue 38 point 3), in headless Chromium:
a ``viewer`` who may read the DAGs but not their task logs nor their XComs sees a job in the TAO jobs view, and on
its job page neither the job's log nor what its XCom says (connection, platform ids, results folder); an ``admin``
of the same API server sees all of it.

``airflow standalone`` always runs Airflow's plain simple auth manager (whose roles all read logs), so a second
``airflow api-server`` on the shared standalone's database serves the same plugin with an auth manager that has such
a role (``restricted_auth.py``). Screenshots: ``build/test-output/browser-permissions/``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_provider_tao.links import job_page_path
from airflow_provider_tao.plugins.permissions import HIDDEN
from tests.e2e.airflow_harness import AirflowClient, AirflowStandalone, free_ports, wait_until
from tests.e2e.ui.test_browser import browser, page  # noqa: F401  (the shared Chromium fixtures)

REPO = Path(__file__).resolve().parents[3]
SHOTS = REPO / "build" / "test-output" / "browser-permissions"
PASSWORDS = {"reader": "reader-pw-1", "admin": "admin-pw-1"}
DAG_ID, TASK_ID = "tao_ui_two_platforms", "train_local"


@pytest.fixture(scope="module")
def restricted_api(airflow_standalone: AirflowStandalone, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a second API server on the standalone's database whose ``reader`` (role ``viewer``) may read DAGs
    but not their task logs nor XComs; ``admin`` may do everything."""
    home = tmp_path_factory.mktemp("restricted-api")
    (home / "passwords.json").write_text(json.dumps(PASSWORDS))
    port = free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    env = {
        **airflow_standalone.env,
        "AIRFLOW__CORE__AUTH_MANAGER": "tests.e2e.ui.restricted_auth.DagReadOnlyViewerAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "reader:viewer,admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": url,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), airflow_standalone.env.get("PYTHONPATH", "")) if p),
    }
    with (home / "api-server.log").open("wb") as log:
        server = subprocess.Popen(
            [airflow_standalone.airflow_bin, "api-server", "--port", str(port), "--host", "127.0.0.1", "--workers",
             "1", "--apps", "core"],
            env=env, cwd=home, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_until(
            lambda: server.poll() is None and _answers(f"{url}/api/v2/monitor/health"),
            timeout=180,
            message=lambda: (
                f"the restricted API server did not start:\n{(home / 'api-server.log').read_text()[-3000:]}"
            ),
        )
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _logged_in(tab: Any, url: str, user: str) -> Any:
    token = httpx.post(f"{url}/auth/token", json={"username": user, "password": PASSWORDS[user]}, timeout=30)
    token.raise_for_status()
    tab.context.add_cookies([{"name": "_token", "value": token.json()["access_token"], "url": url}])
    return tab


def test_a_role_without_task_logs_or_xcoms_sees_no_log_and_no_xcom_value(
    page: Any,  # noqa: F811
    ui_dags: AirflowClient,
    request: pytest.FixtureRequest,
) -> None:
    run_id = ui_dags.trigger_dag_run(DAG_ID)
    restricted_api: str = request.getfixturevalue("restricted_api")  # starts while the run's job runs
    ui_dags.wait_for_task_instance(DAG_ID, run_id, TASK_ID, ["success"], timeout=180, fail_states=["failed"])
    job_id = ui_dags.get_xcom(DAG_ID, run_id, TASK_ID)["job_id"]
    SHOTS.mkdir(parents=True, exist_ok=True)
    job_page = restricted_api + job_page_path(DAG_ID, run_id, TASK_ID)

    reader = _logged_in(page, restricted_api, "reader")
    reader.goto(f"{restricted_api}/tao/jobs?dag_id={DAG_ID}")
    reader.locator("tr", has_text=job_id).wait_for()  # DAG read: the job is listed
    reader.screenshot(path=str(SHOTS / "01-reader-jobs-view.png"))
    reader.goto(job_page)
    reader.get_by_role("heading", name=f"TAO job {job_id}").wait_for()
    text = reader.locator("body").inner_text()
    assert f"needs permission to read the task logs of DAG {DAG_ID}" in text
    assert "step 1" not in reader.locator("pre.log").inner_text()
    assert HIDDEN in text and "Log file" not in text and f"/{job_id}" not in text.replace(f"TAO job {job_id}", "")
    reader.screenshot(path=str(SHOTS / "02-reader-job-page.png"), full_page=True)
    reader.goto(f"{restricted_api}/tao/api/jobs?dag_id={DAG_ID}&q={job_id}")
    (row,) = json.loads(reader.locator("body").inner_text())["jobs"]
    assert (row["conn_id"], row["backend_job_id"], row["results_dir"]) == (HIDDEN, HIDDEN, HIDDEN)

    reader.context.clear_cookies()
    admin = _logged_in(reader, restricted_api, "admin")
    admin.goto(job_page)
    admin.get_by_role("heading", name=f"TAO job {job_id}").wait_for()
    assert "step 1" in admin.locator("pre.log").inner_text() and "Log file" in admin.locator("body").inner_text()
    admin.screenshot(path=str(SHOTS / "03-admin-job-page.png"), full_page=True)
