"""A tiny trainer to tune (stdlib only, CPU): its validation loss depends on its learning rate, width and
dropout, falls with its epochs, and is printed once per epoch in a form the search reads (``Epoch N/M - val_loss:``).
It reads its parameters from the spec file the search writes (``{config_path}``, JSON) and writes its model and
``metrics.json`` into its results folder."""

from __future__ import annotations

import json
import math
import os
import sys
import time

with open(sys.argv[1]) as spec_file:
    spec = json.load(spec_file)
lr, width, dropout = spec["train"]["lr"], spec["model"]["width"], spec["model"]["dropout"]
epochs, pause = int(spec["train"]["epochs"]), float(spec["train"]["epoch_seconds"])
best_lr, best_width = 3e-3, 64
floor = (math.log10(lr / best_lr)) ** 2 * 0.5 + abs(math.log2(width / best_width)) * 0.08 + (dropout - 0.1) ** 2
for epoch in range(1, epochs + 1):
    time.sleep(pause)
    val_loss = floor + 1.5 / epoch
    print(f"Epoch {epoch}/{epochs} - loss: {val_loss * 0.9:.4f} - val_loss: {val_loss:.4f}", flush=True)
results = os.path.join(os.environ["TAO_RESULTS_ROOT"], os.environ["TAO_JOB_ID"])
os.makedirs(results, exist_ok=True)
with open(os.path.join(results, "model.json"), "w") as out:
    json.dump({"lr": lr, "width": width, "dropout": dropout}, out)
with open(os.path.join(results, "metrics.json"), "w") as out:
    json.dump({"val_loss": val_loss}, out)
