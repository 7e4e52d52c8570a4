"""The plugin's FastAPI app (mounted at ``/tao`` in the API server).

``GET /jobs`` is the TAO jobs view (HTML), ``GET /api/jobs`` the same rows and chart as JSON, ``GET
/jobs/<dag>/<run>/<task>`` one task instance's job page. The view reads only Airflow's own records
(:mod:`airflow_provider_tao.jobindex`); the job page also asks the job's platform for its log, through the hook.
Every route needs a logged-in user and shows only the DAGs that user may read; a job's log needs the DAG's
``TASK_LOGS`` permission and what its XCom says the DAG's ``XCOM`` permission (:mod:`.permissions`). Records are
the checked ones of :mod:`airflow_provider_tao.jobindex`: the platform is asked only about a task's own job.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import parse_qs

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from airflow_provider_tao.hooks import PLATFORMS, get_platform_hook
from airflow_provider_tao.jobindex import IndexedJob, gpu_hours_by_dag_and_day, load_jobs
from airflow_provider_tao.joblog import readable_log
from airflow_provider_tao.links import job_page_path
from airflow_provider_tao.livestate import LiveStates, failure_facts
from airflow_provider_tao.plugins import cancel, pages, searches
from airflow_provider_tao.plugins.permissions import CurrentViewer, Viewer
from airflow_provider_tao.plugins.results import results_files
from airflow_provider_tao.received_secrets import job_secrets

#: The platforms' answers about running jobs, shared by every request (one batched call per connection per TTL).
LIVE = LiveStates()
#: Lines of the job's log the job page shows.
LOG_TAIL_LINES = 200
#: What the job page says instead of a log the viewer may not read.
NO_LOGS = "reading this job's log needs permission to read the task logs of DAG {dag_id}"
#: What the job page says of a job only its task's XCom names (others may write it): nothing is asked about it.
RECORD_ONLY_IN_XCOM = (
    "this job is named only by its task's XCom, which other tasks and the DAG's XCom editors may write: its platform"
    " is not asked about it"
)
#: Seconds the job page waits for the platform (log, location) before it says the platform did not answer.
PLATFORM_TIMEOUT = 10.0


def _base_url() -> str:
    from airflow.configuration import conf

    return str(conf.get("api", "base_url", fallback="") or "").rstrip("/")


def _selected(jobs: list[IndexedJob], filters: dict[str, str], now: float) -> list[IndexedJob]:
    days = float(filters["days"]) if filters["days"].replace(".", "", 1).isdigit() else 0.0
    return [
        job
        for job in jobs
        if (not filters["dag_id"] or job.dag_id == filters["dag_id"])
        and (not filters["platform"] or job.platform == filters["platform"])
        and (not filters["state"] or job.state == filters["state"])
        and (not days or job.started_at >= now - days * 86400)
        and (not filters["q"] or job.job_id.startswith(filters["q"].strip().lower()))
    ]


def _load(dags: set[str], rejected: list[dict[str, Any]] | None = None, **kwargs: Any) -> list[IndexedJob]:
    from airflow.utils.session import create_session

    with create_session() as session:
        return load_jobs(session, dag_ids=dags, rejected=rejected, **kwargs)


def _job_url(job: IndexedJob) -> str:
    """The job's console page, from the hook (no platform call: the URL is built from the connection)."""
    if job.platform not in PLATFORMS:
        return ""
    try:
        return get_platform_hook(job.platform, job.conn_id).job_url(job.record.job)
    except Exception:
        return ""


def create_app() -> FastAPI:
    app = FastAPI(title="TAO jobs", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/static/icon.svg", include_in_schema=False)
    def icon() -> Response:
        return Response(pages.icon(), media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})

    @app.get("/api/jobs")
    def jobs_json(request: Request, viewer: CurrentViewer) -> JSONResponse:
        now = time.time()
        filters = pages.as_filters(request.query_params)
        rejected: list[dict[str, Any]] = []
        jobs = _selected(LIVE.apply(_load(viewer.dags, rejected)), filters, now)
        return JSONResponse(
            {
                "jobs": [viewer.shown(job).row(now) for job in jobs],
                "ignored_records": len(rejected),
                "gpu_hours_by_dag_and_day": gpu_hours_by_dag_and_day(jobs, now),
                "total_gpu_hours": round(sum(job.gpu_hours(now) or 0.0 for job in jobs), 4),
            }
        )

    @app.get("/jobs", response_class=HTMLResponse)
    def jobs_view(request: Request, viewer: CurrentViewer) -> HTMLResponse:
        now = time.time()
        filters = pages.as_filters(request.query_params)
        rejected: list[dict[str, Any]] = []
        everything = LIVE.apply(_load(viewer.dags, rejected))  # jobs not seen ending: their platforms' word now
        jobs = [viewer.shown(job) for job in _selected(everything, filters, now)]
        return HTMLResponse(
            pages.jobs_view(
                jobs,
                base=_base_url(),
                filters=filters,
                dag_ids=sorted({job.dag_id for job in everything}),
                platforms=sorted(PLATFORMS),
                job_urls={j.job_id: _job_url(j) for j in jobs if j.verified and viewer.may_read_xcoms(j.dag_id)},
                now=now,
                ignored=len(rejected),
                searches=searches.searches_list(_searches(viewer.dags, filters.get("dag_id") or None)),
            )
        )

    @app.get("/api/searches/{dag_id}/{run_id}/{task_id}")
    async def search_json(*, dag_id: str, run_id: str, task_id: str, viewer: CurrentViewer, map_index: int = -1,
    ) -> JSONResponse:  # fmt: skip
        return JSONResponse(searches.search_json(await _task_search(viewer.dags, dag_id, run_id, task_id, map_index)))

    @app.get("/searches/{dag_id}/{run_id}/{task_id}", response_class=HTMLResponse)
    async def search_page(*, dag_id: str, run_id: str, task_id: str, viewer: CurrentViewer, map_index: int = -1,
    ) -> HTMLResponse:  # fmt: skip
        """An AutoML search: its trials and their metric curves; reloads itself while the search runs."""
        search = await _task_search(viewer.dags, dag_id, run_id, task_id, map_index)
        links = await asyncio.to_thread(_trial_links, search) if viewer.may_read_xcoms(dag_id) else {}
        return HTMLResponse(
            pages.page(
                f"AutoML search {search.state.study_name}",
                searches.search_body(search, trial_links=links),
                refresh_seconds=0 if search.state.finished else 10,
            )
        )

    @app.get("/jobs/{dag_id}/{run_id}/{task_id}", response_class=HTMLResponse)
    async def job_page(
        *, dag_id: str, run_id: str, task_id: str, viewer: CurrentViewer, map_index: int = -1
    ) -> Response:
        try:
            current, jobs = await _task_jobs(viewer.dags, dag_id, run_id, task_id, map_index)
        except HTTPException:  # the job page of a search is its search page
            await _task_search(viewer.dags, dag_id, run_id, task_id, map_index)
            return RedirectResponse(
                job_page_path(dag_id, run_id, task_id, map_index).replace("/jobs/", "/searches/", 1)
            )
        current, failure = await _live_view(current)
        try:
            view = await asyncio.wait_for(asyncio.to_thread(_platform_view, current, viewer), PLATFORM_TIMEOUT)
        except TimeoutError:
            view = (
                {},
                "",
                f"the {current.platform} platform did not answer within {PLATFORM_TIMEOUT:.0f} s",
                "",
                "",
                [],
            )
        location, log, note, url, results_url, files = view
        return HTMLResponse(
            pages.job_page(
                viewer.shown(current),
                base=_base_url(),
                location=location,
                job_url=url,
                results_url=results_url,
                log=log,
                log_note=note,
                results=files,
                history=[viewer.shown(job) for job in jobs if not job.current],
                failure=failure,
                actions=await asyncio.to_thread(cancel.form, viewer.user, current)
                if current.verified and viewer.user is not None
                else "",
                metrics=searches.job_metrics(log),
            )
        )

    @app.post("/jobs/{dag_id}/{run_id}/{task_id}/cancel", response_class=HTMLResponse)
    async def cancel_job(
        *, request: Request, dag_id: str, run_id: str, task_id: str, viewer: CurrentViewer, map_index: int = -1,
    ) -> HTMLResponse:  # fmt: skip
        """The Cancel button: for users who may edit the DAG, with the token of their job page (403 otherwise)."""
        current, _ = await _task_jobs(viewer.dags, dag_id, run_id, task_id, map_index)
        if not current.verified:
            raise HTTPException(403, RECORD_ONLY_IN_XCOM)
        given = parse_qs((await request.body()).decode(errors="replace")).get("token", [""])[0]
        await asyncio.to_thread(cancel.check, viewer.user, current, given)
        row = await asyncio.to_thread(cancel.cancel, viewer.user, current)
        words = f"Canceled by {row['by']}" if row["canceled"] else "Not canceled"
        back = job_page_path(dag_id, run_id, task_id, map_index)
        body = (
            f"<h1>{pages.e(words)}: TAO job {pages.e(row['job_id'])}</h1>"
            f"<p>It was {pages.e(row['was'])}, it is {pages.e(row['state'])}: {pages.e(row['note'])}.</p>"
            f'<p><a href="{pages.e(back)}">Back to the job</a></p>'
        )
        return HTMLResponse(pages.page(f"TAO job {row['job_id']}", body))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        if request.url.path.rstrip("/").endswith("/api/jobs"):
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)
        return HTMLResponse(pages.error_page(exc.status_code, str(exc.detail)), status_code=exc.status_code)

    return app


async def _task_jobs(
    dags: set[str], dag_id: str, run_id: str, task_id: str, map_index: int
) -> tuple[IndexedJob, list[IndexedJob]]:
    """The task instance's current job and all its jobs (404 for a DAG the user may not read, as for no job)."""
    if dag_id not in dags:
        raise HTTPException(404, "no such job")  # the same answer as for a job that does not exist
    jobs = [
        job
        for job in await asyncio.to_thread(_load, {dag_id}, run_id=run_id)
        if job.task_id == task_id and job.map_index == map_index
    ]
    current = next((job for job in jobs if job.current), None)
    if current is None:
        raise HTTPException(404, "no such job")
    return current, jobs


def _searches(dags: set[str], dag_id: str | None = None, run_id: str | None = None) -> list[searches.Search]:
    from airflow.utils.session import create_session

    with create_session() as session:
        return searches.load_searches(session, dag_ids={dag_id} & dags if dag_id else dags, run_id=run_id)


async def _task_search(dags: set[str], dag_id: str, run_id: str, task_id: str, map_index: int) -> searches.Search:
    """The task instance's search (404 for a DAG the user may not read, as for no search)."""
    if dag_id in dags:
        for search in await asyncio.to_thread(_searches, dags, dag_id, run_id):
            if search.task_id == task_id and search.map_index == map_index:
                return search
    raise HTTPException(404, "no such job")


def _trial_links(search: searches.Search) -> dict[int, str]:
    """Each trial's job on its platform (the hook builds the URL from the connection: no platform call)."""
    from airflow_provider_tao.jobs import JobHandle

    links = {}
    for trial in search.state.trials:
        if not trial.handle:
            continue
        try:
            handle = JobHandle.from_json(trial.handle)
            links[trial.number] = get_platform_hook(handle.platform, handle.conn_id).job_url(handle)
        except Exception:  # no handle yet, or a platform not installed here: no link
            continue
    return links


async def _live_view(job: IndexedJob) -> tuple[IndexedJob, dict[str, str]]:
    """The job with its platform's state now, and a failed job's exit code and failure words (nothing when the
    platform does not answer in time: the page still shows what the records say). Only a task's own record leads
    to the platform."""
    if not job.verified:
        return job, {}
    try:
        (job,) = await asyncio.wait_for(asyncio.to_thread(LIVE.apply, [job]), PLATFORM_TIMEOUT)
        return job, await asyncio.wait_for(asyncio.to_thread(failure_facts, job), PLATFORM_TIMEOUT)
    except Exception as exc:  # the records' word stays
        return job, {"Failure": f"the {job.platform} platform did not say: {exc}"} if job.state == "Error" else {}


def _platform_view(job: IndexedJob, viewer: Viewer) -> tuple[dict[str, str], str, str, str, str, list[str]]:
    """What the job's platform says: where the job is, the tail of its log, its console and results links, and the
    files of a results folder this host can see -- as far as ``viewer`` may see them (the log needs ``TASK_LOGS``,
    the rest ``XCOM``). A platform that does not answer is said so, never an error page. Only a task's own record
    (``job.verified``) leads to the platform: a record only an XCom holds may name another task's job."""
    handle = job.record.job
    logs, xcoms = viewer.may_read_logs(job.dag_id), viewer.may_read_xcoms(job.dag_id)
    if not job.verified:
        return {}, "", RECORD_ONLY_IN_XCOM, "", "", []
    if job.platform not in PLATFORMS:
        return {}, "", f"platform {job.platform!r} is not installed here", "", "", []
    if not logs and not xcoms:
        return {}, "", NO_LOGS.format(dag_id=job.dag_id), "", "", []
    hook = get_platform_hook(job.platform, job.conn_id)
    started = time.monotonic()
    location: dict[str, str] = {}
    url = results_url = ""
    try:
        hook.load_connection()
        if xcoms:
            location = hook.job_location(handle)
            url, results_url = hook.job_url(handle), hook.results_url(handle)
    except Exception as exc:
        return {}, "", f"cannot use connection {job.conn_id!r}: {exc}", "", "", []
    if not logs:
        log, note = "", NO_LOGS.format(dag_id=job.dag_id)
    else:
        try:
            log, _ = hook.get_job_logs(handle, "", tail=LOG_TAIL_LINES)
            # heartbeats in words, secrets masked
            log = readable_log(log, job_secrets(job.record.secret_conn_ids, job.conn_id, job.platform))
            note = f"last {LOG_TAIL_LINES} lines, read from the {job.platform} platform in " + (
                f"{time.monotonic() - started:.1f} s"
            )
        except Exception as exc:
            log, note = "", f"the {job.platform} platform did not give the log: {exc}"
    files = results_files(hook, handle.results_dir) if xcoms else []
    return location, log, note, url, results_url, files
