"""``TAOAutoMLOperator``: a hyperparameter search whose trials are jobs on any TAO platform -- in parallel, stopped
early by their live metrics, within a GPU-hour budget, resumed after any interruption.

Each decision (:meth:`TAOAutoMLOperator._decide`) reads what the trials did since the last one (statuses and
metric reports, from the trigger's event or the worker's own poll), records it, lets Optuna's pruner judge the new
steps, cancels the condemned trials, ends the search when a bound says so, asks Optuna for new trials up to
``max_concurrent_trials``, and keeps the whole study in ``task_state_store`` before it waits again. The trial jobs
are in :mod:`~airflow_provider_tao.automl.trials`, the study in :mod:`~airflow_provider_tao.automl.study`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowTaskTimeout

from airflow_provider_tao.automl.metrics import MetricParser
from airflow_provider_tao.automl.space import check_search_space, check_spec_paths, grid_of
from airflow_provider_tao.automl.study import (
    ALGORITHMS,
    BUDGET,
    ENDED_STATES,
    FAILURES_TO_STOP,
    PRUNED,
    PRUNERS,
    RUNNING,
    UNDECIDED_LOOKS,
    SearchConfig,
    SearchState,
    TrialRecord,
    check_algorithm_installed,
)
from airflow_provider_tao.automl.trials import STATE_KEY, TrialJobsMixin
from airflow_provider_tao.budget import checked_max_gpu_hours
from airflow_provider_tao.hooks.errors import JobValidationError
from airflow_provider_tao.jobs import JobHandle, JobState, JobStatus
from airflow_provider_tao.operators.lifecycle import KILL_ATTEMPTS, KILL_PAUSE_SECONDS
from airflow_provider_tao.operators.submit import TAOSubmitOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_tao.hooks.base import TAOPlatformHook

DIRECTIONS = ("minimize", "maximize")


class TAOAutoMLOperator(TrialJobsMixin, TAOSubmitOperator):
    """Search hyperparameters with trials that are jobs on a TAO platform (every ``TAOSubmitOperator`` argument
    applies to each trial), and return the best one.

    :param search_space: ``{name: {"type": "float"|"int"|"categorical", ...}}``; a name is a dotted spec path in
        config mode (``specs``), an argument name in args mode. Every trial gets its parameters as
        ``TAO_TRIAL_PARAMS`` (JSON) and its number as ``TAO_TRIAL_NUMBER`` in its environment.
    :param metric: the metric to optimise (with ``direction``), as the trials' log lines report it.
    :param direction: ``minimize`` or ``maximize``.
    :param objectives: several metrics instead: ``{"val_loss": "minimize", "latency_ms": "minimize"}``.
    :param algorithm: Optuna's sampler: ``random``, ``grid``, ``tpe``, ``gp``, ``cmaes`` or ``nsga2``.
    :param pruner: Optuna's pruner judging every reported step: ``asha``, ``hyperband``, ``median`` or None.
    :param max_trials: trials at most (pruned and failed ones count; an infrastructure rerun does not).
    :param max_concurrent_trials: trials running at once.
    :param max_gpu_hours: GPU-hours of all trials together, from the platforms' own times: no trial starts once
        it is reached, running ones are stopped when it is passed, and the search ends with the best so far.
    :param seed: makes the proposals repeatable.
    """

    def __init__(
        self,
        *,
        search_space: dict[str, dict[str, Any]],
        metric: str | None = None,
        direction: str | None = None,
        objectives: dict[str, str] | None = None,
        algorithm: str = "tpe",
        pruner: str | None = "asha",
        max_trials: int = 20,
        max_concurrent_trials: int = 4,
        max_gpu_hours: float | None = None,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.search_space = search_space
        self.max_gpu_hours = checked_max_gpu_hours(max_gpu_hours)  # over all trials: not the single job's budget
        self.config = _search_config(
            space=search_space, metric=metric, direction=direction, objectives=objectives, algorithm=algorithm,
            pruner=pruner, max_trials=max_trials, max_concurrent_trials=max_concurrent_trials, seed=seed,
        )  # fmt: skip
        if isinstance(self.specs, dict) and "{{" not in str(self.specs):
            check_spec_paths(self.config.space, self.specs)

    # ----------------------------------------------------------------- the search

    def execute(self, context: Context) -> dict[str, Any]:
        self._apply_config_defaults()
        try:
            hook = self._hook()
            if (missing := check_algorithm_installed(self.config.algorithm)) is not None:
                raise JobValidationError("algorithm", missing, "")
            if self.specs is not None:
                check_spec_paths(self.config.space, self.specs)  # as rendered
        except JobValidationError as exc:
            raise AirflowFailException(f"Bad input, no trial was submitted: {exc}") from exc
        state = SearchState.from_json(context["task_state_store"].get(STATE_KEY))
        if state is None or state.finished:  # a clear of a finished search starts a new one
            state = SearchState.new()
        else:
            self.log.info("Continuing search %s: %d trial(s) so far", state.study_name, len(state.trials))
        self._describe_task(context, state)
        state.objectives = dict(self.config.objectives)  # what the UI ranks and draws by
        self._adopt(context, hook, state)
        return self._search(context, hook, state, {})

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        state = SearchState.from_json(context["task_state_store"].get(STATE_KEY))
        if state is None:
            raise AirflowFailException("The search's state is gone from the task's state store")
        hook = self._hook()
        if event.get("status") == "timeout":
            return self._timed_out(context, hook, state)
        return self._search(context, hook, state, event.get("trials") or {})

    def _search(
        self, context: Context, hook: TAOPlatformHook, state: SearchState, seen: dict[str, Any]
    ) -> dict[str, Any]:
        """Decide, wait, decide again -- deferred (each wait a trigger) or on the worker -- until the search ends."""
        self._live_state = state  # what on_kill cancels
        self._describe_task(context, state)
        while True:
            self._decide(context, hook, state, seen)
            if not state.live:
                return self._finish(context, hook, state)
            if self.deferrable:
                self._defer_search(context, hook, state)
            if (deadline := self._deadline(context)) is not None and time.time() >= deadline:
                return self._timed_out(context, hook, state)
            time.sleep(self.interval)
            seen = self._poll(hook, state)

    def _describe_task(self, context: Context, state: SearchState) -> None:
        """What the job index keeps of every trial's job: the task's, as a single job's record has them."""
        state.task = {"gpu_count": self.gpu_count, "num_nodes": self.num_nodes, "cancel_on_kill": self.cancel_on_kill,
                      "deadline": self._deadline(context)}  # fmt: skip

    def _decide(self, context: Context, hook: TAOPlatformHook, state: SearchState, seen: dict[str, Any]) -> None:
        """One decision on what ``seen`` brings (``{number: {"job_status", "reports", "log_cursor", "parser"}}``)."""
        from airflow_provider_tao.automl.study import ask, judge

        to_judge = []
        for key, news in seen.items():
            trial = state.trial(int(key))
            if trial.state != RUNNING or news.get("job_id", trial.job_id) != trial.job_id:
                continue  # a stale observation: of a trial already decided, or of a job it no longer runs
            trial.log_cursor, trial.parser = str(news.get("log_cursor") or ""), dict(news.get("parser") or {})
            if any([trial.report(int(step), values, self.config.metrics) for step, values in news.get("reports", [])]):
                to_judge.append(trial.number)
            status = JobStatus.from_json(news["job_status"]) if news.get("job_status") else None
            if status is not None and (status.state.is_terminal or status.not_found):
                self._end_trial(hook, state, trial, status, context["ti"].try_number)
        for number, step in judge(self.config, state, to_judge).items():
            self._stop_trial(hook, state.trial(number), PRUNED, f"pruned at step {step}")
        self._keep_budget(hook, state)
        if state.failures_in_row >= FAILURES_TO_STOP:
            state.stop_reason = f"{state.failures_in_row} trials failed in a row before any completed"
            self._stop_all(hook, state, state.stop_reason)
        while not state.stop_reason and len(state.in_state(RUNNING)) < self.config.max_concurrent_trials:
            if rerun := [t for t in state.live if t.state != RUNNING]:
                self._start_trial(context, hook, state, rerun[0])  # an infrastructure failure's rerun
            elif len(state.trials) < self.config.max_trials:
                self._start_trial(context, hook, state, ask(self.config, state))
            else:
                break
        self._save(context, state)
        if stuck := [t for t in state.in_state(RUNNING) if t.undecided >= UNDECIDED_LOOKS]:
            raise AirflowException(
                f"Trial {stuck[0].number} (job {stuck[0].job_id}) ended, but {stuck[0].undecided} looks in a row "
                "could not read how (its marks or its failure analysis): the search's next try asks again"
            )

    def _keep_budget(self, hook: TAOPlatformHook, state: SearchState) -> None:
        if self.max_gpu_hours is None:
            return
        spent = state.gpu_hours + self._running_hours(hook, state)
        if spent >= self.max_gpu_hours:
            state.stop_reason = f"max_gpu_hours {self.max_gpu_hours} reached ({spent:.4f} GPU-hours)"
            self._stop_all(hook, state, state.stop_reason)

    def _budget_at(self, hook: TAOPlatformHook, state: SearchState) -> float | None:
        """When the running trials pass ``max_gpu_hours`` if they all keep running (the trigger wakes then)."""
        if self.max_gpu_hours is None:
            return None
        gpus = max(self.gpu_count, 0) * self.num_nodes * len(state.in_state(RUNNING))
        if gpus == 0:
            return None
        left = self.max_gpu_hours - state.gpu_hours - self._running_hours(hook, state)
        return time.time() + max(left, 0.0) * 3600 / gpus

    def _defer_search(self, context: Context, hook: TAOPlatformHook, state: SearchState) -> None:
        from airflow_provider_tao.triggers.automl import TAOAutoMLTrigger

        running = state.in_state(RUNNING)
        self.defer(
            trigger=TAOAutoMLTrigger(
                trials=[
                    {"number": t.number, "handle": t.handle, "log_cursor": t.log_cursor, "parser": t.parser}
                    for t in running
                ],
                metrics=list(self.config.metrics),
                judge_reports=self.config.pruner is not None and len(self.config.objectives) == 1,
                poll_interval=self.interval,
                deadline=self._deadline(context),
                budget_at=self._budget_at(hook, state),
                cancel_on_kill=self.cancel_on_kill,
            ),
            method_name="execute_complete",
            timeout=None,  # the trigger keeps the deadline and the operator cancels the trials
        )

    def _poll(self, hook: TAOPlatformHook, state: SearchState) -> dict[str, Any]:
        """The worker's twin of the trigger: one batched status call, then each running trial's new log lines."""
        running = {t.number: t for t in state.in_state(RUNNING) if t.handle}
        handles = {n: JobHandle.from_json(t.handle) for n, t in running.items()}  # type: ignore[arg-type]
        try:
            statuses = hook.get_job_statuses(list(handles.values()))
        except Exception as exc:  # an outage is no verdict: ask again next interval
            self.log.warning("Status poll of %d trial(s) failed: %s", len(handles), exc)
            statuses = {}
        seen: dict[str, Any] = {}
        for number, handle in handles.items():
            status = statuses.get(handle.job_id) or JobStatus.unknown("no answer")
            parser, cursor = (
                MetricParser.from_json(self.config.metrics, running[number].parser),
                running[number].log_cursor,
            )
            try:
                text, cursor = hook.get_job_logs(handle, cursor)
            except Exception as exc:  # logs are best effort
                self.log.debug("Reading trial %d's log failed: %s", number, exc)
                text = ""
            reports = [[r.step, r.values] for r in parser.feed(text, final=status.state.is_terminal)]
            seen[str(number)] = {
                "job_status": status.to_json() if status.state is not JobState.UNKNOWN or status.not_found else None,
                "reports": reports, "log_cursor": cursor, "parser": parser.to_json(),
            }  # fmt: skip
        return seen

    def _timed_out(self, context: Context, hook: TAOPlatformHook, state: SearchState) -> dict[str, Any]:
        self._stop_all(hook, state, "the task's execution_timeout passed")
        state.finished, state.stop_reason = True, "execution_timeout"
        self._save(context, state)
        best = self._results(hook, state)["best"]
        raise AirflowTaskTimeout(
            f"The search passed the task's execution_timeout; every trial was canceled. Best so far: {best}"
        )

    def on_kill(self) -> None:
        """Worker-side kill: cancel every trial this try runs, asking again for those whose cancel could not be
        decided (a failed read: a task marked failed has no later try to stop them), as a single job's kill does."""
        state = getattr(self, "_live_state", None)
        if not self.cancel_on_kill or state is None:
            return
        hook, left = self._hook(), list(state.live)
        for attempt in range(KILL_ATTEMPTS):
            left = [t for t in left if not self._stop_trial(hook, t, BUDGET, "the task was killed")]
            if not left or attempt == KILL_ATTEMPTS - 1:
                return
            self.log.warning("Could not stop trial(s) %s yet: asking again", [t.number for t in left])
            time.sleep(KILL_PAUSE_SECONDS * 2**attempt)

    # ----------------------------------------------------------------- the result

    def _finish(self, context: Context, hook: TAOPlatformHook, state: SearchState) -> dict[str, Any]:
        state.finished = True
        self._save(context, state)
        result = self._results(hook, state)
        if result["best"] is None:
            last = next((t.reason for t in reversed(state.trials) if t.reason), "no trial reported its metric")
            raise AirflowFailException(
                f"The search ended without a completed trial ({state.stop_reason or 'every trial ended'}): {last}"
            )
        best = result["best"]
        self.log.info("Best trial %d: %s with %s", best["trial"], best.get("value", best.get("values")), best["params"])
        self._publish(context, hook, JobHandle.from_json(state.trial(best["trial"]).handle))  # type: ignore[arg-type]
        self._publish_assets(
            context,
            {"job_id": best["job_id"], "platform": hook.platform, "results_dir": best["results_dir"],
             "outputs": best["outputs"], "metrics": best.get("values_by_metric"), "gpu_hours": result["gpu_hours"]},
        )  # fmt: skip
        return result

    def _results(self, hook: TAOPlatformHook, state: SearchState) -> dict[str, Any]:
        """The XCom: the best trial, every trial's row, the Pareto front (several objectives), the GPU-hours."""
        from airflow_provider_tao.automl.study import pareto_front, ranked

        several = len(self.config.objectives) > 1
        front = pareto_front(self.config, state) if several else []
        order = front or ranked(self.config, state)
        result: dict[str, Any] = {
            "best": self._best_row(order[0]) if order else None,
            "trials": [_row(t, several) for t in state.trials],
            "gpu_hours": round(state.gpu_hours, 6),
            "stop_reason": state.stop_reason,
        }
        if several:
            result["pareto_front"] = [_row(t, True) for t in front]
        return result

    def _best_row(self, trial: TrialRecord) -> dict[str, Any]:
        values = dict(zip(self.config.metrics, trial.values or [], strict=False))
        row: dict[str, Any] = {
            "trial": trial.number, "params": trial.params, "job_id": trial.job_id,
            "results_dir": trial.results_dir, "outputs": trial.outputs, "values_by_metric": values,
        }  # fmt: skip
        if len(self.config.objectives) > 1:
            row["values"] = trial.values
        else:
            row["value"] = trial.values[0] if trial.values else None
        return row


def _row(trial: TrialRecord, several: bool) -> dict[str, Any]:
    value: dict[str, Any] = (
        {"values": trial.values} if several else {"value": trial.values[0] if trial.values else None}
    )
    return {
        "trial": trial.number, "state": trial.state if trial.state in ENDED_STATES else BUDGET,
        "params": trial.params, **value, "last_step": trial.last_step, "gpu_hours": trial.gpu_hours,
        "job_id": trial.job_id, "reason": trial.reason,
    }  # fmt: skip


def _search_config(
    *,
    space: Any,
    metric: str | None,
    direction: str | None,
    objectives: dict[str, str] | None,
    algorithm: str,
    pruner: str | None,
    max_trials: int,
    max_concurrent_trials: int,
    seed: int | None,
) -> SearchConfig:
    """The search's parameters checked at parse time; bad input names the parameter and the fix."""
    checked = check_search_space(space)
    if objectives is not None and (metric is not None or direction is not None):
        raise JobValidationError("objectives", "given with metric/direction", "Give objectives OR metric+direction")
    if objectives is None:
        if not metric or direction is None:
            raise JobValidationError(
                "metric" if not metric else "direction", "missing", "Give metric='val_loss', direction='minimize'"
            )
        objectives = {metric: direction}
    if not isinstance(objectives, dict) or not objectives:
        raise JobValidationError(
            "objectives", f"{objectives!r} is not a non-empty mapping", 'Give {"metric": "minimize", ...}'
        )
    for name, way in objectives.items():
        if way not in DIRECTIONS:
            where = "direction" if metric else f"objectives[{name!r}]"
            raise JobValidationError(where, f"{way!r} is not a direction", "Use 'minimize' or 'maximize'")
    if algorithm not in ALGORITHMS:
        raise JobValidationError(
            "algorithm", f"unknown algorithm {algorithm!r}", f"Use one of: {', '.join(ALGORITHMS)}"
        )
    several = len(objectives) > 1
    if algorithm == "nsga2" and not several:
        raise JobValidationError("algorithm", "nsga2 searches several objectives, and one is given", "Use tpe")
    if several and algorithm in ("cmaes",):
        raise JobValidationError("algorithm", f"{algorithm} searches one objective", "Use nsga2, tpe or random")
    if pruner is not None and pruner not in PRUNERS:
        raise JobValidationError("pruner", f"unknown pruner {pruner!r}", f"Use one of: {', '.join(PRUNERS)}, or None")
    if pruner is not None and several:
        raise JobValidationError("pruner", "Optuna prunes only searches of one objective", "Use pruner=None")
    for name, value in (("max_trials", max_trials), ("max_concurrent_trials", max_concurrent_trials)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise JobValidationError(name, f"{value!r} is not a whole number >= 1", "Give 1 or more")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise JobValidationError("seed", f"{seed!r} is not an integer", "Give an int, or None")
    if algorithm == "grid":
        points = 1
        for values in grid_of(checked).values():
            points *= len(values)
        max_trials = min(max_trials, points)  # every grid point once
    return SearchConfig(checked, dict(objectives), algorithm, pruner, seed, max_trials, max_concurrent_trials)
