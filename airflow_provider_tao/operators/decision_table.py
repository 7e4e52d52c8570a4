"""The decision table (``docs/decisions.md``), generated from :func:`~airflow_provider_tao.operators.decisions.decide`
over each situation's whole fact space, so the documentation cannot drift from the code.

Regenerate: ``python -m airflow_provider_tao.operators.decision_table > docs/decisions.md`` (a unit test checks the
committed file is current). Rows that differ only in one fact are merged (its values listed,
``any`` when all give the verdict); rows are listed in the order of the fact space.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from airflow_provider_tao.jobs import ErrClass, JobState
from airflow_provider_tao.operators.decisions import UNKNOWN, Facts, Situation, Verdict, decide

#: The deciding try of the table; 1 is an older try, 3 a newer one.
TRY = 2
STATES: list[Any] = [
    None, JobState.PENDING, JobState.RUNNING, JobState.COMPLETE, JobState.ERROR, JobState.CANCELED, UNKNOWN,
]  # fmt: skip
#: Each situation's facts (those its fact reader reads) and every value each can take (UNKNOWN: the read failed).
SPACE: dict[Situation, dict[str, list[Any]]] = {
    Situation.RESUME: {
        "outcome": ["complete", "error", "canceled", "timeout", "capacity", "budget"],
        "person_cancel": [None, "cli:jdoe", UNKNOWN],
        "canceled_by": [None, "cli:jdoe", UNKNOWN],
        "cancel_try": [None, 1, 2, 3, UNKNOWN],
        "state": STATES,
        "err_class": [None, ErrClass.ERR_PROGRAM, ErrClass.ERR_INFRA, UNKNOWN],
        "cancel_on_kill": [True, False],
        "over_budget": [None, False, True, UNKNOWN],
    },
    Situation.REATTACH: {
        "person_cancel": [None, "cli:jdoe", UNKNOWN],
        "state": STATES,
        "consumed_by": [None, 1, UNKNOWN],
        "owner_try": [1, 2, 3, UNKNOWN],
        "cancel_try": [None, 1, 2, UNKNOWN],
        "canceled_by": [None, "reap: orphan", UNKNOWN],
    },
    Situation.KILL: {
        "cancel_on_kill": [True, False],
        "task_state": [None, "deferred", "running", "up_for_retry", "failed", "success", UNKNOWN],
        "last_chance": [False, True],
        "owner_try": [1, 2, 3, UNKNOWN],
        "state": STATES,
    },
    Situation.PERSON: {"state": STATES, "owner_try": [1, 2, 3, UNKNOWN]},
    Situation.SWEEP: {
        "young": [False, True],
        "recorded": [True, False],
        "same_connection": [True, False],
        "task_state": ["running", "deferred", "up_for_retry", None, "failed", "success", UNKNOWN],
        "current": [True, False],
        "task_exists": [True, False],
        "past_deadline": [False, True],
        "cancel_on_kill": [True, False],
        "lease_expired": [False, True],
    },
}


#: Facts read in one case only (fact -> the fact and value that say when): elsewhere they are None (not read).
READ_ONLY_WHEN: dict[Situation, dict[str, tuple[str, Any]]] = {
    Situation.RESUME: {"over_budget": ("outcome", "budget")},  # the job's GPU-hours: max_gpu_hours
}


def fact_space(situation: Situation) -> Iterator[Facts]:
    """Every combination of the situation's facts, for try :data:`TRY` (a fact read in one case only is None in
    the others, and read -- not None -- in that one)."""
    names = list(SPACE[situation])
    only_when = READ_ONLY_WHEN.get(situation, {})
    for values in itertools.product(*SPACE[situation].values()):
        facts = dict(zip(names, values, strict=True))
        if all((facts[when] == value) == (facts[name] is not None) for name, (when, value) in only_when.items()):
            yield Facts(try_number=TRY, **facts)


def _word(value: Any) -> str:
    if value is UNKNOWN:
        return "unknown"
    if value is None:
        return "none"
    return str(value.value if hasattr(value, "value") else value)


def _verdict_cells(verdict: Verdict) -> tuple[str, ...]:
    extras = [name for name in ("clean_up", "adoptable", "stop") if getattr(verdict, name)]
    return verdict.act.value, _word(verdict.err_class) if verdict.err_class else "", " ".join(extras), verdict.why


Row = tuple[tuple[frozenset[str], ...], tuple[str, ...]]


def _merge(rows: list[Row], dimension: int) -> list[Row]:
    """Rows equal but in ``dimension`` become one row with the union of their values there."""
    groups: dict[tuple[Any, ...], list[Row]] = {}
    for row in rows:
        key = (row[0][:dimension], row[0][dimension + 1 :], row[1])
        groups.setdefault(key, []).append(row)
    return [
        ((*before, frozenset().union(*(m[0][dimension] for m in members)), *after), verdict)
        for (before, after, verdict), members in groups.items()
    ]


def rows(situation: Situation) -> list[Row]:
    """The situation's table: one row per combination, merged where a fact does not matter."""
    names = list(SPACE[situation])
    table: list[Row] = [
        (tuple(frozenset({_word(getattr(f, n))}) for n in names), _verdict_cells(decide(f, situation)))
        for f in fact_space(situation)
    ]
    for _ in range(2):
        for dimension in reversed(range(len(names))):
            table = _merge(table, dimension)
    return table


def _cell(values: frozenset[str], full: list[str]) -> str:
    return "any" if len(values) == len(full) else ", ".join(v for v in full if v in values)


def markdown() -> str:
    """``docs/decisions.md``."""
    lines = [
        "# Decision table",
        "",
        "<!-- generated by `python -m airflow_provider_tao.operators.decision_table > docs/decisions.md`: "
        "do not edit -->",
        "",
        "Every verdict of `operators/decisions.py` `decide(facts, situation)` over each situation's whole fact space "
        f"(the deciding try is {TRY}; try 1 is an older one, 3 a newer one). `unknown` is a read that failed: it "
        "never flips a verdict, it defers it (`later`: the task is retried with the facts still binding it, or the "
        "same decision is asked again). `any`: every value of that fact gives the row's verdict. The acts follow "
        "the verdict: cleanup (`clean_up`) is best effort and only for an ended job (or one the verdict stops); "
        "`adoptable` keeps what a next try needs to adopt a completed job. The invariants the verdicts keep are "
        "checked over the same space by `tests/unit/test_decision_space.py` (see reliability.md).",
        "",
    ]
    for situation, facts_values in SPACE.items():
        names = list(facts_values)
        full = [[_word(v) for v in facts_values[n]] for n in names]
        table = rows(situation)
        lines += [f"## {situation.value} ({len(table)} rows)", ""]
        lines.append("| " + " | ".join([*names, "verdict", "class", "then", "why"]) + " |")
        lines.append("|" + "---|" * (len(names) + 4))
        for facts, verdict in table:
            cells = [_cell(values, full[i]) for i, values in enumerate(facts)]
            lines.append("| " + " | ".join([*cells, *verdict]) + " |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(), end="")
