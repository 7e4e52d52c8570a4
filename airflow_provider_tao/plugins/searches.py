"""An AutoML search in the TAO plugin: its trials (state, parameters, value, GPU-hours, link) and a chart of every
trial's metric against its step (pruned trials faded, the best one marked); a single job's own metric curve.

A search is read only from its task's ``task_state_store`` (key ``tao_automl``, which only the task writes: the
verified record); a record that does not read as a search is refused, never shown. Every value from it (parameters,
metric names, reasons) is escaped through :func:`~airflow_provider_tao.plugins.escape.html`; the chart is inline SVG
drawn here (no script), and a deferred search's page reloads itself like a running job's page.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_tao.automl.metrics import METRIC_PREFIX, MetricParser
from airflow_provider_tao.automl.study import COMPLETE, PRUNED, SearchState, TrialRecord
from airflow_provider_tao.automl.trials import STATE_KEY
from airflow_provider_tao.links import PLUGIN_URL_PREFIX, safe_url
from airflow_provider_tao.plugins.escape import Html, html

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

#: Metric names a single job's curve looks for in free-form lines (JSON lines name their own).
COMMON_METRICS = ("loss", "val_loss", "accuracy", "val_accuracy", "acc", "val_acc", "mAP", "map")
#: Most curves one chart draws (a search of hundreds of trials stays readable and small).
MAX_CURVES = 64
_COLOURS = ("#017cee", "#76b900", "#e8710a", "#a142f4", "#12b5cb", "#d93025", "#f9ab00", "#5f6368")
_NAME = re.compile(r"^[\w./-]{1,64}$")


@dataclass
class Search:
    """One task instance's search, as its ``task_state_store`` holds it."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    state: SearchState

    def path(self) -> str:
        from urllib.parse import quote

        path = (
            f"{PLUGIN_URL_PREFIX}/searches/{quote(self.dag_id, safe='')}/{quote(self.run_id, safe='')}/"
            f"{quote(self.task_id, safe='')}"
        )
        return path if self.map_index < 0 else f"{path}?map_index={self.map_index}"


def checked_search(value: Any) -> SearchState | None:
    """``value`` as a search state, or None when it is not one (wrong types are refused, not shown)."""
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    try:
        state = SearchState.from_json(value)
        if state is None:
            return None
        for trial in state.trials:
            if not isinstance(trial.params, dict) or not isinstance(trial.intermediate, dict):
                return None
            float(trial.gpu_hours)
            [(int(step), float(v)) for step, v in trial.intermediate.items()]
            if trial.values is not None and not all(isinstance(v, (int, float)) for v in trial.values):
                return None
        return state
    except (TypeError, ValueError):
        return None


def load_searches(
    session: Session, *, dag_ids: Iterable[str], run_id: str | None = None, rejected: list[str] | None = None
) -> list[Search]:
    """The searches recorded for ``dag_ids`` (the DAGs the viewer may read), read only from ``task_state_store``."""
    from airflow.models.task_state_store import TaskStateStoreModel
    from sqlalchemy import select

    wanted = set(dag_ids)
    query = select(TaskStateStoreModel).where(TaskStateStoreModel.key == STATE_KEY)
    if run_id is not None:
        query = query.where(TaskStateStoreModel.run_id == run_id)
    found = []
    for row in session.scalars(query):
        if row.dag_id not in wanted:
            continue
        state = checked_search(row.value)
        if state is None:
            log.warning("Ignoring the search record of %s/%s/%s: not a search", row.dag_id, row.run_id, row.task_id)
            if rejected is not None:
                rejected.append(f"{row.dag_id}/{row.run_id}/{row.task_id}")
            continue
        found.append(Search(row.dag_id, row.run_id, row.task_id, int(row.map_index), state))
    return found


def first_objective(state: SearchState) -> tuple[str, str]:
    """The metric the chart draws and its direction (the search's first objective)."""
    for metric, direction in (state.objectives if isinstance(state.objectives, dict) else {}).items():
        return str(metric), "maximize" if direction == "maximize" else "minimize"
    return "metric", "minimize"


def best_trial(state: SearchState) -> TrialRecord | None:
    """The complete trial with the best first objective (the one the operator ranks first)."""
    complete = [t for t in state.in_state(COMPLETE) if t.values]
    if not complete:
        return None
    sign = -1.0 if first_objective(state)[1] == "maximize" else 1.0
    return min(complete, key=lambda t: (sign * float(t.values[0]) if t.values else math.inf, t.number))


def curves_of(state: SearchState) -> list[tuple[str, list[tuple[int, float]], str]]:
    """Per trial: its label, its (step, value) points in step order and its state."""
    return [curve_of(t) for t in state.trials]


def curve_of(trial: TrialRecord) -> tuple[str, list[tuple[int, float]], str]:
    return f"trial {trial.number}", sorted((int(s), float(v)) for s, v in trial.intermediate.items()), trial.state


def metric_chart(
    curves: Sequence[tuple[str, Sequence[tuple[int, float]], str]],
    *,
    metric: str,
    best: str | None = None,
    width: int = 640,
    height: int = 240,
) -> Html:
    """Every curve as a line of ``metric`` against the step (SVG); pruned ones faded, ``best`` drawn thick."""
    drawn = [(label, list(points), state) for label, points, state in curves[:MAX_CURVES] if points]
    if not drawn:
        return html('<p class="empty">No {} reported yet.</p>', metric)
    steps = [s for _, points, _ in drawn for s, _ in points]
    values = [v for _, points, _ in drawn for _, v in points]
    x0, x1, y0, y1 = min(steps), max(steps), min(values), max(values)
    left, right, top, bottom = 56, 10, 10, 24

    def x(step: int) -> float:
        return left + (step - x0) / ((x1 - x0) or 1) * (width - left - right)

    def y(value: float) -> float:
        return top + (y1 - value) / ((y1 - y0) or 1) * (height - top - bottom)

    parts = [
        html(
            '<svg role="img" aria-label="{} per step" width="{}" height="{}" viewBox="0 0 {} {}" font-size="11" '
            'fill="#5f6b7a"><line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#cbd5e0"/>'
            '<text x="{}" y="{}" text-anchor="end">{:.4g}</text><text x="{}" y="{}" text-anchor="end">{:.4g}</text>'
            '<text x="{}" y="{}">step {}</text><text x="{}" y="{}" text-anchor="end">step {}</text>',
            metric,
            width,
            height,
            width,
            height,
            left,
            height - bottom,
            width - right,
            height - bottom,
            left - 4,
            top + 8,
            y1,
            left - 4,
            height - bottom,
            y0,
            left,
            height - 6,
            x0,
            width - right,
            height - 6,
            x1,
        )
    ]
    for index, (label, points, state) in enumerate(drawn):
        colour = _COLOURS[index % len(_COLOURS)]
        mark = label == best
        opacity, stroke = ("0.25", "1") if state == PRUNED else ("1", "3" if mark else "1.5")
        line = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in points)
        parts.append(
            html(
                '<polyline class="curve {}" points="{}" fill="none" stroke="{}" stroke-width="{}" opacity="{}">'
                "<title>{} ({}): {} {:.4g} at step {}</title></polyline>",
                state,
                line,
                colour,
                stroke,
                opacity,
                label,
                state,
                metric,
                points[-1][1],
                points[-1][0],
            )
        )
        if mark:
            s, v = points[-1]
            parts.append(
                html(
                    '<circle class="best" cx="{:.1f}" cy="{:.1f}" r="5" fill="{}"><title>best: {}</title></circle>',
                    x(s),
                    y(v),
                    colour,
                    label,
                )
            )
    parts.append(Html("</svg>"))
    return html('<div class="chart">{}</div>', Html("".join(parts)))


def _value(trial: TrialRecord) -> str:
    if not trial.values:
        return ""
    return ", ".join(f"{v:.6g}" for v in trial.values)


def trials_table(state: SearchState, *, trial_links: Mapping[int, str], best: TrialRecord | None) -> Html:
    """One row per trial: number, state, parameters, value, last step, GPU-hours, its job (linked when allowed)."""
    rows = []
    for trial in state.trials:
        link = safe_url(trial_links.get(trial.number, ""))
        job = html('<a href="{}" target="_blank" rel="noopener">{}</a>', link, trial.job_id) if link else trial.job_id
        rows.append(
            html(
                '<tr><td>{}{}</td><td><span class="badge trial-{}">{}</span> {}</td><td><code>{}</code></td>'
                '<td class="num">{}</td><td class="num">{}</td><td class="num">{:.4f}</td><td>{}</td></tr>',
                trial.number,
                " (best)" if trial is best else "",
                trial.state,
                trial.state,
                trial.reason,
                json.dumps(trial.params, sort_keys=True, default=str),
                _value(trial),
                "" if trial.last_step is None else trial.last_step,
                float(trial.gpu_hours),
                job,
            )
        )
    if not rows:
        return Html('<p class="empty">No trial started yet.</p>')
    head = (
        "<table><thead><tr><th>Trial</th><th>State</th><th>Parameters</th><th class=num>Value</th>"
        "<th class=num>Last step</th><th class=num>GPU-hours</th><th>Job</th></tr></thead><tbody>"
    )
    return Html(head + "".join(rows) + "</tbody></table>")


def search_body(search: Search, *, trial_links: Mapping[int, str]) -> Html:
    """The search page's body: its totals, the chart of its first objective and the trials."""
    state, best = search.state, best_trial(search.state)
    metric = first_objective(state)[0]
    label = f"trial {best.number}" if best else None
    words = "finished" if state.finished else "running"
    return html(
        '<p><a href="{}/jobs">&larr; TAO jobs</a></p><h1>AutoML search {}</h1><p class=sub>{} / {} / {} -- {}, '
        "{} trial(s), {:.4f} GPU-hours{}</p><div class=card><h2>{} per step</h2>{}</div><h2>Trials</h2>{}",
        Html(PLUGIN_URL_PREFIX),
        state.study_name,
        search.dag_id,
        search.run_id,
        search.task_id,
        words,
        len(state.trials),
        state.gpu_hours,
        f" ({state.stop_reason})" if state.stop_reason else "",
        metric,
        metric_chart(curves_of(state), metric=metric, best=label),
        trials_table(state, trial_links=trial_links, best=best),
    )


def search_json(search: Search) -> dict[str, Any]:
    """The search as the JSON endpoint gives it (the same facts as the page)."""
    best = best_trial(search.state)
    return {
        "dag_id": search.dag_id,
        "run_id": search.run_id,
        "task_id": search.task_id,
        "map_index": search.map_index,
        "study_name": search.state.study_name,
        "finished": search.state.finished,
        "stop_reason": search.state.stop_reason,
        "gpu_hours": round(search.state.gpu_hours, 6),
        "best_trial": best.number if best else None,
        "metric": first_objective(search.state)[0],
        "trials": [
            {
                "trial": t.number,
                "state": t.state,
                "params": t.params,
                "values": t.values,
                "gpu_hours": t.gpu_hours,
                "job_id": t.job_id,
                "reason": t.reason,
                "curve": [list(point) for point in curve_of(t)[1]],
            }
            for t in search.state.trials
        ],
    }


def searches_list(searches: Sequence[Search]) -> Html:
    """The jobs view's section: each search, its trials listed under it."""
    if not searches:
        return Html("")
    items = []
    for search in searches:
        trials = "".join(
            html("<li>trial {}: {} {} {}</li>", t.number, t.state, t.job_id, _value(t)) for t in search.state.trials
        )
        items.append(
            html(
                '<li><a href="{}">{} / {} ({})</a>: {} trial(s), {:.4f} GPU-hours<ul>{}</ul></li>',
                search.path(),
                search.dag_id,
                search.task_id,
                search.run_id,
                len(search.state.trials),
                search.state.gpu_hours,
                Html(trials),
            )
        )
    return html("<div class=card><h2>AutoML searches</h2><ul>{}</ul></div>", Html("".join(items)))


def log_curves(log_text: str, names: Iterable[str] = COMMON_METRICS) -> dict[str, list[tuple[int, float]]]:
    """A single job's metric curves from its log, with the search's parser (the same line forms): the metrics that
    its JSON lines name, and ``names`` in free-form lines."""
    wanted = list(dict.fromkeys(names))
    for line in log_text.splitlines():
        brace = line.find("{", line.find(METRIC_PREFIX) if METRIC_PREFIX in line else 0)
        if brace < 0 or (METRIC_PREFIX not in line and '"kpi"' not in line):
            continue
        try:
            data = json.loads(line[brace:])
        except ValueError:
            continue
        source = data.get("kpi", data) if isinstance(data, dict) else {}
        if isinstance(source, dict):
            wanted += [k for k in source if isinstance(k, str) and _NAME.match(k) and k not in wanted]
    curves: dict[str, dict[int, float]] = {}
    for report in MetricParser(tuple(wanted)).feed(log_text, final=True):
        for name, value in report.values.items():
            if name not in ("step", "epoch", "cur_iter"):
                curves.setdefault(name, {})[report.step] = value
    return {name: sorted(points.items()) for name, points in curves.items()}


def job_metrics(log_text: str) -> Html:
    """The job page's metric section: one chart per metric its log reports (nothing when none)."""
    charts = [
        html("<h3>{}</h3>{}", name, metric_chart([("this job", points, "running")], metric=name))
        for name, points in log_curves(log_text).items()
    ]
    return html("<h2>Metrics</h2><div class=card>{}</div>", Html("".join(charts))) if charts else Html("")
