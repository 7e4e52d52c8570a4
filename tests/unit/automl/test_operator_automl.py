"""``TAOAutoMLOperator`` on the in-memory platform: trials as child jobs, decisions through the real trigger, state
that survives tries, budgets, failures, results."""

from __future__ import annotations

import asyncio
import importlib
import json
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from airflow_provider_tao.automl.trials import STATE_KEY
from airflow_provider_tao.jobs import JobState
from airflow_provider_tao.operators.automl import TAOAutoMLOperator
from tests.unit.fakes import FakeHook, Store, make_context

SPACE = {
    "train.lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
    "model.depth": {"type": "int", "low": 1, "high": 4},
}
SPECS = {"train": {"lr": 0.01, "epochs": 9}, "model": {"depth": 2}}


def make(**kwargs: Any) -> TAOAutoMLOperator:
    defaults: dict[str, Any] = {
        "task_id": "train", "conn_id": "fake_conn", "image": "img:1", "command": "train.py --config {config_path}",
        "specs": SPECS, "search_space": SPACE, "metric": "val_loss", "direction": "minimize", "seed": 1,
        "max_trials": 6, "max_concurrent_trials": 3, "deferrable": True, "poll_interval": 0.05,
    }  # fmt: skip
    return TAOAutoMLOperator(**{**defaults, **kwargs})


def deferral(call: Any) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as exc:
        call()
    return exc.value


def event_of(deferred: TaskDeferred) -> dict[str, Any]:
    """The event of the trigger the triggerer rebuilds from the deferral (its real run(), on the fake platform)."""
    path, kwargs = deferred.trigger.serialize()
    module, _, name = path.rpartition(".")
    trigger = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))

    async def first() -> dict[str, Any]:
        events = trigger.run()
        try:
            return (await events.__anext__()).payload
        finally:
            await events.aclose()

    return asyncio.run(first())


def trial_jobs(fake: type[FakeHook]) -> dict[int, dict[str, Any]]:
    """Each trial's newest job, by trial number (from TAO_TRIAL_NUMBER in its environment)."""
    jobs: dict[int, dict[str, Any]] = {}
    for job in sorted(fake.jobs.values(), key=lambda j: j["handle"].submitted_at):
        jobs[int(job["spec"].env["TAO_TRIAL_NUMBER"])] = job
    return jobs


def run_epochs(fake: type[FakeHook], job: dict[str, Any], losses: list[float], end: JobState | None = None) -> None:
    job_id = job["handle"].job_id
    start = len(fake.logs.get(job_id, "").splitlines())
    fake.logs[job_id] = fake.logs.get(job_id, "") + "".join(
        f"epoch {start + i + 1} loss=1.0 val_loss={v}\n" for i, v in enumerate(losses)
    )
    if end is not None:
        job["state"] = end
        job["exit"] = 0 if end is JobState.COMPLETE else 1


def test_trials_are_child_jobs_with_their_params_in_env_and_spec(fake_platform: type[FakeHook]) -> None:
    store = Store()
    deferred = deferral(lambda: make().execute(make_context(store)))
    jobs = trial_jobs(fake_platform)
    assert sorted(jobs) == [0, 1, 2]  # max_concurrent_trials at once
    state = store.data[STATE_KEY]
    for number, job in jobs.items():
        params = json.loads(job["spec"].env["TAO_TRIAL_PARAMS"])
        assert params == state["trials"][number]["params"]
        assert f"-t{number}-" in job["handle"].name
        spec_text = job["spec"].files["spec.yaml"] if "spec.yaml" in job["spec"].files else str(job["spec"].files)
        assert repr(params["train.lr"])[:6] in spec_text  # written at its dotted path into the spec file
    assert len({j["handle"].name for j in jobs.values()}) == 3
    kwargs = deferred.trigger.serialize()[1]
    assert [t["number"] for t in kwargs["trials"]] == [0, 1, 2] and kwargs["metrics"] == ["val_loss"]
    again = make()._trial_name(make_context(Store()), FakeHook(), 1)
    assert again == jobs[1]["handle"].name  # deterministic: task instance + trial number


def test_search_runs_to_the_end_prunes_the_hopeless_and_returns_the_best(fake_platform: type[FakeHook]) -> None:
    store, context = Store(), make_context(Store())
    context["task_state_store"] = store
    op = make(max_trials=5, max_concurrent_trials=2)
    deferred = deferral(lambda: op.execute(context))
    losses = {0: 0.5, 1: 0.3, 2: 9.0, 3: 0.2, 4: 0.4}
    result = None
    while result is None:
        for number, job in trial_jobs(fake_platform).items():
            if job["state"] is JobState.RUNNING:
                steps = len(fake_platform.logs.get(job["handle"].job_id, "").splitlines())
                run_epochs(
                    fake_platform, job, [losses[number] + 1.0 / (steps + 1)], JobState.COMPLETE if steps >= 8 else None
                )
        event = event_of(deferred)
        try:
            result = make(max_trials=5, max_concurrent_trials=2).execute_complete(context, event)
        except TaskDeferred as again:
            deferred = again
    rows = {r["trial"]: r for r in result["trials"]}
    assert len(rows) == 5 and all(r["state"] in ("complete", "pruned") for r in rows.values())
    assert rows[2]["state"] == "pruned" and rows[2]["last_step"] < 9  # stopped early, never ranked
    assert fake_platform.jobs[rows[2]["job_id"]]["state"] is JobState.CANCELED
    best = result["best"]
    assert best["trial"] == 3 and best["value"] == pytest.approx(0.2 + 1 / 9)
    assert best["params"] == store.data[STATE_KEY]["trials"][3]["params"] and best["job_id"] == rows[3]["job_id"]
    assert store.data[STATE_KEY]["finished"] is True


def test_a_retry_adopts_trials_in_flight_and_never_runs_one_twice(fake_platform: type[FakeHook]) -> None:
    store = Store()
    deferral(lambda: make().execute(make_context(store, try_number=1)))
    first = {n: j["handle"].job_id for n, j in trial_jobs(fake_platform).items()}
    # a worker killed between trial 2's submission and its record: the store still says "waiting"
    store.data[STATE_KEY]["trials"][2].update(state="waiting", handle=None)
    deferred = deferral(lambda: make().execute(make_context(store, try_number=2)))
    assert len(fake_platform.jobs) == 3  # nothing submitted again
    assert {t["number"]: t["handle"]["job_id"] for t in deferred.trigger.serialize()[1]["trials"]} == first
    assert all(FakeHook().job_owner(j["handle"]) == 2 for j in fake_platform.jobs.values())  # claimed by try 2


def test_a_finished_search_cleared_starts_a_new_one(fake_platform: type[FakeHook]) -> None:
    store = Store()
    deferral(lambda: make(max_trials=1).execute(make_context(store)))
    store.data[STATE_KEY]["finished"] = True
    deferral(lambda: make(max_trials=1).execute(make_context(store, try_number=2)))
    assert len(fake_platform.jobs) == 2 and len(store.data[STATE_KEY]["trials"]) == 1


def test_three_program_errors_in_a_row_stop_the_search(fake_platform: type[FakeHook]) -> None:
    context = make_context(Store())
    deferred = deferral(lambda: make(max_trials=10).execute(context))
    for job in fake_platform.jobs.values():
        fake_platform.logs[job["handle"].job_id] = "Traceback (most recent call last):\nValueError: bad config\n"
        job["state"], job["exit"] = JobState.ERROR, 1
    with pytest.raises(AirflowFailException, match=r"3 trials failed in a row.*ERR_PROGRAM"):
        make(max_trials=10).execute_complete(context, event_of(deferred))
    assert len(fake_platform.jobs) == 3  # the budget was not burnt


def test_an_infrastructure_failure_reruns_the_trial_with_its_params(fake_platform: type[FakeHook]) -> None:
    context = make_context(Store())
    deferred = deferral(lambda: make(max_trials=1, retries=1).execute(context))
    (job,) = fake_platform.jobs.values()
    job["state"], job["exit"], job["raw"] = JobState.ERROR, None, "NodeFail"
    deferred = deferral(lambda: make(max_trials=1, retries=1).execute_complete(context, event_of(deferred)))
    assert len(fake_platform.jobs) == 2
    rerun = next(j for j in fake_platform.jobs.values() if j is not job)
    assert rerun["spec"].env["TAO_TRIAL_PARAMS"] == job["spec"].env["TAO_TRIAL_PARAMS"]
    assert context["task_state_store"].data[STATE_KEY]["trials"][0]["attempts"] == 2


def test_a_trial_that_never_reports_its_metric_is_failed_and_says_the_forms(fake_platform: type[FakeHook]) -> None:
    context = make_context(Store())
    deferred = deferral(lambda: make(max_trials=1).execute(context))
    (job,) = fake_platform.jobs.values()
    fake_platform.logs[job["handle"].job_id] = "epoch 1 loss=0.3\n"
    job["state"], job["exit"] = JobState.COMPLETE, 0
    with pytest.raises(AirflowFailException, match=r"without reporting val_loss; recognised forms: TAO_METRIC"):
        make(max_trials=1).execute_complete(context, event_of(deferred))


def test_a_persons_cancel_of_one_trial_records_it_canceled_and_the_search_goes_on(
    fake_platform: type[FakeHook],
) -> None:
    context = make_context(Store())
    deferred = deferral(lambda: make(max_trials=4, max_concurrent_trials=2).execute(context))
    victim = trial_jobs(fake_platform)[0]
    FakeHook().cancel_job(victim["handle"], requested_by="cli:jdoe")
    deferred = deferral(
        lambda: make(max_trials=4, max_concurrent_trials=2).execute_complete(context, event_of(deferred))
    )
    trials = context["task_state_store"].data[STATE_KEY]["trials"]
    assert trials[0]["state"] == "canceled" and "cli:jdoe" in trials[0]["reason"]
    assert [t["number"] for t in deferred.trigger.serialize()[1]["trials"]] == [1, 2]  # a new trial took its place


def test_gpu_budget_stops_running_trials_and_ends_with_the_best_so_far(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    context = make_context(Store())
    op = make(max_trials=6, max_concurrent_trials=2, max_gpu_hours=1.0, gpu_count=2)
    deferred = deferral(lambda: op.execute(context))
    jobs = trial_jobs(fake_platform)
    budget_at = deferred.trigger.serialize()[1]["budget_at"]
    assert budget_at is not None
    run_epochs(fake_platform, jobs[0], [0.4], JobState.COMPLETE)
    jobs[0]["ended"] = jobs[0]["started"] + 3600 * 0.2  # 2 GPUs x 0.2 h = 0.4 GPU-hours
    jobs[1]["started"] -= 3600 * 0.4  # running for 0.4 h on 2 GPUs: 0.8 more -> 1.2 > 1.0
    result = make(max_trials=6, max_concurrent_trials=2, max_gpu_hours=1.0, gpu_count=2).execute_complete(
        context, event_of(deferred)
    )
    rows = {r["trial"]: r for r in result["trials"]}
    assert rows[0]["state"] == "complete" and rows[1]["state"] == "budget"
    assert fake_platform.jobs[rows[1]["job_id"]]["state"] is JobState.CANCELED
    assert len(rows) == 2 and result["best"]["trial"] == 0 and result["gpu_hours"] >= 1.0
    assert "max_gpu_hours" in result["stop_reason"]


@pytest.mark.parametrize(
    ("kwargs", "parameter", "says"),
    [
        ({"search_space": {"train.lr": {"type": "uniform"}}}, "search_space['train.lr']", "unknown type"),
        ({"search_space": {"train.lr": {"type": "float", "low": 1, "high": 1}}}, "search_space['train.lr']", "low 1"),
        (
            {"search_space": {"train.lr": {"type": "float", "low": 0, "high": 1, "log": True}}},
            "search_space['train.lr']",
            "low > 0",
        ),
        ({"search_space": {"train.bs": {"type": "categorical", "choices": []}}}, "search_space['train.bs']", "empty"),
        (
            {"search_space": {"train.lrr": {"type": "int", "low": 1, "high": 2}}},
            "search_space['train.lrr']",
            "no 'lrr'",
        ),
        ({"metric": None}, "metric", "missing"),
        ({"direction": None}, "direction", "missing"),
        ({"direction": "down"}, "direction", "'down' is not a direction"),
        ({"algorithm": "nsga2"}, "algorithm", "nsga2 searches several objectives"),
        ({"algorithm": "bayesian"}, "algorithm", "unknown algorithm"),
        ({"pruner": "asha2"}, "pruner", "unknown pruner"),
        (
            {"metric": None, "direction": None, "objectives": {"val_loss": "minimize", "ms": "minimize"}},
            "pruner",
            "one objective",
        ),
        ({"max_trials": 0}, "max_trials", "not a whole number"),
        ({"max_gpu_hours": -1}, "max_gpu_hours", "not a positive number"),
    ],
)
def test_bad_input_is_refused_when_the_dag_is_parsed(kwargs: dict[str, Any], parameter: str, says: str) -> None:
    from airflow_provider_tao.hooks.errors import JobValidationError

    with pytest.raises(JobValidationError) as exc:
        make(**kwargs)
    assert exc.value.parameter == parameter and says in str(exc.value), str(exc.value)


def test_several_objectives_return_a_pareto_front(fake_platform: type[FakeHook]) -> None:
    objectives = {"val_loss": "minimize", "latency_ms": "minimize"}
    kw: dict[str, Any] = {"metric": None, "direction": None, "objectives": objectives, "algorithm": "nsga2"}
    kw |= {"pruner": None, "max_trials": 3}
    context = make_context(Store())
    deferred = deferral(lambda: make(**kw).execute(context))
    assert deferred.trigger.serialize()[1]["judge_reports"] is False
    for number, job in trial_jobs(fake_platform).items():
        loss, ms = [(0.1, 9.0), (0.2, 1.0), (0.3, 5.0)][number]
        fake_platform.logs[job["handle"].job_id] = f'TAO_METRIC {{"step": 1, "val_loss": {loss}, "latency_ms": {ms}}}\n'
        job["state"], job["exit"] = JobState.COMPLETE, 0
    result = make(**kw).execute_complete(context, event_of(deferred))
    assert [r["trial"] for r in result["pareto_front"]] == [0, 1]
    assert result["best"]["trial"] == 0 and result["best"]["values"] == [0.1, 9.0]
    assert {r["trial"]: r["values"] for r in result["trials"]}[2] == [0.3, 5.0]


def test_the_best_trials_model_is_the_tasks_asset_event(fake_platform: type[FakeHook]) -> None:
    from unittest import mock

    from airflow.sdk import Asset

    model = Asset(name="tuned", uri="file:///models/tuned")
    event = mock.MagicMock(extra={})
    context = make_context(Store())
    context["outlet_events"] = {model: event}
    deferred = deferral(lambda: make(max_trials=2, max_concurrent_trials=2, outlets=[model]).execute(context))
    for number, job in trial_jobs(fake_platform).items():
        run_epochs(fake_platform, job, [0.5 - number * 0.1], JobState.COMPLETE)
    result = make(max_trials=2, max_concurrent_trials=2, outlets=[model]).execute_complete(context, event_of(deferred))
    best = result["best"]
    assert best["trial"] == 1
    assert event.extra["job_id"] == best["job_id"] and event.extra["results_dir"] == best["results_dir"]
    assert event.extra["metrics"] == {"val_loss": pytest.approx(0.4)} and event.extra["task_id"] == "train"


def test_one_status_call_per_poll_for_all_trials(fake_platform: type[FakeHook]) -> None:
    deferred = deferral(lambda: make(max_concurrent_trials=3).execute(make_context(Store())))
    trials = {j["handle"].job_id for j in fake_platform.jobs.values()}
    fake_platform.status_calls.clear()
    job = next(iter(fake_platform.jobs.values()))
    job["state"], job["exit"] = JobState.COMPLETE, 0
    event_of(deferred)
    assert fake_platform.status_calls and all(set(call) == trials for call in fake_platform.status_calls)


def test_marking_the_deferred_task_failed_cancels_every_trial(fake_platform: type[FakeHook]) -> None:
    deferred = deferral(lambda: make(max_concurrent_trials=3).execute(make_context(Store())))
    path, kwargs = deferred.trigger.serialize()
    module, _, name = path.rpartition(".")
    trigger = getattr(importlib.import_module(module), name)(**kwargs)
    asyncio.run(trigger.on_kill())  # no task instance to ask: the task is not deferred any more
    assert [j["state"] for j in fake_platform.jobs.values()] == [JobState.CANCELED] * 3
    assert all(j["marks"]["cancel_requested_by"] == 1 for j in fake_platform.jobs.values())


def test_a_trigger_that_only_moved_to_another_triggerer_leaves_the_trials(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_tao.triggers.automl import TAOAutoMLTrigger
    from airflow_provider_tao.triggers.job import TAOJobTrigger

    async def still_deferred(self: TAOJobTrigger) -> str:
        return "deferred"

    monkeypatch.setattr(TAOJobTrigger, "_task_state", still_deferred)  # each trial's job decided as a single job
    deferred = deferral(lambda: make(max_concurrent_trials=2).execute(make_context(Store())))
    asyncio.run(TAOAutoMLTrigger(**deferred.trigger.serialize()[1]).on_kill())
    assert [j["state"] for j in fake_platform.jobs.values()] == [JobState.RUNNING] * 2


def test_a_missing_extra_fails_before_the_first_trial_naming_it(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None if name in ("torch", "scipy") else object())
    with pytest.raises(AirflowFailException, match=r"algorithm: algorithm='gp' needs torch, scipy: pip install"):
        make(algorithm="gp").execute(make_context(Store()))
    assert fake_platform.jobs == {}
