"""The study's state through JSON and the Optuna study rebuilt from it: proposals, pruning, ranking."""

from __future__ import annotations

import json

from airflow_provider_tao.automl.space import check_search_space
from airflow_provider_tao.automl.study import (
    COMPLETE,
    FAILED,
    PRUNED,
    RUNNING,
    SearchConfig,
    SearchState,
    ask,
    judge,
    pareto_front,
    ranked,
)

SPACE = check_search_space(
    {"lr": {"type": "float", "low": 1e-5, "high": 1e-1, "log": True}, "d": {"type": "int", "low": 1, "high": 9}}
)


def config(**kw: object) -> SearchConfig:
    return SearchConfig(space=SPACE, objectives={"val_loss": "minimize"}, **kw)  # type: ignore[arg-type]


def through_json(state: SearchState) -> SearchState:
    back = SearchState.from_json(json.loads(json.dumps(state.to_json())))
    assert back is not None
    return back


def finish(state: SearchState, number: int, value: float, steps: int = 3, cfg: SearchConfig | None = None) -> None:
    """Run trial ``number`` to its end, judged at every step as the operator does (when a pruner is given)."""
    trial = state.trial(number)
    trial.state = RUNNING
    for step in range(1, steps + 1):
        trial.report(step, {"val_loss": value + 1.0 / step}, ("val_loss",))
        if cfg is not None:
            judge(cfg, state, [number])
    trial.state, trial.values = COMPLETE, [value]


def test_a_rebuilt_study_never_proposes_the_same_trial_twice_with_a_seed() -> None:
    cfg, state = config(seed=7, algorithm="random"), SearchState.new()
    for _ in range(6):
        ask(cfg, state)
        state = through_json(state)
    assert [t.number for t in state.trials] == list(range(6))
    assert len({json.dumps(t.params, sort_keys=True) for t in state.trials}) == 6
    again = through_json(SearchState(study_name=state.study_name))
    assert ask(cfg, again).params == state.trial(0).params  # a seed makes the search repeatable


def test_log_ranges_are_sampled_on_a_log_scale() -> None:
    cfg, state = config(seed=1, algorithm="random"), SearchState.new()
    lrs = [ask(cfg, state).params["lr"] for _ in range(40)]
    assert sum(lr < 1e-3 for lr in lrs) >= 15  # linear sampling would put ~1% below 1e-3


def test_asha_condemns_a_running_trial_far_behind_the_finished_ones() -> None:
    cfg, state = config(seed=3, pruner="asha", max_trials=10), SearchState.new()
    for n in range(4):
        ask(cfg, state)
        finish(state, n, 0.1 * (n + 1), steps=9, cfg=cfg)
    bad, good = ask(cfg, state), ask(cfg, state)
    bad.state = good.state = RUNNING
    bad.report(1, {"val_loss": 50.0}, ("val_loss",))
    good.report(1, {"val_loss": 0.2}, ("val_loss",))
    state = through_json(state)
    assert judge(cfg, state, [bad.number, good.number]) == {bad.number: 1}
    assert any(k.startswith("completed_rung") for k in state.trial(good.number).system_attrs)  # kept for next time
    assert judge(config(pruner=None), state, [bad.number]) == {}


def test_reports_read_at_once_are_judged_step_by_step_best_first() -> None:
    """The first trials of a search reach ASHA's first rung in one poll: the batch's best is promoted (ASHA
    promotes the first to arrive among too few), the worse ones condemned -- was: judged by trial number, the worst
    promoted itself for being first, and ran every epoch (benchmarks/automl.py: 4-5 of 12 trials ran to the end)."""
    cfg, state = config(seed=3, pruner="asha", max_trials=10), SearchState.new()
    trials = [ask(cfg, state) for _ in range(3)]
    for trial, value in zip(trials, (9.0, 1.0, 5.0), strict=True):
        trial.state = RUNNING
        for step in (1, 2, 3):
            trial.report(step, {"val_loss": value + 1.0 / step}, ("val_loss",))
    assert judge(cfg, state, [t.number for t in trials]) == {trials[0].number: 1, trials[2].number: 1}


def test_failed_and_pruned_trials_are_never_ranked() -> None:
    cfg, state = config(seed=1), SearchState.new()
    for _ in range(4):
        ask(cfg, state)
    finish(state, 0, 0.5)
    state.trial(1).state, state.trial(1).values = FAILED, None
    state.trial(2).state = PRUNED
    state.trial(2).report(1, {"val_loss": 0.0}, ("val_loss",))
    finish(state, 3, 0.3)
    assert [t.number for t in ranked(cfg, state)] == [3, 0]
    assert [t.number for t in ranked(config(), state)] == [3, 0]
    maximize = SearchConfig(space=SPACE, objectives={"acc": "maximize"})
    assert [t.number for t in ranked(maximize, state)] == [0, 3]
    ask(cfg, through_json(state))  # failed / pruned trials rebuild fine


def test_several_objectives_give_a_pareto_front() -> None:
    cfg = SearchConfig(space=SPACE, objectives={"val_loss": "minimize", "latency_ms": "minimize"}, algorithm="nsga2")
    state = SearchState.new()
    for values in ([0.1, 9.0], [0.2, 1.0], [0.3, 5.0], [0.05, 20.0]):
        trial = ask(cfg, state)
        trial.state, trial.values = COMPLETE, values
    assert [t.number for t in pareto_front(cfg, through_json(state))] == [3, 0, 1]
    assert judge(config(pruner="asha"), state, []) == {}


def test_grid_search_walks_its_grid_without_repeats() -> None:
    space = check_search_space(
        {"d": {"type": "int", "low": 1, "high": 4}, "o": {"type": "categorical", "choices": ["a", "b"]}}
    )
    cfg, state = SearchConfig(space=space, objectives={"l": "minimize"}, algorithm="grid", seed=0), SearchState.new()
    for _ in range(8):
        ask(cfg, state)
        state = through_json(state)
    assert len({(t.params["d"], t.params["o"]) for t in state.trials}) == 8


def test_steps_that_arrive_together_are_judged_each_at_its_rung() -> None:
    """A trial behind at rung 1 (step 3) but reporting steps 3..8 in one decision is condemned at step 3 -- judged only
    at its last step it would pass (ASHA's next rung is step 9) and run to its end."""
    cfg, state = config(seed=3, pruner="asha", max_trials=10), SearchState.new()
    for n in range(3):
        ask(cfg, state)
        finish(state, n, 0.1 * (n + 1), steps=9, cfg=cfg)
    late = ask(cfg, state)
    late.state = RUNNING
    late.report(1, {"val_loss": 0.1}, ("val_loss",))  # first at rung 0: promoted
    assert judge(cfg, state, [late.number]) == {}
    for step in range(2, 9):  # then far behind, every step in one batch
        late.report(step, {"val_loss": 5.0}, ("val_loss",))
    assert judge(cfg, through_json(state), [late.number]) == {late.number: 3}
