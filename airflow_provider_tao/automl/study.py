"""A search's whole state (trials, parameters, every intermediate value, job handles), kept as JSON in the task's
state store after every decision, and the in-memory Optuna study rebuilt from it for each decision.

Optuna decides (its samplers propose, its pruners judge: ask-and-tell); this module only carries its trials across
worker processes: each decision rebuilds a study from the stored trials (``optuna.trial.create_trial`` +
``study.add_trial``, with their system attributes, where ASHA keeps its rungs and grid search its grid points), asks
or judges, and reads back what Optuna wrote. Optuna is imported only here, and only when a search runs.
"""

from __future__ import annotations

import secrets
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

#: A trial's states. ``waiting``: asked, its job not yet (known to be) submitted -- the write-ahead of its job name.
WAITING, RUNNING = "waiting", "running"
COMPLETE, PRUNED, FAILED, CANCELED, BUDGET = "complete", "pruned", "failed", "canceled", "budget"
LIVE_STATES = (WAITING, RUNNING)
ENDED_STATES = (COMPLETE, PRUNED, FAILED, CANCELED, BUDGET)
ALGORITHMS = ("random", "grid", "tpe", "gp", "cmaes", "nsga2")
PRUNERS = ("asha", "hyperband", "median")
#: Failures in a row, before any trial completed, that stop a search (a broken program would burn the budget).
FAILURES_TO_STOP = 3
#: Looks in a row at an ended trial whose facts could not be read (its marks, its failure analysis) before the
#: search's try gives up for a retry, as a single job's resume does at its first: the next try asks again.
UNDECIDED_LOOKS = 5


@dataclass
class SearchConfig:
    """What a search is: its space (checked), objectives and algorithms (the operator's parameters)."""

    space: dict[str, dict[str, Any]]
    objectives: dict[str, str]  # metric -> "minimize" | "maximize", in order
    algorithm: str = "tpe"
    pruner: str | None = "asha"
    seed: int | None = None
    max_trials: int = 20
    max_concurrent_trials: int = 4

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(self.objectives)

    @property
    def directions(self) -> list[str]:
        return list(self.objectives.values())


@dataclass
class TrialRecord:
    """One trial as the state store keeps it.

    :param number: Optuna's trial number (0, 1, ...). :param params: its parameters.
    :param state: one of ``waiting``, ``running``, ``complete``, ``pruned``, ``failed``, ``canceled``, ``budget``.
    :param job_id: its current job's ``TAO_JOB_ID`` (written before the submission). :param name: its job name.
    :param handle: its current job's handle (``JobHandle.to_json()``), once submitted.
    :param intermediate: step (as a string: JSON keys) -> the first objective's value reported at that step.
    :param last_values: every wanted metric's last reported value. :param value: its final value(s).
    :param attempts: jobs run for it (an infrastructure failure reruns it). :param gpu_hours: what its jobs used.
    :param reason: why it ended (failure class, budget, pruned at step N). :param log_cursor: :param parser: where
        reading its log stopped. :param system_attrs: what Optuna's samplers and pruners keep with it.
    """

    number: int
    params: dict[str, Any]
    state: str = WAITING
    job_id: str = ""
    name: str = ""
    handle: dict[str, Any] | None = None
    intermediate: dict[str, float] = field(default_factory=dict)
    last_values: dict[str, float] = field(default_factory=dict)
    values: list[float] | None = None
    attempts: int = 1
    gpu_hours: float = 0.0
    reason: str = ""
    err_class: str = ""
    log_cursor: str = ""
    parser: dict[str, Any] = field(default_factory=dict)
    system_attrs: dict[str, Any] = field(default_factory=dict)
    results_dir: str = ""
    outputs: dict[str, str] = field(default_factory=dict)
    started_at: float | None = None
    judged_step: int | None = None  # the last step the pruner judged
    undecided: int = 0  # looks in a row at its ended job that could not decide (bounded: UNDECIDED_LOOKS)

    @property
    def last_step(self) -> int | None:
        return max(map(int, self.intermediate)) if self.intermediate else None

    def report(self, step: int, values: Mapping[str, float], metrics: Sequence[str]) -> bool:
        """Record one report; True when it brings a new step of the first objective (something a pruner judges)."""
        self.last_values.update({k: v for k, v in values.items() if k in metrics})
        if metrics[0] not in values:
            return False
        new = str(step) not in self.intermediate
        self.intermediate[str(step)] = float(values[metrics[0]])
        return new


@dataclass
class SearchState:
    """The whole search. ``finished``: its result was returned (a clear starts a new search). ``task``: what the
    job index needs of every trial's job (``gpu_count``, ``num_nodes``, ``cancel_on_kill``, ``deadline``: the
    task's, as a single job's record keeps them; :mod:`~airflow_provider_tao.automl.index`)."""

    study_name: str
    trials: list[TrialRecord] = field(default_factory=list)
    finished: bool = False
    stop_reason: str = ""
    failures_in_row: int = 0
    task: dict[str, Any] = field(default_factory=dict)
    objectives: dict[str, str] = field(default_factory=dict)  # metric -> direction, for the UI

    @classmethod
    def new(cls) -> SearchState:
        return cls(study_name=f"tao-search-{secrets.token_hex(6)}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> SearchState | None:
        if not isinstance(data, dict) or "study_name" not in data:
            return None
        trials = [TrialRecord(**t) for t in data.get("trials") or []]
        fields = {k: data[k] for k in ("finished", "stop_reason", "failures_in_row", "task", "objectives") if k in data}
        return cls(study_name=str(data["study_name"]), trials=trials, **fields)

    def in_state(self, *states: str) -> list[TrialRecord]:
        return [t for t in self.trials if t.state in states]

    @property
    def live(self) -> list[TrialRecord]:
        return self.in_state(*LIVE_STATES)

    @property
    def gpu_hours(self) -> float:
        return sum(t.gpu_hours for t in self.trials)

    def trial(self, number: int) -> TrialRecord:
        return self.trials[number]


# ----------------------------------------------------------------- Optuna (imported only below)


def _optuna() -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def check_algorithm_installed(algorithm: str) -> str | None:
    """What is missing for ``algorithm`` (None: it can run): Optuna itself, and the packages its sampler needs."""
    needs = {"gp": ("optuna", "torch", "scipy"), "cmaes": ("optuna", "cmaes")}.get(algorithm, ("optuna",))
    import importlib.util

    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return f"algorithm={algorithm!r} needs {', '.join(missing)}: pip install 'airflow-provider-tao[automl]'" + (
        " torch scipy" if "torch" in missing or "scipy" in missing else ""
    )


def _sampler(config: SearchConfig, state: SearchState) -> Any:
    """A sampler for one decision; seeded by the search's seed and how many trials exist, so a rebuilt study does
    not draw the same 'random' parameters again."""
    samplers = _optuna().samplers
    draws = len(state.trials)
    seed = None if config.seed is None else (config.seed * 1_000_003 + draws) % (2**32)
    startup = max(2, min(10, config.max_trials // 3))
    if config.algorithm == "random":
        return samplers.RandomSampler(seed=seed)
    if config.algorithm == "grid":
        from airflow_provider_tao.automl.space import grid_of

        # the search's own seed, never one per decision: the sampler shuffles its grid with it, and a trial's
        # grid_id must name the same point in every rebuilt study
        grid_seed = config.seed if config.seed is not None else zlib.crc32(state.study_name.encode())
        return samplers.GridSampler(grid_of(config.space), seed=grid_seed)
    if config.algorithm == "gp":
        return samplers.GPSampler(seed=seed, n_startup_trials=startup)
    if config.algorithm == "cmaes":
        return samplers.CmaEsSampler(seed=seed, n_startup_trials=startup)
    if config.algorithm == "nsga2":
        return samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, config.max_trials // 3)))
    return samplers.TPESampler(seed=seed, n_startup_trials=startup, constant_liar=True)


def _pruner(config: SearchConfig) -> Any:
    pruners = _optuna().pruners
    if config.pruner is None or len(config.objectives) > 1:
        return pruners.NopPruner()
    if config.pruner == "hyperband":
        return pruners.HyperbandPruner(min_resource=1, reduction_factor=3)
    if config.pruner == "median":
        return pruners.MedianPruner(n_startup_trials=min(5, max(1, config.max_trials // 4)), n_warmup_steps=1)
    return pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)


def build_study(config: SearchConfig, state: SearchState, unjudged_hidden: set[int] | None = None) -> Any:
    """An in-memory Optuna study holding every trial of ``state`` (waiting and running ones as RUNNING); the trials
    in ``unjudged_hidden`` without the steps the pruner has not judged yet (:func:`judge` reports them in order)."""
    optuna = _optuna()
    from airflow_provider_tao.automl.space import distributions

    study = optuna.create_study(
        study_name=state.study_name,
        directions=config.directions,
        sampler=_sampler(config, state),
        pruner=_pruner(config),
    )
    dists = distributions(config.space)
    kinds = {
        COMPLETE: optuna.trial.TrialState.COMPLETE,
        PRUNED: optuna.trial.TrialState.PRUNED,
        FAILED: optuna.trial.TrialState.FAIL,
        CANCELED: optuna.trial.TrialState.FAIL,
        BUDGET: optuna.trial.TrialState.FAIL,
    }
    multi = len(config.objectives) > 1
    for trial in state.trials:
        kind = kinds.get(trial.state, optuna.trial.TrialState.RUNNING)
        if kind == optuna.trial.TrialState.COMPLETE and not trial.values:
            kind = optuna.trial.TrialState.FAIL  # never ranked without a value
        complete = kind == optuna.trial.TrialState.COMPLETE
        study.add_trial(
            optuna.trial.create_trial(
                state=kind,
                params=trial.params,
                distributions={k: v for k, v in dists.items() if k in trial.params},
                values=trial.values if complete and multi else None,
                value=trial.values[0] if complete and not multi and trial.values else None,
                # intermediate values only for one objective (Optuna prunes only those)
                intermediate_values={} if multi else _intermediate(trial, trial.number in (unjudged_hidden or ())),
                system_attrs=trial.system_attrs,
            )
        )
    return study


def _intermediate(trial: TrialRecord, judged_only: bool) -> dict[int, float]:
    steps = {int(s): v for s, v in trial.intermediate.items()}
    if not judged_only:
        return steps
    return {s: v for s, v in steps.items() if trial.judged_step is not None and s <= trial.judged_step}


def ask(config: SearchConfig, state: SearchState) -> TrialRecord:
    """The next trial Optuna proposes (appended to ``state`` as ``waiting``)."""
    from airflow_provider_tao.automl.space import distributions

    study = build_study(config, state)
    proposed = study.ask(distributions(config.space))
    record = TrialRecord(number=proposed.number, params=dict(proposed.params))
    record.system_attrs = _json_attrs(study.trials[proposed.number].system_attrs)
    state.trials.append(record)
    return record


def judge(config: SearchConfig, state: SearchState, numbers: Iterable[int]) -> dict[int, int]:
    """The trials among ``numbers`` (running, with reports at new steps) the pruner condemns, and at which step.

    Each new step is judged (as if the trial had reported it alone), step by step across the trials: steps that
    arrive together -- one poll reads several trials, a resume of the worker takes a while and the trials run on --
    are not judged only at the last one, so a trial behind at a rung is caught at that rung. Reports of one step
    read at once are judged best value first: their order of arrival is unknown here, and ASHA promotes whichever
    reaches a rung first among too few -- judged by trial number, a batch's worst promoted itself as often as its
    best (benchmarks/automl.py). What the pruner keeps with each judged trial (ASHA's rungs) is written back into
    ``state``."""
    if config.pruner is None or len(config.objectives) > 1:
        return {}
    optuna = _optuna()
    judged = {n: state.trial(n) for n in numbers if state.trial(n).state == RUNNING and state.trial(n).intermediate}
    study = build_study(config, state, unjudged_hidden=set(judged))
    sign = 1.0 if config.directions[0] == "minimize" else -1.0
    reports = sorted(
        (int(step), sign * value, number)
        for number, record in judged.items()
        for step, value in record.intermediate.items()
        if record.judged_step is None or int(step) > record.judged_step
    )
    live = {n: optuna.trial.Trial(study, study.trials[n]._trial_id) for n in judged}
    condemned: dict[int, int] = {}
    for step, _, number in reports:
        if number in condemned:
            continue
        live[number].report(judged[number].intermediate[str(step)], step)
        judged[number].judged_step = step
        if live[number].should_prune():
            condemned[number] = step
    for number, record in judged.items():
        record.system_attrs = _json_attrs(study.trials[number].system_attrs)
    return condemned


def _json_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    import json

    kept = {}
    for key, value in attrs.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue  # Optuna keeps only JSON values there (its storages serialise them); never seen otherwise
        kept[key] = value
    return kept


def ranked(config: SearchConfig, state: SearchState) -> list[TrialRecord]:
    """Completed trials with a value, best first (first objective); failed, pruned or canceled ones never."""
    done = [t for t in state.trials if t.state == COMPLETE and t.values]
    sign = 1.0 if config.directions[0] == "minimize" else -1.0
    return sorted(done, key=lambda t: (sign * t.values[0], t.number))  # type: ignore[index]


def pareto_front(config: SearchConfig, state: SearchState) -> list[TrialRecord]:
    """Several objectives: the completed trials no other completed trial dominates (Optuna's ``best_trials``)."""
    if not any(t.state == COMPLETE and t.values for t in state.trials):
        return []
    numbers = {t.number for t in build_study(config, state).best_trials}
    return [t for t in ranked(config, state) if t.number in numbers]
