"""The trainer both arms of ``benchmarks/automl.py`` search over (issue 33).

A stand-in for a training run: its validation loss depends on its parameters and falls with its epochs, so a
search has something to find and early stopping has something to save. Deterministic given params and seed.

Parameters come from ``--config`` (a JSON spec whose ``train`` block holds ``lr``, ``batch_size``, ``depth``,
``num_epochs`` and, for a resumed rung job of the anchor's Hyperband, ``resume_training_checkpoint_path``), from
``TAO_TRIAL_PARAMS`` (JSON) or from ``--param key=value``. The loss follows one fixed schedule of ``--horizon``
epochs whatever a job's ``num_epochs``: a 3-epoch rung job reports the loss of epoch 3 of the full run, and a job
resumed from ``epoch_3.pth`` runs epochs 4.. only. Each epoch sleeps ``--epoch-seconds`` and prints
``epoch N val_loss=X`` plus ``TAO_METRIC {"step": N, "val_loss": X}`` so both searches read the same numbers.

With ``BENCH_LEDGER`` set, the process appends its start and its end (natural, or a SIGTERM: canceled) to that
file as JSON lines -- the benchmark's trial-seconds and "when was this value found" come from there, the same way
for both searches.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any


def final_loss(params: dict[str, float]) -> float:
    """The loss a full run reaches: a bowl around lr=1e-3, batch 16, depth 5 (log-scaled lr)."""
    lr = float(params.get("lr", 1e-3))
    batch = float(params.get("batch_size", 16))
    depth = float(params.get("depth", 5))
    return 0.1 + 0.08 * (math.log10(lr) + 3.0) ** 2 + 0.02 * (math.log2(batch) - 4.0) ** 2 + 0.01 * (depth - 5.0) ** 2


def loss_at(params: dict[str, float], epoch: int, epochs: int, seed: int) -> float:
    """The loss after ``epoch`` of a ``epochs``-long schedule: decays from 1.0 + final towards final, seeded noise."""
    final = final_loss(params)
    key = json.dumps({k: float(v) for k, v in params.items()}, sort_keys=True) + f"/{seed}/{epoch}"
    noise = (int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF - 0.5) * 0.004
    return final + math.exp(-4.0 * epoch / epochs) + noise


def _from_config(path: str) -> tuple[dict[str, float], int | None, int]:
    """The params, epoch count and first epoch a JSON spec asks for."""
    train: dict[str, Any] = json.loads(Path(path).read_text()).get("train", {})
    params = {k: float(train[k]) for k in ("lr", "batch_size", "depth") if k in train}
    epochs = int(train["num_epochs"]) if train.get("num_epochs") else None
    resume = str(train.get("resume_training_checkpoint_path") or "")
    match = re.search(r"epoch_(\d+)", Path(resume).name)
    return params, epochs, int(match.group(1)) + 1 if match else 1


def _ledger(record: dict[str, Any]) -> None:
    if path := os.environ.get("BENCH_LEDGER"):
        with open(path, "a") as out:  # one short line per write: appends from several processes stay whole
            out.write(json.dumps({"pid": os.getpid(), "t": time.time(), **record}) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Run the epochs, printing one metric line each."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", help="a JSON spec (train.lr, train.num_epochs, ...)")
    parser.add_argument("--epochs", type=int, default=27)
    parser.add_argument("--horizon", type=int, default=27, help="the full schedule the loss curve follows")
    parser.add_argument("--epoch-seconds", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-dir", help="write epoch_N.pth here after each epoch (the anchor resumes)")
    parser.add_argument("--param", action="append", default=[], help="key=value")
    args = parser.parse_args(argv)
    params: dict[str, float] = json.loads(os.environ.get("TAO_TRIAL_PARAMS") or "{}")
    params = {key.rsplit(".", 1)[-1]: float(value) for key, value in params.items()}
    epochs, first = args.epochs, 1
    if args.config:
        from_config, config_epochs, first = _from_config(args.config)
        params.update(from_config)
        epochs = config_epochs or epochs
    for item in args.param:
        key, _, value = item.partition("=")
        params[key.rsplit(".", 1)[-1]] = float(value)
    state: dict[str, Any] = {"epoch": first - 1, "value": None}

    def canceled(signum: int, frame: Any) -> None:
        _ledger({"event": "end", "complete": False, "epoch": state["epoch"], "value": state["value"]})
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, canceled)
    _ledger({"event": "start", "first_epoch": first, "epochs": epochs, "params": params})
    for epoch in range(first, epochs + 1):
        time.sleep(args.epoch_seconds)
        loss = loss_at(params, epoch, args.horizon, args.seed)
        state.update(epoch=epoch, value=loss)
        print(f"epoch {epoch} val_loss={loss:.6f}", flush=True)
        print("TAO_METRIC " + json.dumps({"step": epoch, "val_loss": round(loss, 6)}), flush=True)
        if args.checkpoint_dir:
            Path(args.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            Path(args.checkpoint_dir, f"epoch_{epoch}.pth").write_text(json.dumps({"epoch": epoch}))
    _ledger({"event": "end", "complete": True, "epoch": state["epoch"], "value": state["value"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
