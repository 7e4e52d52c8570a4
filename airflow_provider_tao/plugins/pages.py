"""HTML of the TAO jobs view and the job page: plain server-side HTML and an inline SVG chart, no script library.

Everything that comes from a DAG, a job or a log is escaped (:func:`~airflow_provider_tao.plugins.escape.html`,
:func:`html.escape`); every link goes through :func:`~airflow_provider_tao.links.safe_url`; the only script is the
one that lets a link inside the UI's iframe open an Airflow page in the UI itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from airflow_provider_tao.jobindex import IndexedJob, gpu_hours_by_dag_and_day
from airflow_provider_tao.links import PLUGIN_URL_PREFIX, job_page_path, safe_url
from airflow_provider_tao.plugins.escape import html

_CSS = """
:root { color-scheme: light; --fg:#1a202c; --muted:#5f6b7a; --line:#e2e8f0; --brand:#017cee; --bg:#ffffff; }
* { box-sizing: border-box; }
body { font: 14px/1.45 -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: var(--fg);
       background: var(--bg); margin: 0; padding: 16px 20px; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 15px; margin: 20px 0 8px; }
.sub { color: var(--muted); margin: 0 0 14px; }
form.filters { display: flex; flex-wrap: wrap; gap: 10px; align-items: end; margin: 0 0 14px; }
form.filters label { display: flex; flex-direction: column; font-size: 12px; color: var(--muted); gap: 2px; }
select, input { font: inherit; padding: 4px 6px; border: 1px solid var(--line); border-radius: 4px; min-width: 120px; }
button { font: inherit; padding: 5px 12px; border-radius: 4px; border: 1px solid var(--brand); background: var(--brand);
         color: white; cursor: pointer; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 6px 8px; border-bottom: 1px solid var(--line); white-space: nowrap; }
th { font-size: 12px; color: var(--muted); font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
a { color: var(--brand); text-decoration: none; } a:hover { text-decoration: underline; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600; }
.Running { background: #e0f0ff; color: #0b5cad; } .Complete { background: #e3f6e5; color: #1e7b34; }
.Error { background: #fde8e8; color: #b42318; } .Canceled { background: #f1f1f1; color: #555; }
.Unknown { background: #fff4e0; color: #8a5a00; } .Submitted { background: #e0f0ff; color: #0b5cad; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 10px 14px; margin: 0 0 14px; }
.chart { overflow-x: auto; } .legend span { display: inline-flex; align-items: center; gap: 4px; margin-right: 12px; }
.legend i { width: 10px; height: 10px; border-radius: 2px; display: inline-block; }
dl { display: grid; grid-template-columns: max-content auto; gap: 4px 16px; margin: 0; }
dt { color: var(--muted); } dd { margin: 0; font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
.logbox { display: flex; flex-direction: column-reverse; max-height: 420px; overflow: auto; } /* opens at the end */
.logbox pre.log { max-height: none; overflow: visible; margin: 0; }
pre.log { background: #0f172a; color: #e2e8f0; padding: 10px; border-radius: 6px; max-height: 420px; overflow: auto;
          font: 12px/1.4 ui-monospace, "DejaVu Sans Mono", monospace; white-space: pre-wrap; }
.empty { color: var(--muted); padding: 20px 0; }
"""

# A link inside the UI's iframe cannot navigate the top window (the UI sandboxes its plugin views), so a link to an
# Airflow page moves the UI's own router there; outside an iframe the link is an ordinary link.
_SCRIPT = """
document.addEventListener("click", function (event) {
  var link = event.target.closest("a[data-airflow]");
  if (!link || window.parent === window) return;
  try {
    var top = window.parent, state = top.history.state || {};
    top.history.pushState({usr: null, key: Math.random().toString(36).slice(2, 10), idx: (state.idx || 0) + 1},
                          "", link.getAttribute("href"));
    top.dispatchEvent(new top.PopStateEvent("popstate", {state: top.history.state}));
    event.preventDefault();
  } catch (error) { /* not the UI's frame: follow the link */ }
});
"""

#: Bar colours of the chart, one per DAG in order (Airflow-like, distinguishable).
PALETTE = ("#017cee", "#76b900", "#e8710a", "#a142f4", "#12b5cb", "#d93025", "#f9ab00", "#5f6368")

e = escape


def page(title: str, body: str, *, refresh_seconds: int = 0) -> str:
    """A whole page; ``refresh_seconds`` reloads it (a running job's page follows the job)."""
    refresh = f'<meta http-equiv="refresh" content="{refresh_seconds}">' if refresh_seconds else ""
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>{refresh}'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_CSS}</style></head>'
        f"<body>{body}<script>{_SCRIPT}</script></body></html>"
    )


def task_url(base: str, job: IndexedJob) -> str:
    """The task instance's page in the Airflow UI."""
    path = f"{base}/dags/{quote(job.dag_id, safe='')}/runs/{quote(job.run_id, safe='')}/tasks/{quote(job.task_id)}"
    return path if job.map_index < 0 else f"{path}/mapped/{job.map_index}"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def _when(epoch: float | None) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S") if epoch else ""


def _options(values: Iterable[str], chosen: str, everything: str) -> str:
    items = [f'<option value="">{e(everything)}</option>']
    for value in values:
        selected = " selected" if value == chosen else ""
        items.append(f'<option value="{e(value)}"{selected}>{e(value)}</option>')
    return "".join(items)


def chart(totals: Mapping[str, Mapping[str, float]], width: int = 760, height: int = 200) -> str:
    """GPU-hours per DAG per day as stacked bars (SVG) with a legend."""
    if not any(hours > 0 for per_day in totals.values() for hours in per_day.values()):
        return '<p class="empty">No GPU-hours in this selection (its jobs asked for no GPUs).</p>'
    dags = sorted({dag for per_day in totals.values() for dag, hours in per_day.items() if hours > 0})
    colour = {dag: PALETTE[index % len(PALETTE)] for index, dag in enumerate(dags)}
    top = max(sum(per_day.values()) for per_day in totals.values()) or 1.0
    left, bottom, plot_h = 48, 22, height - 32
    slot = max(14, min(60, (width - left) // max(1, len(totals))))
    svg_w = left + slot * len(totals) + 8
    parts = [
        f'<svg role="img" aria-label="GPU-hours per DAG per day" width="{svg_w}" height="{height}" '
        f'viewBox="0 0 {svg_w} {height}" font-size="11" fill="#5f6b7a">',
        f'<line x1="{left}" y1="{height - bottom}" x2="{svg_w}" y2="{height - bottom}" stroke="#cbd5e0"/>',
        f'<text x="{left - 6}" y="14" text-anchor="end">{top:.3g}</text>',
        f'<text x="{left - 6}" y="{height - bottom}" text-anchor="end">0</text>',
    ]
    for index, (day, per_dag) in enumerate(totals.items()):
        x, y = left + index * slot + 4, float(height - bottom)
        for dag in dags:
            hours = per_dag.get(dag, 0.0)
            if hours <= 0:
                continue
            h = max(1.0, hours / top * plot_h)
            y -= h
            parts.append(
                f'<rect x="{x}" y="{y:.1f}" width="{slot - 8}" height="{h:.1f}" fill="{colour[dag]}">'
                f"<title>{e(day)} {e(dag)}: {hours:.3f} GPU-hours</title></rect>"
            )
        parts.append(f'<text x="{x + (slot - 8) / 2}" y="{height - 6}" text-anchor="middle">{e(day[5:])}</text>')
    parts.append("</svg>")
    legend = "".join(f'<span><i style="background:{colour[d]}"></i>{e(d)}</span>' for d in dags)
    return f'<div class="chart">{"".join(parts)}</div><div class="legend">{legend}</div>'


def jobs_view(
    jobs: Sequence[IndexedJob],
    *,
    base: str,
    filters: Mapping[str, str],
    dag_ids: Sequence[str],
    platforms: Sequence[str],
    job_urls: Mapping[str, str],
    now: float | None = None,
    ignored: int = 0,
    searches: str = "",
) -> str:
    """The TAO jobs view: filters, the GPU-hours chart and the table of jobs (``ignored``: task records refused as
    invalid, each named in the API server's log); ``searches``: HTML of the AutoML searches and their trials
    (:func:`airflow_provider_tao.plugins.searches.searches_list`, escaped there)."""
    now = now or time.time()
    total = sum(job.gpu_hours(now) or 0.0 for job in jobs)
    states = ("Running", "Complete", "Error", "Canceled", "Unknown")
    days = [("", "all time"), ("1", "last day"), ("7", "last 7 days"), ("30", "last 30 days")]
    day_options = "".join(
        f'<option value="{value}"{" selected" if filters.get("days", "") == value else ""}>{label}</option>'
        for value, label in days
    )
    form = (
        f'<form class="filters" method="get" action="{PLUGIN_URL_PREFIX}/jobs">'
        f'<label>DAG<select name="dag_id">{_options(dag_ids, filters.get("dag_id", ""), "all DAGs")}</select></label>'
        f'<label>Platform<select name="platform">{_options(platforms, filters.get("platform", ""), "all")}</select>'
        f'</label><label>State<select name="state">{_options(states, filters.get("state", ""), "all")}</select>'
        f'</label><label>Started<select name="days">{day_options}</select></label>'
        f'<label>Job id<input name="q" value="{e(filters.get("q", ""))}" placeholder="a1b2c3"></label>'
        "<button type=submit>Filter</button></form>"
    )
    rows = []
    for job in jobs:
        hours = job.gpu_hours(now)
        gpus = "all" if job.record.gpu_count < 0 else str(job.record.gpu_count)
        page_link = job_page_path(job.dag_id, job.run_id, job.task_id, job.map_index)
        platform_link = safe_url(job_urls.get(job.job_id, "")) or page_link
        try_number = job.record.handle.get("try_number", 1)
        rows.append(
            html(
                '<tr><td><a href="{}">{}</a></td><td>{}</td><td><span class="badge {}">{}</span>{}</td>'
                '<td class="num">{} &times; {}</td><td>{}</td><td class="num">{}</td><td class="num">{}</td>'
                '<td><a data-airflow href="{}">{} / {}</a> (try {})</td><td><a href="{}">{} job</a></td></tr>',
                page_link,
                job.job_id,
                job.platform,
                job.state,
                job.state,
                " " + job.record.err_class if job.record.err_class else "",
                gpus,
                job.record.num_nodes,
                _when(job.started_at),
                _duration(job.runtime_seconds(now)),
                "?" if hours is None else f"{hours:.3f}",
                task_url(base, job),
                job.dag_id,
                job.task_id,
                try_number,
                platform_link,
                job.platform,
            )
        )
    table = (
        "<table><thead><tr><th>Job</th><th>Platform</th><th>State</th><th class=num>GPUs &times; nodes</th>"
        "<th>Started (UTC)</th><th class=num>Runtime</th><th class=num>GPU-hours</th><th>DAG / task</th>"
        f"<th>On its platform</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        if rows
        else '<p class="empty">No TAO jobs match.</p>'
    )
    body = (
        "<h1>TAO jobs</h1>"
        f'<p class="sub">{len(jobs)} job(s), {total:.3f} GPU-hours. Read from Airflow\'s task records '
        "(task_state_store, XCom, task instances)."
        + (f" {ignored} invalid task record(s) ignored (the API server's log names them)." if ignored else "")
        + "</p>"
        f"{form}<div class=card><h2>GPU-hours per DAG per day</h2>"
        f"{chart(gpu_hours_by_dag_and_day(jobs, now))}</div>{table}{searches}"
    )
    return page("TAO jobs", body)


def job_page(
    job: IndexedJob,
    *,
    base: str,
    location: Mapping[str, str],
    job_url: str,
    results_url: str,
    log: str,
    log_note: str,
    results: Sequence[str],
    history: Sequence[IndexedJob],
    now: float | None = None,
    failure: Mapping[str, str] | None = None,
    actions: str = "",
    metrics: str = "",
) -> str:
    """One task instance's job: where it is on its platform, its live log (opened at its newest lines), its results
    and its earlier jobs; a failed job's exit code and failure words (``failure``); ``actions``: HTML of the buttons
    the user may press (:func:`airflow_provider_tao.plugins.cancel.form`, escaped there); ``metrics``: HTML of the
    metric curves its log reports (:func:`airflow_provider_tao.plugins.searches.job_metrics`, escaped there)."""
    now = now or time.time()
    handle = job.record.handle
    hours = job.gpu_hours(now)
    facts: list[tuple[str, str]] = [
        ("Job id", job.job_id),
        ("Name", str(handle.get("name", ""))),
        ("Platform", f"{job.platform} (connection {job.conn_id or 'default'})"),
        ("State", job.state + (f" ({job.record.err_class})" if job.record.err_class else "")),
        *(failure or {}).items(),
        ("Task", f"{job.dag_id} / {job.task_id} ({task_state_words(job)})"),
        ("GPUs x nodes", f"{'all' if job.record.gpu_count < 0 else job.record.gpu_count} x {job.record.num_nodes}"),
        ("Submitted (UTC)", _when(job.started_at)),
        ("Runtime", _duration(job.runtime_seconds(now))),
        ("GPU-hours", "?" if hours is None else f"{hours:.3f}"),
        ("Try", str(handle.get("try_number", 1))),
        *location.items(),
    ]
    dl = "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in facts if v)
    console = _out_link(job_url, "Open on its platform")
    outputs = "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in job.record.outputs.items())
    files = "".join(f"<li>{e(name)}</li>" for name in results)
    results_html = (
        f'<h2 id="results">Results</h2><div class=card><dl><dt>Location</dt><dd>{e(str(handle.get("results_dir")))}'
        f"</dd>{outputs}</dl>"
        + _out_link(results_url, "Open the results")
        + (f"<ul>{files}</ul>" if files else "")
        + "</div>"
    )
    earlier = "".join(
        f"<li>{e(old.job_id)} (try {e(str(old.record.handle.get('try_number', 1)))}): "
        f'<span class="badge {e(old.state)}">{e(old.state)}</span> {e(old.record.err_class)}</li>'
        for old in history
    )
    query = urlencode({"dag_id": job.dag_id})
    body = (
        f'<p><a href="{PLUGIN_URL_PREFIX}/jobs?{e(query)}">&larr; TAO jobs</a> &middot; '
        f'<a data-airflow href="{e(task_url(base, job))}">task {e(job.dag_id)} / {e(job.task_id)}</a></p>'
        f"<h1>TAO job {e(job.job_id)}</h1><p class=sub>{e(job.run_id)}</p>"
        f"<div class=card><dl>{dl}</dl>{console}{actions}</div>"
        f"{metrics}<h2>Log</h2><p class=sub>{e(log_note)}</p><div class=logbox><pre class=log>{e(log)}</pre></div>"
        f"{results_html}" + (f"<h2>Earlier jobs of this task</h2><ul>{earlier}</ul>" if earlier else "")
    )
    return page(
        f"TAO job {job.job_id}", body, refresh_seconds=0 if job.state in ("Complete", "Error", "Canceled") else 10
    )


def _out_link(url: str, text: str) -> str:
    url = safe_url(url)
    return f'<p><a href="{e(url)}" target="_blank" rel="noopener">{e(text)}</a></p>' if url else ""


def icon() -> str:
    """The navigation icon: a GPU chip."""
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" fill="none" stroke="#76b900" stroke-width="2">'
        '<rect x="5" y="5" width="14" height="14" rx="2"/><rect x="9" y="9" width="6" height="6"/>'
        '<path d="M9 2v3M15 2v3M9 19v3M15 19v3M2 9h3M2 15h3M19 9h3M19 15h3"/></svg>'
    )


def error_page(status: int, message: str) -> str:
    return page("TAO jobs", f"<h1>TAO jobs</h1><p class=empty>{e(str(status))}: {e(message)}</p>")


def as_filters(params: Mapping[str, Any]) -> dict[str, str]:
    return {key: str(params.get(key) or "") for key in ("dag_id", "platform", "state", "days", "q")}


def task_state_words(job: IndexedJob) -> str:
    """The task instance's state in words: a row with no state is a cleared task waiting to be scheduled again (or
    one not scheduled yet), not a task that is gone; only a deleted DAG run's task is gone."""
    if job.ti_state:
        return job.ti_state
    return "no state: cleared, waiting to be scheduled" if job.ti_exists else "gone: its DAG run was deleted"
