"""The log budget's rules, on a clock the test sets: who reads at a poll, how quiet jobs back off, ends first."""

from __future__ import annotations

from airflow_provider_tao.triggers.log_budget import LogBudget


def test_a_quiet_job_backs_off_to_the_ceiling_and_a_printing_one_is_read_every_poll() -> None:
    budget = LogBudget(10, ceiling=60.0)
    reads = {"quiet": 0, "printing": 0}
    for poll in range(120):  # ten minutes of 5 s polls
        now = poll * 5.0
        for job in budget.plan(reads, now=now):
            reads[job] += 1
            budget.record(job, printed=job == "printing", interval=5.0, now=now)
    assert reads["printing"] == 120
    # 5, 10, 20, 40 s gaps, then once a minute: ~4 + 9 reads in ten minutes
    assert 10 <= reads["quiet"] <= 15


def test_ended_jobs_come_first_then_the_longest_waiting_then_the_printing_ones() -> None:
    budget = LogBudget(3, ceiling=60.0)
    jobs = ["printing", "quiet", "starved"]
    assert budget.plan(jobs, now=0.0) == set(jobs)  # new jobs: all due at once
    budget.record("printing", printed=True, interval=5.0, now=0.0)
    budget.record("quiet", printed=False, interval=5.0, now=0.0)
    budget.record("starved", printed=False, interval=5.0, now=-100.0)  # due long ago, never served
    # one read left after the two ended jobs' reads: the job waiting past the ceiling goes first
    assert budget.plan(jobs, ending=["a", "b"], now=5.0) == {"starved"}
    assert budget.final_turn("a") and budget.final_turn("b")
    assert not budget.final_turn("a")  # the interval's reads are spent: the operator reads the rest
    budget.record("starved", printed=False, interval=5.0, now=5.0)
    assert budget.plan(jobs, now=10.0) == {"printing", "quiet"}


def test_a_batched_platform_reads_every_log_at_every_poll() -> None:
    budget = LogBudget(None)
    jobs = [f"j{i}" for i in range(1000)]
    assert budget.plan(jobs, ending=["x"]) == set(jobs)
    assert all(budget.final_turn("x") for _ in range(100))
