"""The anchor side of ``benchmarks/automl.py``: ``nvidia-tao-automl`` 7.2.0's ``AutoMLRunner`` searching over
``benchmarks/automl_trainer.py``, run with the interpreter of the venv the anchor is installed in (never the
provider's)::

    /tmp/anchor-venv/bin/python benchmarks/automl_anchor_driver.py '{"algorithm": "bayesian", ...}'

The runner drives an object of the TAO SDK's job shape (``create_python_job``, ``get_job_status``,
``get_job_logs``, ``cancel_job``, ``get_job_results_dir``, ``get_checkpoints``: the calls ``AutoMLRunner`` makes)
whose jobs are local processes, as the SDK's own ``VirtualEnvSDK`` runs a ``python_script`` action. The skill
directory it needs (``references/skill_info.yaml``, ``schemas/train.schema.json``) is written from the search space
the benchmark passes. Prints one JSON line: the runner's best value, its trials, the search's start time.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml  # the anchor's own dependency


class LocalProcessSDK:
    """The SDK calls ``AutoMLRunner`` makes, over local processes of ``python <script> <args>``."""

    _workspace_id = "bench"

    def __init__(self, root: Path, python: str, env: dict[str, str]) -> None:
        self.root, self.python, self.env = root, python, env
        self.jobs: dict[str, subprocess.Popen[bytes]] = {}
        self.canceled: set[str] = set()
        self.ids = itertools.count(1)

    def create_python_job(
        self,
        *,
        script: str,
        specs: dict[str, Any],
        config_format: str,
        script_args: list[str],
        cwd: str | None = None,
        env_vars: dict[str, str] | None = None,
        **_: Any,
    ) -> Any:
        job_id = f"job-{next(self.ids):04d}"
        where = self.root / job_id
        where.mkdir(parents=True)
        config = where / "config.json"
        config.write_text(json.dumps(specs))
        args = [
            a.replace("{config_path}", str(config)).replace("{results_dir}", str(where / "results"))
            for a in script_args
        ]
        with open(where / "log.txt", "wb") as log:
            self.jobs[job_id] = subprocess.Popen(
                [self.python, script, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env={**os.environ, **self.env, **(env_vars or {})},
            )
        return SimpleNamespace(id=job_id, backend_job_id=str(self.jobs[job_id].pid))

    def create_job(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the benchmark's skill is a python_script action")

    def get_job_status(self, job_id: str) -> Any:
        code = self.jobs[job_id].poll()
        if code is None:
            return SimpleNamespace(status="Running")
        if job_id in self.canceled:
            return SimpleNamespace(status="Canceled")
        return SimpleNamespace(status="Complete" if code == 0 else "Error")

    def get_job_logs(self, job_id: str, tail: int | None = None) -> str:
        lines = (self.root / job_id / "log.txt").read_text().splitlines()
        return "\n".join(lines[-tail:] if tail else lines)

    def cancel_job(self, job_id: str) -> bool:
        self.canceled.add(job_id)
        self.jobs[job_id].terminate()
        self.jobs[job_id].wait(30)
        return True

    def get_job_results_dir(self, job_id: str) -> str:
        return str(self.root / job_id / "results")

    def get_checkpoints(self, job_id: str) -> list[str]:
        results = self.root / job_id / "results"
        return sorted(str(p) for p in results.glob("epoch_*.pth")) if results.is_dir() else []


def schema_property(spec: dict[str, Any]) -> dict[str, Any]:
    """The anchor's schema leaf for one of the benchmark's search-space entries (the operator's format)."""
    if spec["type"] == "categorical":
        return {"type": "ordered_int", "enum": spec["choices"], "default": spec["choices"][0], "automl_enabled": True}
    kind = "number" if spec["type"] == "float" else "integer"
    # no log scale in the anchor's schema: it samples a float range linearly (docs/benchmarks.md says so)
    return {
        "type": kind,
        "minimum": spec["low"],
        "maximum": spec["high"],
        "default": spec["low"],
        "automl_enabled": True,
    }


def write_skill(skill: Path, job: dict[str, Any]) -> None:
    """``references/skill_info.yaml`` and ``schemas/train.schema.json`` for the trainer as a python_script action."""
    (skill / "references").mkdir(parents=True)
    (skill / "schemas").mkdir()
    args = [
        "--config",
        "{config_path}",
        "--checkpoint-dir",
        "{results_dir}",
        "--seed",
        str(job["seed"]),
        "--epoch-seconds",
        str(job["epoch_seconds"]),
        "--horizon",
        str(job["epochs"]),
    ]
    info = {
        "network_arch": "bench_trainer",
        "actions": {
            "train": {
                "execution": {"type": "python_script", "script": job["trainer"], "args": args, "config_format": "json"}
            }
        },
    }
    (skill / "references/skill_info.yaml").write_text(yaml.safe_dump(info))
    leaves = {key.split(".", 1)[1]: schema_property(spec) for key, spec in job["space"].items()}
    leaves["num_epochs"] = {"type": "integer", "minimum": 1, "maximum": job["epochs"], "default": job["epochs"]}
    leaves["resume_training_checkpoint_path"] = {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
    defaults = {key: leaf["default"] for key, leaf in leaves.items()}
    schema = {
        "type": "object",
        "properties": {"train": {"type": "object", "properties": leaves}},
        "default": {"train": defaults},
    }
    (skill / "schemas/train.schema.json").write_text(json.dumps(schema))


def main() -> int:
    job = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    random.seed(job["seed"])  # the brains seed numpy from hash(context id): PYTHONHASHSEED (set by the caller)
    import tao_automl.runner as anchor  # after the logging setup

    root = Path(job["workdir"])
    write_skill(root / "skill", job)
    sdk = LocalProcessSDK(root / "jobs", job["python"], {"BENCH_LEDGER": job["ledger"]})
    runner = anchor.AutoMLRunner(sdk, str(root / "skill"), action="train", poll_interval=job["poll_interval"])
    settings = {
        "algorithm": job["algorithm"],
        "metric": "val_loss",
        "direction": "minimize",
        "automl_max_epochs": job["epochs"],
        "automl_delete_intermediate_ckpt": False,
    }
    if job["trials"] is not None:  # None: the algorithm's own full schedule
        settings["automl_max_recommendations"] = job["trials"]
    started = time.time()
    result = runner.run(workspace_path=str(root / "workspace"), automl_settings=settings)
    history = result["history"]
    print(
        json.dumps(
            {
                "started": started,
                "ended": time.time(),
                "best": result["best"]["metric_value"],
                "best_params": result["best"]["specs"],
                "trials": len(history),
                "states": [h["status"] for h in history],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
