"""The AutoML search in the TAO plugin: its trials, the chart of their metric per step (pruned faded, best marked),
a single job's curve read from its log with the search's parser -- and every value from a job stays text."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from airflow_provider_tao.automl.study import SearchState, TrialRecord
from airflow_provider_tao.jobs import JobHandle
from airflow_provider_tao.plugins import app as plugin_app
from airflow_provider_tao.plugins import pages, searches
from tests.unit.test_trust_pages import assert_no_markup_passes, serve  # noqa: F401 (serve: the app fixture)

EVIL = '<script>alert("x")</script>'


def _search(metric: str = "val_loss", direction: str = "minimize") -> searches.Search:
    trials = [
        TrialRecord(0, {"lr": 0.01}, "complete", job_id="a" * 12, intermediate={"1": 0.9, "2": 0.5}, values=[0.5],
                    gpu_hours=0.25),
        TrialRecord(1, {"lr": 0.1, EVIL: EVIL}, "pruned", job_id="b" * 12, intermediate={"1": 1.5}, reason=EVIL),
        TrialRecord(2, {"lr": 0.001}, "complete", job_id="c" * 12, intermediate={"1": 0.8, "2": 0.6, "3": 0.3},
                    values=[0.3], gpu_hours=0.5),
        TrialRecord(3, {"lr": 0.05}, "running", job_id="d" * 12, intermediate={"1": 0.7}),
    ]  # fmt: skip
    state = SearchState("tao-search-1", trials, objectives={metric: direction})
    return searches.Search("tune_dag", "manual__1", "tune", -1, state)


def test_the_search_page_shows_every_trial_and_a_curve_each_pruned_faded_best_marked() -> None:
    body = searches.search_body(_search(), trial_links={2: "https://console.example/c"})
    assert body.count("<polyline") == 4 and body.count('class="best"') == 1
    assert re.search(r'class="curve pruned"[^>]*opacity="0.25"', body)
    assert "<title>best: trial 2</title>" in body and "2 (best)" in body
    assert 'href="https://console.example/c"' in body and "0.5000" in body  # its link and GPU-hours
    assert "val_loss per step" in body


def test_maximize_marks_the_highest_value() -> None:
    assert searches.best_trial(_search("acc", "maximize").state).number == 0  # type: ignore[union-attr]


def test_a_hostile_trial_param_metric_name_and_reason_come_out_escaped() -> None:
    search = _search(metric=EVIL)
    page = pages.page("s", searches.search_body(search, trial_links={0: "javascript:alert(1)"}))
    listed = searches.searches_list([search])
    for text in (page, listed):
        assert "<script>alert" not in text
    assert "&lt;script&gt;" in page and "javascript:" not in page
    assert json.dumps(searches.search_json(search))  # the JSON endpoint's body is plain data
    assert searches.search_json(search)["best_trial"] == 2


def test_a_record_that_is_not_a_search_is_refused() -> None:
    assert searches.checked_search({"study_name": "s", "trials": [{"number": 0, "params": "x"}]}) is None
    assert searches.checked_search({"study_name": "s", "trials": [{"bogus": 1}]}) is None
    assert searches.checked_search("not json") is None
    assert searches.checked_search(json.dumps(_search().state.to_json())) is not None


def test_the_jobs_view_lists_a_searchs_trials_under_it() -> None:
    listed = searches.searches_list([_search()])
    assert listed.count("<li>trial ") == 4 and "/tao/searches/tune_dag/manual__1/tune" in listed


def test_a_single_jobs_page_draws_its_own_curve_from_its_log() -> None:
    log = "\n".join(
        [
            'TAO_METRIC {"step": 1, "val_loss": 0.9}',
            "Epoch 2/3 val_loss=0.7",
            json.dumps({"epoch": 3, "kpi": {"val_loss": 0.4, EVIL: 1}}),
            "TAO_METRIC " + json.dumps({"step": 1, EVIL: 2, "x<y": 3}),
        ]
    )
    assert searches.log_curves(log) == {"val_loss": [(1, 0.9), (2, 0.7), (3, 0.4)]}  # a hostile name: not a metric
    hostile = searches.metric_chart([("this job", [(1, 2.0)], "running")], metric=EVIL)
    assert "<script" not in hostile and "&lt;script&gt;" in hostile
    html = searches.job_metrics(log)
    assert html.count("<polyline") == 1 and "<script" not in html
    assert searches.job_metrics("no metrics here") == ""


def test_the_routes_serve_a_search_to_its_readers_only_and_keep_it_text(
    serve: Callable[..., TestClient],  # noqa: F811 (the fixture imported above)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    search = _search(metric=EVIL)
    search.state.trials[1].handle = JobHandle(
        "fake", "fake_conn", "b" * 12, "n", console_url="https://fake/b?" + EVIL
    ).to_json()
    stranger = serve({}, entities={"TASK_LOGS"})
    client = serve({}, entities={"TASK_LOGS"}, dags=frozenset({"tune_dag"}))
    reader = serve({}, entities={"XCOM"}, dags=frozenset({"tune_dag"}))
    monkeypatch.setattr(plugin_app, "_searches", lambda dags, *_, **__: [search] if "tune_dag" in dags else [])
    assert stranger.get("/searches/tune_dag/manual__1/tune").status_code == 404  # a DAG the user may not read
    page = client.get("/searches/tune_dag/manual__1/tune")
    assert page.status_code == 200 and page.text.count("<polyline") == 4 and "https://fake/" not in page.text
    assert_no_markup_passes(page.text)
    assert 'http-equiv="refresh"' in page.text  # a search not finished reloads itself while its task is deferred
    redirected = client.get("/jobs/tune_dag/manual__1/tune", follow_redirects=False)
    assert redirected.headers["location"] == "/tao/searches/tune_dag/manual__1/tune"
    data = client.get("/api/searches/tune_dag/manual__1/tune").json()
    assert data["metric"] == EVIL and [t["state"] for t in data["trials"]][:2] == ["complete", "pruned"]
    view = client.get("/jobs").text
    assert "AutoML searches" in view and view.count("<li>trial ") == 4
    assert_no_markup_passes(view)
    linked = reader.get("/searches/tune_dag/manual__1/tune").text
    assert 'href="https://fake/b?' in linked  # the trial's job on its platform, for those who may read XComs
    assert_no_markup_passes(linked)  # the trial's job on its platform, for those who may read XComs
