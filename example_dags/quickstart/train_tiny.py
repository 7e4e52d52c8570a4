"""A tiny training program for the quickstart: fits y = w*x + b by gradient descent, in pure Python.

Reads ``$TRAIN_CSV`` (x,y rows), trains for a few seconds, and writes into ``$TAO_RESULTS_ROOT/$TAO_JOB_ID``:
``checkpoints/epoch_<N>.json`` after every epoch, ``model.json`` (the final weights) and ``metrics.json``.
"""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path

EPOCHS = int(os.environ.get("EPOCHS", "8"))
LEARNING_RATE = float(os.environ.get("LEARNING_RATE", "0.05"))
EPOCH_SECONDS = float(os.environ.get("EPOCH_SECONDS", "0.5"))


def main() -> None:
    with open(os.environ["TRAIN_CSV"]) as data:
        rows = [(float(x), float(y)) for x, y in csv.reader(data)]
    out = Path(os.environ["TAO_RESULTS_ROOT"]) / os.environ["TAO_JOB_ID"]
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    w = b = 0.0
    loss = float("inf")
    for epoch in range(1, EPOCHS + 1):
        for x, y in rows:
            error = (w * x + b) - y
            w -= LEARNING_RATE * error * x
            b -= LEARNING_RATE * error
        loss = sum(((w * x + b) - y) ** 2 for x, y in rows) / len(rows)
        (out / "checkpoints" / f"epoch_{epoch}.json").write_text(json.dumps({"epoch": epoch, "w": w, "b": b}))
        print(f"Epoch {epoch}/{EPOCHS} loss={loss:.5f} w={w:.4f} b={b:.4f}", flush=True)
        time.sleep(EPOCH_SECONDS)  # a real model trains much longer; the quickstart just has to be watchable
    (out / "model.json").write_text(json.dumps({"w": w, "b": b}))
    (out / "metrics.json").write_text(json.dumps({"train_mse": loss, "epochs": EPOCHS, "samples": len(rows)}))
    print(f"saved model to {out / 'model.json'}", flush=True)


if __name__ == "__main__":
    main()
