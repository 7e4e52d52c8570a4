"""The trainer both arms of ``benchmarks/automl.py`` search over (issue 33).

A stand-in for a training run: its validation loss depends on its parameters and falls with its epochs, so a
search has something to find and early stopping has something to save. Deterministic given params and seed.

Parameters come from ``TAO_TRIAL_PARAMS`` (JSON, as ``TAOAutoMLOperator`` passes them) or from ``--param
key=value`` arguments (as the anchor's job driver passes them). Each epoch sleeps ``--epoch-seconds`` and prints
``epoch N val_loss=X`` plus ``TAO_METRIC {"step": N, "val_loss": X}`` so both searches read the same numbers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time


def final_loss(params: dict[str, float]) -> float:
    """The loss a full run reaches: a bowl around lr=1e-3, batch 16, depth 5 (log-scaled lr)."""
    lr = float(params.get("lr", 1e-3))
    batch = float(params.get("batch_size", 16))
    depth = float(params.get("depth", 5))
    return 0.1 + 0.08 * (math.log10(lr) + 3.0) ** 2 + 0.02 * (math.log2(batch) - 4.0) ** 2 + 0.01 * (depth - 5.0) ** 2


def loss_at(params: dict[str, float], epoch: int, epochs: int, seed: int) -> float:
    """The loss after ``epoch`` of ``epochs``: decays from 1.0 + final towards final, with seeded noise."""
    final = final_loss(params)
    key = json.dumps(params, sort_keys=True) + f"/{seed}/{epoch}"
    noise = (int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF - 0.5) * 0.004
    return final + math.exp(-4.0 * epoch / epochs) + noise


def main(argv: list[str] | None = None) -> int:
    """Run the epochs, printing one metric line each."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=27)
    parser.add_argument("--epoch-seconds", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--param", action="append", default=[], help="key=value (the anchor's way)")
    args = parser.parse_args(argv)
    params: dict[str, float] = json.loads(os.environ.get("TAO_TRIAL_PARAMS") or "{}")
    for item in args.param:
        key, _, value = item.partition("=")
        params[key.rsplit(".", 1)[-1]] = float(value)
    for epoch in range(1, args.epochs + 1):
        time.sleep(args.epoch_seconds)
        loss = loss_at(params, epoch, args.epochs, args.seed)
        print(f"epoch {epoch} val_loss={loss:.6f}", flush=True)
        print("TAO_METRIC " + json.dumps({"step": epoch, "val_loss": round(loss, 6)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
