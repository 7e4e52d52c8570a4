"""The provider as a person sees it: a real ``airflow standalone`` driven through headless Chromium (Debian's package,
``/usr/bin/chromium``, through Playwright -- which never downloads a browser here).

One test walks the whole path, saving a screenshot at each step under ``build/test-output/browser/``: the connection
form of every ``tao_*`` type shows our fields; the quickstart DAG is triggered from its trigger form; its training task,
while deferred, shows the job's log lines arriving and the job link; the link opens the job page; the TAO jobs view
lists the job with its GPU-hours and the chart, and its task link opens the task inside the Airflow UI.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tao.get_provider_info import get_provider_info
from tests.e2e.airflow_harness import AirflowClient, AirflowStandalone, free_ports, wait_until
from tests.integration.slurm.conftest import SlurmCluster, slurm_cluster  # noqa: F401  (the CI cluster)

CHROMIUM = Path("/usr/bin/chromium")
SHOTS = Path(__file__).resolve().parents[3] / "build" / "test-output" / "browser"
QUICKSTART_CONF = {"epochs": 60, "epoch_seconds": 1.5}  # ~90 s of training: time to look at it while it runs
PAGE_ATTEMPTS = 3
PAGE_ATTEMPT_MS = 120_000  # a page on a loaded 2-core machine can take a minute; one that never comes is reloaded


@pytest.fixture(scope="module")
def shots() -> Path:
    """The screenshot folder, emptied first so it holds this run's pictures only."""
    shutil.rmtree(SHOTS, ignore_errors=True)
    SHOTS.mkdir(parents=True)
    return SHOTS


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.is_file(), "Debian's chromium package is missing: scripts/test.sh installs it"
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1440, "height": 960})
    page = context.new_page()
    page.set_default_timeout(120_000)
    try:
        yield page
    finally:
        context.close()


def _open(page: Any, shots: Path, url: str, ready: Any, name: str) -> None:
    """Go to ``url`` until ``ready`` shows. The UI shows a failed API call's error and does not ask again (its pages
    retry a few times, then give up): a page that did not come is loaded again, as a person would. Each miss leaves
    its screenshot and the page's text in the output, so that a page that never comes says what it showed."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(1, PAGE_ATTEMPTS + 1):
        try:
            page.goto(url, timeout=PAGE_ATTEMPT_MS)  # the page itself not served in time is a miss too
            ready.wait_for(timeout=PAGE_ATTEMPT_MS)
            return
        except PlaywrightTimeout as exc:
            with contextlib.suppress(Exception):  # what there is to show of a page that may not have come at all
                _shot(page, shots, f"{name}-miss-{attempt}", full_page=True)
                print(f"--- {url}: {exc.message.splitlines()[0]} (attempt {attempt}); the page's text ---")
                print(page.locator("body").inner_text(timeout=10_000)[:3000])
    raise AssertionError(f"{url}: {ready} did not show in {PAGE_ATTEMPTS} loads (screenshots {name}-miss-*.png)")


def _shot(page: Any, shots: Path, name: str, full_page: bool = False) -> Path:
    path = shots / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def test_connection_forms_show_our_fields(page: Any, shots: Path, airflow_standalone: AirflowStandalone) -> None:
    url = airflow_standalone.api_url
    forms = get_provider_info()["connection-types"]
    assert [c["connection-type"] for c in forms] == [
        "tao_local", "tao_slurm", "tao_brev", "tao_docker", "tao_kubernetes", "tao_lepton"
    ]  # fmt: skip
    for conn in forms:
        add = page.get_by_role("button", name="Add Connection")
        _open(page, shots, f"{url}/connections", add, "01-connections")
        add.click()
        dialog = page.get_by_role("dialog")
        dialog.get_by_label("Connection ID").fill(f"ui_{conn['connection-type']}")
        kind = dialog.get_by_role("combobox")
        kind.click()
        kind.fill(conn["hook-name"])
        page.get_by_role("option", name=conn["hook-name"], exact=True).click()
        for label in conn["ui-field-behaviour"]["relabeling"].values():
            assert dialog.get_by_text(label, exact=True).is_visible(), label
        for name in conn["ui-field-behaviour"]["hidden-fields"]:
            assert dialog.locator(f"input[name='{name}']").count() == 0, name
        dialog.get_by_text("Extra Fields", exact=True).click()
        for name, field in conn["conn-fields"].items():
            label = dialog.get_by_text(field["label"], exact=True)
            label.wait_for()
            assert dialog.get_by_text(field["description"], exact=True).is_visible(), name
            if field["schema"].get("format") == "password":  # secrets are masked in the form
                assert dialog.locator(f"input[name='element_{name}']").get_attribute("type") == "password", name
        _shot(page, shots, f"01-connection-form-{conn['connection-type']}", full_page=True)
        last = list(conn["conn-fields"].values())[-1]
        dialog.get_by_text(last["description"], exact=True).scroll_into_view_if_needed()  # the dialog scrolls
        _shot(page, shots, f"01-connection-form-{conn['connection-type']}-end")


def _settled(page: Any, toast: Any) -> None:
    """Wait until a notification has slid fully into view (so its screenshot shows all of it)."""
    toast.wait_for()
    height = page.viewport_size["height"]
    wait_until(
        lambda: (box := toast.bounding_box()) is not None and box["y"] + box["height"] <= height,
        timeout=180,
        interval=0.1,
        message="the notification never came fully into view",
    )


def _add_slurm_connection(page: Any, shots: Path, url: str, conn_id: str, *, cluster: SlurmCluster, port: int) -> None:
    add = page.get_by_role("button", name="Add Connection")
    _open(page, shots, f"{url}/connections", add, "02-connections")
    add.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_label("Connection ID").fill(conn_id)
    kind = dialog.get_by_role("combobox")
    kind.click()
    kind.fill("TAO SLURM")
    page.get_by_role("option", name="TAO SLURM", exact=True).click()
    dialog.get_by_label("Login host(s)").fill(cluster.host)
    dialog.get_by_label("Port").fill(str(port))
    dialog.get_by_label("User").fill(cluster.user)
    dialog.get_by_text("Extra Fields", exact=True).click()
    dialog.locator("input[name='element_key_file']").fill(str(cluster.key_file))
    dialog.locator("input[name='element_host_key']").fill(cluster.host_key)
    dialog.locator("input[name='element_results_root']").fill(str(cluster.results_root))
    dialog.get_by_role("button", name="Save").click()
    page.get_by_role("row").filter(has_text=conn_id).wait_for()


def test_the_test_button_reaches_the_cluster(
    page: Any,
    shots: Path,
    airflow_standalone: AirflowStandalone,
    slurm_cluster: SlurmCluster,  # noqa: F811
) -> None:
    """A tao_slurm connection made in the form, then the list's Test button: SSH + sinfo on the real cluster, and
    on a closed port the words of what failed."""
    url = airflow_standalone.api_url
    _add_slurm_connection(page, shots, url, "ui_slurm", cluster=slurm_cluster, port=slurm_cluster.port)
    page.get_by_role("row").filter(has_text="ui_slurm").get_by_role("button", name="Test Connection").click()
    _settled(
        page, page.get_by_text(re.compile(rf"Connected to {re.escape(slurm_cluster.host)} as {slurm_cluster.user}"))
    )
    assert page.get_by_text(re.compile(slurm_cluster.partition)).count() >= 1
    _shot(page, shots, "02-connection-test-button-success")

    closed = free_ports(1)[0]
    _add_slurm_connection(page, shots, url, "ui_slurm_closed", cluster=slurm_cluster, port=closed)
    page.get_by_role("row").filter(has_text="ui_slurm_closed").get_by_role("button", name="Test Connection").click()
    _settled(page, page.get_by_text(re.compile(r"Unreachable: no login host answered on SSH")))
    _shot(page, shots, "02-connection-test-button-unreachable")


def test_a_deferred_training_task_in_the_ui(
    page: Any, shots: Path, airflow_standalone: AirflowStandalone, ui_dags: AirflowClient
) -> None:
    url = airflow_standalone.api_url
    gpu_run = ui_dags.trigger_dag_run("tao_ui_two_platforms")  # a job with GPUs, for the view's chart

    # trigger the quickstart from its trigger form, with a longer training
    trigger = page.get_by_role("button", name="Trigger").first
    _open(page, shots, f"{url}/dags/tao_quickstart", trigger, "03-dag-page")
    trigger.click()
    dialog = page.get_by_role("dialog")
    for name, value in QUICKSTART_CONF.items():
        field = dialog.locator(f"input[name='element_{name}']")
        field.fill(str(value))
    _shot(page, shots, "03-trigger-form")
    dialog.get_by_role("button", name="Trigger").click()
    run_id = wait_until(
        lambda: next(
            (
                r["dag_run_id"]
                for r in ui_dags._json("GET", "/dags/tao_quickstart/dagRuns", params={"limit": 100})["dag_runs"]
                if r["conf"] == QUICKSTART_CONF
            ),
            None,
        ),
        timeout=180,
        message="the trigger form started no run with our parameters",
    )
    ui_dags.wait_for_task_instance("tao_quickstart", run_id, "train", ["deferred"], timeout=120)
    job_id = ui_dags.get_job_id("tao_quickstart", run_id, "train")

    # the task while deferred: new log lines arrive without a reload
    _open(page, shots, f"{url}/dags/tao_quickstart/runs/{run_id}/tasks/train",
          page.get_by_text("Deferred", exact=True).first, "04-task-page")  # fmt: skip
    epochs = page.get_by_text(re.compile(r"\[job\] Epoch \d+/60"))
    wait_until(lambda: epochs.count() >= 2, timeout=180, message="no job log lines in the task log")
    first = epochs.count()
    _shot(page, shots, "04-deferred-task-log")
    wait_until(
        lambda: epochs.count() >= first + 3, timeout=180, message=f"no new log lines after {first} (no live updates)"
    )
    assert ui_dags.get_task_instance_state("tao_quickstart", run_id, "train") == "deferred"
    _shot(page, shots, "05-deferred-task-log-later")

    # the job link, while deferred
    page.get_by_role("link", name="Details", exact=True).click()
    job_link = page.get_by_role("link", name="TAO job", exact=True)
    job_link.wait_for()
    assert page.get_by_role("link", name="TAO results", exact=True).is_visible()
    _shot(page, shots, "06-deferred-task-links", full_page=True)
    job_link.click()
    page.get_by_role("heading", name=f"TAO job {job_id}").wait_for()
    assert page.get_by_text("Log file", exact=True).is_visible()
    assert len(re.findall(r"Epoch \d+/60", page.locator("pre.log").inner_text())) >= first
    assert ui_dags.get_task_instance_state("tao_quickstart", run_id, "train") == "deferred"
    _shot(page, shots, "07-job-page", full_page=True)

    # the TAO jobs view, in the UI's navigation
    # (its local job, 1 GPU: the docker one can be removed by other test sessions sharing the engine)
    ui_dags.wait_for_task_instance("tao_ui_two_platforms", gpu_run, "train_local", ["success"], timeout=180)
    nav = page.get_by_role("link", name="TAO jobs")
    _open(page, shots, url, nav, "08-home")
    nav.click()
    view = page.frame_locator("iframe[title='TAO jobs']")
    row = view.locator("tr", has_text=job_id)
    row.wait_for()
    assert "tao_quickstart / train" in row.inner_text() and "Running" in row.inner_text()
    assert re.search(r"\b0\.000\b", row.inner_text()), row.inner_text()  # GPU-hours of a 0-GPU job
    gpu_row = view.locator("tr", has_text="tao_ui_two_platforms / train_local").first
    hours = float(gpu_row.locator("td").nth(6).inner_text())
    assert hours > 0 and "1 \u00d7 1" in gpu_row.inner_text(), gpu_row.inner_text()  # 1 GPU x a few seconds
    assert view.locator("svg rect").count() >= 1  # the GPU-hours chart has a bar
    _shot(page, shots, "08-tao-jobs-view")

    # filtering narrows the view
    view.locator("select[name='dag_id']").select_option("tao_quickstart")
    view.get_by_role("button", name="Filter").click()
    wait_until(
        lambda: view.locator("tr", has_text="tao_ui_two_platforms").count() == 0,
        timeout=180,
        message="the DAG filter did not narrow the view",
    )
    view.locator("tr", has_text=job_id).wait_for()
    _shot(page, shots, "09-tao-jobs-view-filtered")

    # a task link in the view opens the task in the Airflow UI itself
    view.locator("tr", has_text=job_id).get_by_role("link", name="tao_quickstart / train").click()
    wait_until(lambda: "/tasks/train" in page.url, timeout=180, message=f"still at {page.url}")
    assert "/plugin/" not in page.url
    page.get_by_text("TAOSubmitOperator").first.wait_for()
    _shot(page, shots, "10-task-from-view")
    print(f"screenshots in {shots}: {sorted(p.name for p in shots.glob('*.png'))}")
    time.sleep(0)  # nothing to wait for: the run finishes on its own (the next module may reuse the instance)


def _token_of(instance: AirflowStandalone, username: str, role: str) -> str:
    """A login of the standalone's auth manager for ``username`` with ``role`` (its JWT, signed with the instance's
    secret): a read-only ``viewer`` or an editing ``user``. An explicit bearer header wins over the harness's
    all-admins login (the middleware only appends its own)."""
    code = (
        "import sys\n"
        "from airflow.api_fastapi.app import create_auth_manager\n"
        "from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser\n"
        "user = SimpleAuthManagerUser(username=sys.argv[1], role=sys.argv[2])\n"
        "print(create_auth_manager().generate_jwt(user))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, username, role], env=instance.env, cwd=instance.home,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


def test_the_cancel_button_is_for_editors_only(
    browser: Any, shots: Path, airflow_standalone: AirflowStandalone, ui_dags: AirflowClient
) -> None:
    """Issue 36 point 4: a read-only user sees the running job's page without a Cancel button and is refused when
    posting one; an editing user cancels from the page, recorded as theirs, and the task fails with ERR_CANCELED."""
    from airflow_provider_tao.links import job_page_path

    url = airflow_standalone.api_url
    run_id = ui_dags.trigger_dag_run("tao_ui_cancel")
    ui_dags.wait_for_task_instance("tao_ui_cancel", run_id, "train", ["deferred"], timeout=120)
    job_id = ui_dags.get_job_id("tao_ui_cancel", run_id, "train")
    job_page = url + job_page_path("tao_ui_cancel", run_id, "train")

    def as_user(name: str, role: str) -> Any:
        headers = {"Authorization": f"Bearer {_token_of(airflow_standalone, name, role)}"}
        context = browser.new_context(viewport={"width": 1280, "height": 900}, extra_http_headers=headers)
        page = context.new_page()
        page.set_default_timeout(120_000)
        return context, page

    viewer, viewer_page = as_user("ada", "viewer")
    editor, editor_page = as_user("bob", "user")
    try:
        viewer_page.goto(job_page)
        viewer_page.get_by_role("heading", name=f"TAO job {job_id}").wait_for()
        assert "Running" in viewer_page.locator("dl").first.inner_text()  # the platform's word, asked now
        assert viewer_page.get_by_role("button", name="Cancel this job").count() == 0
        _shot(viewer_page, shots, "11-job-page-read-only")

        editor_page.goto(job_page)
        button = editor_page.get_by_role("button", name="Cancel this job")
        button.wait_for()
        _shot(editor_page, shots, "12-job-page-editor")
        token = editor_page.locator("form.cancel input[name='token']").get_attribute("value")
        refused = viewer_page.request.post(f"{job_page}/cancel", form={"token": token})  # even with a real token
        assert refused.status == 403, refused.text()
        assert ui_dags.get_task_instance_state("tao_ui_cancel", run_id, "train") == "deferred"

        button.click()
        editor_page.get_by_role("heading", name=f"Canceled by ui:bob: TAO job {job_id}").wait_for()
        _shot(editor_page, shots, "13-canceled-by-the-editor")
    finally:
        viewer.close()
        editor.close()
    ui_dags.wait_for_task_instance("tao_ui_cancel", run_id, "train", ["failed"], timeout=180)
    log = ui_dags.get_task_log("tao_ui_cancel", run_id, "train", 1)
    assert "ERR_CANCELED" in log and "canceled by ui:bob" in log, log[-3000:]
