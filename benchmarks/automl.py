"""AutoML side by side in one run: ``TAOAutoMLOperator`` (Optuna TPE + ASHA, 4 trials at once, ``local``) against
``nvidia-tao-automl`` 7.2.0's ``AutoMLRunner`` (bayesian, hyperband), same trainer, search space and trial budget::

    PYTHONPATH=. nice -n 10 python benchmarks/automl.py [--seeds 5] [--trials 12]   # ~16 min on 2 loaded CPUs

The trainer is ``benchmarks/automl_trainer.py`` (27 epochs of 0.3 s; its loss depends on its parameters and falls
with its epochs). The anchor runs in its own venv (``--anchor-python``, default ``/tmp/anchor-venv/bin/python``)
through ``benchmarks/automl_anchor_driver.py``; the provider's side runs here, the real operator executing on this
worker (``deferrable=False``: the same decisions, no triggerer to stand in for). Both poll every ``--poll`` seconds
(the anchor's default is 30 s; ours is the operator's ``poll_interval``).

Per seed, ours against each anchor configuration: wall-clock from the search's start until a trial ran to its end
with a value within 2 % of the best value either side found for that seed (and, a finite ratio when the anchor never
gets there, within 2 % of the anchor's own best); trial-seconds (the sum of every trial process's life, the
GPU-hours proxy); trials run (processes started, rung jobs included); the search's own best value. Goal (issue 33):
at least 3x less wall-clock, at most half the trial-seconds, an equal or better median best value.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TRAINER = REPO / "benchmarks" / "automl_trainer.py"
DRIVER = REPO / "benchmarks" / "automl_anchor_driver.py"
SPACE = {
    "train.lr": {"type": "float", "low": 1e-5, "high": 1e-1, "log": True},
    "train.batch_size": {"type": "categorical", "choices": [8, 16, 32, 64]},
    "train.depth": {"type": "int", "low": 2, "high": 8},
}
OURS = "TAOAutoMLOperator tpe+asha x4"
TOLERANCE = 0.02


# ------------------------------------------------------------ the pure parts (tests/unit/test_benchmark_automl.py)


def target(bests: list[float], tolerance: float = TOLERANCE) -> float:
    """The value to reach: within ``tolerance`` of the best (lowest) value any side found."""
    best = min(bests)
    return best + abs(best) * tolerance


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """The trainer processes' start and end records."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def time_to_reach(ledger: list[dict[str, Any]], started: float, goal: float) -> float | None:
    """Seconds from ``started`` until a trial ran to its end with a value at or below ``goal``; None if none did."""
    ends = [r["t"] for r in ledger if r["event"] == "end" and r["complete"] and r["value"] is not None
            and r["value"] <= goal]  # fmt: skip
    return min(ends) - started if ends else None


def trial_seconds(ledger: list[dict[str, Any]]) -> float:
    """The sum of every trial process's life, start record to end record (a process with no end: not counted)."""
    starts = {r["pid"]: r["t"] for r in ledger if r["event"] == "start"}
    return sum(r["t"] - starts[r["pid"]] for r in ledger if r["event"] == "end" and r["pid"] in starts)


def trial_seconds_until(ledger: list[dict[str, Any]], until: float | None) -> float | None:
    """The trial-seconds spent up to the moment ``until`` (an absolute time); None when it never came."""
    if until is None:
        return None
    starts = {r["pid"]: r["t"] for r in ledger if r["event"] == "start"}
    return sum(min(r["t"], until) - starts[r["pid"]] for r in ledger
               if r["event"] == "end" and r["pid"] in starts and starts[r["pid"]] < until)  # fmt: skip


def trials_run(ledger: list[dict[str, Any]]) -> int:
    return sum(1 for r in ledger if r["event"] == "start")


def ratio(anchor: float | None, ours: float | None) -> float:
    """anchor / ours (how many times better we are for a cost); inf when only the anchor never got there."""
    if anchor is None:
        return math.inf if ours is not None else math.nan
    return anchor / ours if ours else math.nan


def median(values: list[float | None]) -> float | None:
    """The median, a run that never reached the target counting as infinitely slow."""
    finite = [math.inf if v is None else v for v in values]
    return statistics.median(finite) if finite else None


# ------------------------------------------------------------------ the two sides


def run_ours(seed: int, args: argparse.Namespace, where: Path) -> dict[str, Any]:
    """The real operator on ``local``, executing on this worker."""
    import structlog

    from airflow_provider_tao.operators.automl import TAOAutoMLOperator
    from tests.integration.taskrun import FileStore
    from tests.unit.fakes import make_context

    # the trial-by-trial log lines of the operator and the hook: the table is what this prints
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    ledger = where / "ledger.jsonl"
    os.environ["AIRFLOW__TAO__LOCAL_JOBS_DIR"] = str(where / "jobs")
    os.environ["AIRFLOW__TAO__LOCAL_RESULTS_ROOT"] = str(where / "results")
    op = TAOAutoMLOperator(
        task_id="tune", platform="local", gpu_count=0, deferrable=False, poll_interval=args.poll,
        command=f"{sys.executable} {TRAINER} --config {{config_path}} --seed {seed} "
        f"--epoch-seconds {args.epoch_seconds} --horizon {args.epochs}",
        config_format="json", env={"BENCH_LEDGER": str(ledger)},
        specs={"train": {"lr": 1e-3, "batch_size": 16, "depth": 5, "num_epochs": args.epochs}},
        search_space=SPACE, metric="val_loss", direction="minimize", algorithm="tpe", pruner="asha",
        max_trials=args.trials, max_concurrent_trials=4, seed=seed,
    )  # fmt: skip
    started = time.time()
    result = op.execute(make_context(FileStore(where / "store.json"), 1, f"manual__bench_{seed}"))  # type: ignore[arg-type]
    return {"started": started, "ended": time.time(), "best": result["best"]["value"],
            "states": [t["state"] for t in result["trials"]], "ledger": read_ledger(ledger)}  # fmt: skip


def run_anchor(algorithm: str, seed: int, args: argparse.Namespace, where: Path) -> dict[str, Any]:
    """``AutoMLRunner`` in the anchor's venv, through the driver."""
    ledger = where / "ledger.jsonl"
    job = {
        "algorithm": algorithm.removesuffix("-full"), "seed": seed, "epoch_seconds": args.epoch_seconds,
        "epochs": args.epochs, "trials": None if algorithm.endswith("-full") else args.trials,
        "poll_interval": args.poll, "workdir": str(where), "python": sys.executable, "ledger": str(ledger),
        "trainer": str(TRAINER), "space": SPACE,
    }  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": str(seed)}  # the anchor seeds its brains from hash(context id)
    done = subprocess.run([args.anchor_python, str(DRIVER), json.dumps(job)], env=env, cwd=where,
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"the anchor's {algorithm} search failed:\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return {**out, "ledger": read_ledger(ledger)}


# ------------------------------------------------------------------ the table


def compare(ours: list[dict[str, Any]], anchor: list[dict[str, Any]]) -> dict[str, tuple[Any, Any]]:
    """Ours against one anchor configuration, medians over seeds: ``{row: (ours, anchor)}``. A seed's target is
    within 2 % of the best value either side found for it; a second, within 2 % of the anchor's own best, gives a
    finite ratio when the anchor never reaches the first."""
    rows: dict[str, tuple[list[Any], list[Any]]] = {}

    def add(row: str, a: Any, b: Any) -> None:
        rows.setdefault(row, ([], []))[0].append(a)
        rows[row][1].append(b)

    for mine, theirs in zip(ours, anchor, strict=True):
        either, their_best = target([mine["best"], theirs["best"]]), target([theirs["best"]])
        walls = [time_to_reach(r["ledger"], r["started"], either) for r in (mine, theirs)]
        add(WALL_EITHER, *walls)
        add(SPENT_EITHER, *(trial_seconds_until(r["ledger"], None if w is None else r["started"] + w)
                            for r, w in zip((mine, theirs), walls, strict=True)))  # fmt: skip
        add(WALL_ANCHOR, *(time_to_reach(r["ledger"], r["started"], their_best) for r in (mine, theirs)))
        add(SPENT, trial_seconds(mine["ledger"]), trial_seconds(theirs["ledger"]))
        add("trials run", trials_run(mine["ledger"]), trials_run(theirs["ledger"]))
        add(BEST, mine["best"], theirs["best"])
        add("search wall, s", mine["ended"] - mine["started"], theirs["ended"] - theirs["started"])
    out: dict[str, tuple[Any, Any]] = {row: (median(a), median(b)) for row, (a, b) in rows.items()}
    reached = [sum(v is not None for v in side) for side in rows[WALL_EITHER]]
    out["seeds reaching the 1st"] = (f"{reached[0]}/{len(ours)}", f"{reached[1]}/{len(ours)}")
    return out


WALL_EITHER = "wall to 2% of best either found, s"
WALL_ANCHOR = "wall to 2% of the anchor's best, s"
SPENT = "trial-seconds"
SPENT_EITHER = "trial-seconds to 2% of best either"
BEST = "best value"


def verdict(rows: dict[str, tuple[Any, Any]]) -> str:
    """The goal: >= 3x less wall-clock, <= half the trial-seconds, an equal or better median best value."""
    wall, spent = ratio(rows[WALL_EITHER][1], rows[WALL_EITHER][0]), ratio(rows[SPENT][1], rows[SPENT][0])
    best = rows[BEST][0] <= rows[BEST][1]
    met = wall >= 3 and spent >= 2 and best
    return (
        f"wall-clock {wall:.2f}x less (goal >= 3), trial-seconds {spent:.2f}x less (goal >= 2), median best "
        f"{rows[BEST][0]:.4f} vs {rows[BEST][1]:.4f}: goal {'MET' if met else 'MISSED'}"
    )


def table(name: str, rows: dict[str, tuple[Any, Any]]) -> str:
    def cell(value: Any) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = [f"{'vs ' + name:<40}{'ours':>10}{'anchor':>10}{'anchor/ours':>13}"]
    for row, (mine, theirs) in rows.items():
        numeric = isinstance(mine, (int, float)) and isinstance(theirs, (int, float))
        lines.append(f"{row:<40}{cell(mine):>10}{cell(theirs):>10}{cell(ratio(theirs, mine)) if numeric else '':>13}")
    return "\n".join([*lines, verdict(rows)])


def report(runs: dict[str, list[dict[str, Any]]], header: str) -> str:
    """The header, then one table per anchor configuration against ours."""
    return "\n\n".join([header, *(table(name, compare(runs[OURS], runs[name])) for name in list(runs)[1:])])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--trials", type=int, default=12, help="the trial budget of every configuration")
    parser.add_argument("--epochs", type=int, default=27)
    parser.add_argument("--epoch-seconds", type=float, default=0.3)
    parser.add_argument("--poll", type=float, default=1.0, help="poll interval of both sides, s")
    parser.add_argument(
        "--algorithms", default="bayesian,hyperband",
        help="the anchor's algorithms; NAME-full runs NAME without the trial budget (its own full schedule)",
    )  # fmt: skip
    parser.add_argument("--anchor-python", default="/tmp/anchor-venv/bin/python")
    parser.add_argument("--json", help="also write every run's figures here")
    parser.add_argument("--from-json", help="print the tables of a run saved with --json, running nothing")
    args = parser.parse_args()
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        print(report(saved["runs"], saved["header"]))
        return 0
    names = [OURS] + [f"anchor {a}" for a in args.algorithms.split(",")]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="automl-bench-") as tmp:
        for seed in range(1, args.seeds + 1):
            for name in names:  # one configuration after the other, never two at once
                where = Path(tmp, f"{seed}-{name.split()[-1]}")
                where.mkdir()
                run = run_ours(seed, args, where) if name == OURS else run_anchor(name.split()[-1], seed, args, where)
                runs[name].append(run)
                print(f"seed {seed} {name}: best {run['best']:.4f}, {trials_run(run['ledger'])} trial(s), "
                      f"{run['ended'] - run['started']:.1f} s", file=sys.stderr, flush=True)  # fmt: skip
    load = os.getloadavg()
    header = (
        f"== {OURS} against nvidia-tao-automl 7.2.0 AutoMLRunner: {args.seeds} seed(s), {args.trials} trials each, "
        f"{args.epochs} epochs of {args.epoch_seconds} s, poll {args.poll} s on both sides; load average "
        f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end; medians over seeds"
    )
    print(report(runs, header))
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
