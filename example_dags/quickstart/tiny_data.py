"""The quickstart's synthetic data: y = 3x + 2 with a little noise, shared by the example DAGs."""

from __future__ import annotations

import os
import random
from pathlib import Path

TRUE_W, TRUE_B = 3.0, 2.0
TRAIN_SCRIPT = Path(__file__).parent / "train_tiny.py"


def samples(count: int, seed: int) -> list[tuple[float, float]]:
    """``count`` (x, y) pairs; the same seed gives the same pairs."""
    rng = random.Random(seed)
    return [(x, TRUE_W * x + TRUE_B + rng.gauss(0, 0.05)) for x in (rng.uniform(-1, 1) for _ in range(count))]


def write_training_set(run_id: str | None) -> str:
    """Write a run's training set under ``$AIRFLOW_HOME/tao/quickstart-data`` and return its path."""
    folder = Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "tao" / "quickstart-data"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"train-{abs(hash(run_id)) % 10**8}.csv"
    path.write_text("".join(f"{x},{y}\n" for x, y in samples(200, seed=1)))
    return str(path)


def held_out_mse(model: dict[str, float]) -> float:
    """Mean squared error of ``{"w", "b"}`` on 50 held-out samples."""
    held_out = samples(50, seed=2)
    return sum(((model["w"] * x + model["b"]) - y) ** 2 for x, y in held_out) / len(held_out)
