"""The pure parts of ``benchmarks/automl.py`` and its trainer (the benchmark itself is run by hand, never in CI)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import automl as bench
from benchmarks import automl_trainer as trainer
from benchmarks.automl_anchor_driver import schema_property


def ledger(*records: tuple[str, int, float, bool, float | None]) -> list[dict[str, object]]:
    return [{"event": e, "pid": pid, "t": t, "complete": c, "value": v} for e, pid, t, c, v in records]


def test_the_target_is_within_two_percent_of_the_best_either_side_found() -> None:
    assert bench.target([0.20, 0.15]) == pytest.approx(0.153)
    assert bench.target([-2.0, 1.0]) == pytest.approx(-1.96)  # a negative best: 2 % of its size, still "near"


def test_the_time_to_reach_counts_only_trials_that_ran_to_their_end() -> None:
    runs = ledger(
        ("start", 1, 100.0, False, None),
        ("end", 1, 104.0, False, 0.10),  # canceled (pruned) below the goal: not a value the search found
        ("start", 2, 100.0, False, None),
        ("end", 2, 108.0, True, 0.20),
        ("start", 3, 101.0, False, None),
        ("end", 3, 112.0, True, 0.15),
    )
    assert bench.time_to_reach(runs, 100.0, 0.153) == pytest.approx(12.0)
    assert bench.time_to_reach(runs, 100.0, 0.25) == pytest.approx(8.0)
    assert bench.time_to_reach(runs, 100.0, 0.05) is None
    assert bench.trial_seconds(runs) == pytest.approx(4.0 + 8.0 + 11.0)
    assert bench.trials_run(runs) == 3
    assert bench.trial_seconds_until(runs, 108.0) == pytest.approx(4.0 + 8.0 + 7.0)  # the spend until a time
    assert bench.trial_seconds_until(runs, None) is None


def test_ratios_and_medians_count_a_target_never_reached_as_infinitely_slow() -> None:
    assert bench.median([3.0, None, 1.0]) == 3.0
    assert bench.median([None, None, 1.0]) == math.inf
    assert bench.ratio(30.0, 10.0) == 3.0
    assert bench.ratio(None, 10.0) == math.inf
    assert math.isnan(bench.ratio(None, None))


def test_the_comparison_and_its_verdict() -> None:
    def run(best: float, end: float, started: float = 0.0) -> dict[str, object]:
        return {"best": best, "started": started, "ended": end,
                "ledger": ledger(("start", 1, started, False, None), ("end", 1, end, True, best))}  # fmt: skip

    rows = bench.compare([run(0.10, 5.0), run(0.12, 6.0)], [run(0.101, 30.0), run(0.121, 40.0)])
    assert rows[bench.WALL_EITHER] == (5.5, 35.0)
    assert rows[bench.BEST] == (pytest.approx(0.11), pytest.approx(0.111))
    assert rows[bench.SPENT] == rows[bench.SPENT_EITHER] == (5.5, 35.0)
    assert rows["seeds reaching the 1st"] == ("2/2", "2/2")
    assert "goal MET" in bench.verdict(rows)
    assert "goal MISSED" in bench.verdict(bench.compare([run(0.10, 20.0)], [run(0.10, 30.0)]))  # 1.5x only
    never = bench.compare([run(0.10, 5.0)], [run(0.20, 9.0)])  # the anchor never within 2 % of our best
    assert never[bench.WALL_EITHER] == (5.0, math.inf) and never["seeds reaching the 1st"] == ("1/1", "0/1")


def test_the_trainer_falls_with_its_epochs_resumes_from_a_checkpoint_and_keeps_a_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = {"lr": 1e-3, "batch_size": 16, "depth": 5}, {"lr": 1e-1, "batch_size": 64, "depth": 2}
    assert trainer.loss_at(good, 27, 27, 0) < trainer.loss_at(good, 3, 27, 0) < trainer.loss_at(good, 1, 27, 0)
    assert trainer.loss_at(good, 27, 27, 0) < trainer.loss_at(bad, 27, 27, 0)
    monkeypatch.setenv("BENCH_LEDGER", str(tmp_path / "ledger.jsonl"))
    config = tmp_path / "spec.json"
    train = {**good, "num_epochs": 9, "resume_training_checkpoint_path": str(tmp_path / "epoch_3.pth")}
    config.write_text(json.dumps({"train": train}))
    assert trainer.main(["--config", str(config), "--epoch-seconds", "0", "--checkpoint-dir", str(tmp_path)]) == 0
    steps = [json.loads(line.split(" ", 1)[1])["step"] for line in capsys.readouterr().out.splitlines()
             if line.startswith("TAO_METRIC")]  # fmt: skip
    assert steps == list(range(4, 10))  # epochs 4..9 of the same 27-epoch curve
    records = bench.read_ledger(tmp_path / "ledger.jsonl")
    assert [r["event"] for r in records] == ["start", "end"]
    assert records[1]["complete"] and records[1]["value"] == pytest.approx(trainer.loss_at(good, 9, 27, 0))
    assert (tmp_path / "epoch_9.pth").exists()


def test_the_anchor_gets_the_same_search_space_in_its_schema_form() -> None:
    assert schema_property(bench.SPACE["train.batch_size"])["enum"] == [8, 16, 32, 64]
    depth = schema_property(bench.SPACE["train.depth"])
    assert (depth["type"], depth["minimum"], depth["maximum"], depth["automl_enabled"]) == ("integer", 2, 8, True)
