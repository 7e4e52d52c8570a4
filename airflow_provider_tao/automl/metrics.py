"""A trial's live metrics, read from its log lines (the lines the trigger reads anyway: no extra platform call).

Recognised, in this order of precedence on one line:

1. ``TAO_METRIC {"step": 3, "val_loss": 0.41}`` -- JSON; ``step`` (or ``epoch``) says when, every other number is a
   metric;
2. TAO's ``status.json`` lines (``{"epoch": 3, "kpi": {"val_loss": 0.41}, ...}``, as the in-job runner prints them);
3. free forms on a line that says ``epoch N``, ``Epoch N/M`` or ``step N``: ``val_loss=0.41``, ``val_loss: 0.41``,
   ``val_loss 0.41``; and Keras's ``... - val_loss: 0.41`` on the line after its ``Epoch N/M`` line.

At the end of a trial, its results folder's ``metrics.json`` (the operator's ``metrics_file``) wins for the final value
when it has the metric; otherwise the value at the last reported step is the trial's value.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

METRIC_PREFIX = "TAO_METRIC "
#: The line forms a search recognises, for the message of a trial that reported no metric.
RECOGNISED_FORMS = (
    'TAO_METRIC {"step": 3, "<metric>": 0.41}',
    "epoch 3 ... <metric>=0.41",
    "Epoch 3/10 ... <metric>: 0.41",
    "step 3 ... <metric> 0.41",
    "Keras: 'Epoch 3/10' then '... - <metric>: 0.41'",
    '{"epoch": 3, "kpi": {"<metric>": 0.41}} (TAO status.json)',
    "<results>/metrics.json at the end",
)
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_STEP = re.compile(r"\b(?:epoch|step|iter(?:ation)?)\b\s*[:=#]?\s*\[?\s*(\d+)(?:\s*/\s*\d+)?", re.IGNORECASE)
_KERAS_EPOCH = re.compile(r"^\s*Epoch\s+(\d+)\s*/\s*\d+\s*$")
#: Longest unfinished line kept between two reads (a progress bar without newlines must not grow the state).
MAX_PARTIAL = 4096


@dataclass
class MetricReport:
    """What one line said: the step and each named metric's value."""

    step: int
    values: dict[str, float]


@dataclass
class MetricParser:
    """Reads a trial's log text as it comes, chunk by chunk; its state round-trips through JSON (:meth:`to_json`)
    so a resumed worker or a restarted triggerer goes on where the last one stopped.

    :param names: the metrics the search wants (others are ignored).
    """

    names: tuple[str, ...]
    partial: str = ""
    keras_epoch: int | None = None
    _patterns: dict[str, re.Pattern[str]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.names = tuple(self.names)
        self._patterns = {
            # the name as a word (val_loss, not my_val_loss nor val_loss_ema), then = or : or a space, then a number
            name: re.compile(rf"(?<![\w/.]){re.escape(name)}(?![\w/])\s*[:=]?\s*({_NUMBER})")
            for name in self.names
        }

    def to_json(self) -> dict[str, Any]:
        return {"partial": self.partial, "keras_epoch": self.keras_epoch}

    @classmethod
    def from_json(cls, names: Iterable[str], data: Any) -> MetricParser:
        data = data if isinstance(data, dict) else {}
        epoch = data.get("keras_epoch")
        return cls(tuple(names), str(data.get("partial") or ""), epoch if isinstance(epoch, int) else None)

    def feed(self, text: str, final: bool = False) -> list[MetricReport]:
        """The reports in ``text`` (whole lines; an unfinished last line waits for the next chunk unless ``final``)."""
        text = self.partial + text
        lines = text.split("\n")
        self.partial = "" if final else lines.pop()[-MAX_PARTIAL:]
        reports = []
        for line in lines:
            if (report := self.line(line.rstrip("\r"))) is not None:
                reports.append(report)
        return reports

    def line(self, line: str) -> MetricReport | None:
        """The report of one line, if it has one of the wanted metrics at a step."""
        if (at := line.find(METRIC_PREFIX)) >= 0:
            return self._from_json(line[at + len(METRIC_PREFIX) :], kpi=False)
        if '"kpi"' in line and (brace := line.find("{")) >= 0:
            return self._from_json(line[brace:], kpi=True)
        if (keras := _KERAS_EPOCH.match(line)) is not None:
            self.keras_epoch = int(keras.group(1))
            return None
        step_match = _STEP.search(line)
        if step_match is not None:
            step = int(step_match.group(1))
            rest = line[: step_match.start()] + " " + line[step_match.end() :]
        elif self.keras_epoch is not None and " - " in line:
            step, rest = self.keras_epoch, line
        else:
            return None
        values = {}
        for name, pattern in self._patterns.items():
            found = pattern.findall(rest)
            if found and (value := _finite(found[-1])) is not None:
                values[name] = value
        return MetricReport(step, values) if values else None

    def _from_json(self, text: str, *, kpi: bool) -> MetricReport | None:
        try:
            data = json.loads(text.strip())
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        step = data.get("step", data.get("epoch", data.get("cur_iter")))
        if isinstance(step, float) and step.is_integer():
            step = int(step)
        if not isinstance(step, int) or isinstance(step, bool):
            return None
        source = data.get("kpi") if kpi else data
        if not isinstance(source, dict):
            return None
        values = {n: v for n in self.names if (v := _finite(source.get(n))) is not None}
        return MetricReport(step, values) if values else None


def _finite(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def final_values(metrics_file: Any, names: Iterable[str]) -> dict[str, float]:
    """The wanted metrics a trial's ``metrics.json`` holds (top level, or under ``kpi``)."""
    if not isinstance(metrics_file, dict):
        return {}
    kpi = metrics_file.get("kpi")
    pools: list[dict[str, Any]] = [metrics_file, kpi if isinstance(kpi, dict) else {}]
    found: dict[str, float] = {}
    for name in names:
        for pool in pools:
            if (value := _finite(pool.get(name))) is not None:
                found[name] = value
                break
    return found
