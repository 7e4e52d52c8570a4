"""The pair product's construction (:mod:`tests.explorer.pairs`), without a backend: which boundaries a second fault
lands at, and the dedupe by the decision's facts that keeps the product finite."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from tests.explorer.pair_report import accounts
from tests.explorer.pairs import ACTS, SECOND_FAULTS, STOPPING, FirstLevel, deduped, judged_as, pairs_of
from tests.explorer.simulate import Schedule

BOUNDARIES = (
    "execute:create_job#1",
    "execute:defer#1",
    "trigger:aget_job_statuses#1",  # the interruption fires here
    "on_kill:get_job_status#1",
    "on_kill:read_marks#1",
    "on_kill:get_job_status#2",  # the decision is asked after this one (index 6)
    "on_kill:cancel_job#1",
    "on_kill:cleanup_job#1",
    "execute:find_job#1",
    "execute:get_job_status#3",
    "execute:create_job#2",
    "execute:defer#2",
    "trigger:aget_job_statuses#2",  # past the decision's acts
)
FACTS = "Facts(try_number=1, state=RUNNING)"


def _level(facts: str = FACTS) -> FirstLevel:
    return FirstLevel(BOUNDARIES, "trigger:aget_job_statuses#1", ((1, "reattach", "x"), (6, "kill", facts)))


def test_second_faults_land_on_the_following_decision() -> None:
    first = Schedule("local", "ok", "trigger:aget_job_statuses#1", "clear")
    pairs = pairs_of(first, _level())
    seconds = list(dict.fromkeys(p.second for p in pairs))
    # from the interruption's boundary through the decision's fact read to ACTS boundaries of its acts; the
    # repeated read of the job's state is explored once
    assert seconds == [b for b in BOUNDARIES[2 : 6 + ACTS] if b != "on_kill:get_job_status#2"]
    assert all(p.key.startswith("local|kill|" + FACTS) for p in pairs)
    assert {p.key.split("|")[3].split(":")[0] for p in pairs} == {"read", "act"}
    # a stop lands only where a worker or a trigger step runs, never with the interruption itself
    stops = {(p.second, p.fault) for p in pairs if p.fault in STOPPING}
    assert stops == {(b, f) for b in BOUNDARIES[8 : 6 + ACTS] for f in sorted(STOPPING)}
    assert {p.fault for p in pairs} == set(SECOND_FAULTS)


def test_pairs_reaching_a_decision_with_the_same_facts_are_one() -> None:
    one = pairs_of(Schedule("local", "ok", "trigger:aget_job_statuses#1", "clear"), _level())
    other = pairs_of(Schedule("local", "ok", "trigger:aget_job_statuses#1", "mark_failed"), _level())
    differs = pairs_of(Schedule("local", "flaky", "trigger:aget_job_statuses#1", "clear"), _level("Facts(other)"))
    assert len(deduped(one + other)) == len(one)
    assert len(deduped(one + other + differs)) == len(one) + len(differs)


def test_no_decision_after_the_interruption_gives_no_pair() -> None:
    level = FirstLevel(BOUNDARIES, "execute:defer#2", ((6, "kill", FACTS),))
    assert pairs_of(Schedule("local", "ok", "execute:defer#2", "outage"), level) == []
    assert pairs_of(Schedule("local", "ok", "execute:defer#2", "outage"), FirstLevel(BOUNDARIES, None, ())) == []


def test_a_pair_is_judged_by_its_final_fault() -> None:
    first = Schedule("local", "ok", "execute:defer#1", "outage")
    pairs = {p.fault: p for p in pairs_of(first, _level())}
    expected = {"blip": None, "reap": None, "outage": None, "clear": None, "cli_cancel": "cli_cancel"}
    assert {fault: judged_as(pairs[fault]).interruption for fault in expected} == expected
    assert judged_as(pairs["mark_failed"]).interruption == "mark_failed"


def test_a_clear_after_a_persons_cancel_is_judged_as_a_clear() -> None:
    """A clear after the cancel runs the task again (the product's rule, ``test_issue_22_a_persons_cancel_while_the_
    task_waits_for_its_next_try_is_final_and_a_clear_runs_it_again``); a cancel after a clear is final."""
    cancel_first = Schedule("local", "ok", "execute:defer#1", "cli_cancel")
    assert judged_as(next(p for p in pairs_of(cancel_first, _level()) if p.fault == "clear")).interruption == "clear"
    clear_first = Schedule("local", "ok", "execute:defer#1", "clear")
    after = next(p for p in pairs_of(clear_first, _level()) if p.fault == "cli_cancel")
    assert judged_as(after).interruption == "cli_cancel"


def test_a_persons_cancel_has_second_faults_inside_the_cli_and_at_the_tasks_next_decision() -> None:
    """``airflow tao cancel`` runs beside the task (its boundaries ``cli:``): a blip, an outage, a reap or a
    second person's cancel lands at each of its calls, and the task's next decision keeps its own pairs."""
    boundaries = (
        "execute:create_job#1",
        "execute:defer#1",
        "trigger:aget_job_logs#1",  # the person's cancel starts here
        "cli:get_job_status#1",
        "trigger:aget_job_statuses#2",  # the trigger polls on beside the CLI
        "cli:store.set[tao_cancel]#1",
        "cli:get_job_status#2",  # the cancel routine decides after this one (index 7)
        "cli:cancel_job#1",
        "cli:canceled_by#1",
        "trigger:aget_job_statuses#3",
        "resume:find_job#1",  # the task resumes and decides (index 11)
        "resume:cancel_job#1",
    )
    decisions = ((7, "cli:cancel", "Facts(cli)"), (11, "resume", "Facts(task)"))
    first = Schedule("local", "ok", "trigger:aget_job_logs#1", "cli_cancel")
    pairs = pairs_of(first, FirstLevel(boundaries, "trigger:aget_job_logs#1", decisions))
    inside = [p for p in pairs if "|cli:cancel|" in p.key]
    assert {p.second for p in inside} == {b for b in boundaries if b.startswith("cli:")}
    assert {p.fault for p in inside} == set(SECOND_FAULTS) - STOPPING  # no stop inside a person's command
    task = [p for p in pairs if "|resume|" in p.key]
    assert not any(p.second.startswith("cli:") for p in task)
    assert {p.second for p in task} >= {"trigger:aget_job_logs#1", "resume:find_job#1", "resume:cancel_job#1"}


def test_the_account_spans_sittings_kept_gzipped_and_a_pairs_last_run_counts(tmp_path: Path) -> None:
    """A product run over sittings (one resumed on a fresh clone from the kept, gzipped record): each pair counts
    by its last run, the product is whole once a sitting ran to its end, and the commits explored are named."""
    first = [
        ["sitting", "local", "aaa1111", "2026-11-29T06:00:00Z"],
        ["local", "k1", "TAO_EXPLORE_PAIR='1'", False, ["I2: left running"], 3.0],
        ["local", "k2", "TAO_EXPLORE_PAIR='2'", True, [], 2.0],
    ]
    second = [
        ["sitting", "local", "bbb2222", "2026-11-29T09:00:00Z"],
        ["local", "k1", "TAO_EXPLORE_PAIR='1'", True, [], 4.0],
        ["product", "local", 2],
        ["whole", "local", 2, 1, 1],
    ]
    kept = tmp_path / "pairs-local.jsonl.gz"
    with gzip.open(kept, "wt") as out:
        out.writelines(json.dumps(row) + "\n" for row in first)
    resumed = tmp_path / "pairs-local.jsonl"
    resumed.write_text("".join(json.dumps(row) + "\n" for row in second))

    account = accounts([str(kept)])["local"]
    assert (account.whole, account.failing) == (False, ["TAO_EXPLORE_PAIR='1'"])
    account = accounts([str(kept), str(resumed)])["local"]
    assert (account.product, account.whole, account.failing, account.seconds) == (2, True, [], 9.0)
    assert account.sittings == ["aaa1111", "bbb2222"]
    assert "2 sitting(s) on aaa1111, bbb2222" in account.line("local")


def test_a_pair_that_failed_on_earlier_code_and_is_not_in_the_latest_whole_product_is_superseded(
    tmp_path: Path,
) -> None:
    """A resumed sitting runs again every pair of its product whose last run failed; a failed pair with no run in
    the latest whole sitting is no longer in the product (the code changed its decision's facts). One failing in
    the latest whole sitting, or in a sitting not yet whole, stays a violation."""
    report = tmp_path / "pairs-local.jsonl"
    report.write_text(
        "".join(
            json.dumps(row) + "\n"
            for row in [
                ["sitting", "local", "aaa1111", "t0"],
                ["local", "old", "TAO_EXPLORE_PAIR='old'", False, ["I2"], 1.0],
                ["whole", "local", 1, 1, 0],
                ["sitting", "local", "bbb2222", "t1"],
                ["local", "new", "TAO_EXPLORE_PAIR='new'", False, ["I4"], 1.0],
                ["whole", "local", 1, 1, 0],
                ["sitting", "local", "ccc3333", "t2"],
                ["local", "later", "TAO_EXPLORE_PAIR='later'", False, ["I1"], 1.0],
            ]
        )
    )
    account = accounts([str(report)])["local"]
    assert (account.failing, account.superseded) == (["TAO_EXPLORE_PAIR='new'", "TAO_EXPLORE_PAIR='later'"], 1)
