"""The explored table of docs/reliability.md (:mod:`tests.explorer.table`) tells every platform apart."""

from __future__ import annotations

import json

from tests.explorer.table import render

SIX = ("local", "docker", "kubernetes", "slurm", "lepton", "brev")


def test_a_six_platform_table_marks_each_platform_apart() -> None:
    """local and lepton share a first letter: each cell still names both, and a violation is its platform's."""
    lines = [json.dumps([p, "ok", "execute:create_job#1", "clear", ["I2: x"] if p == "lepton" else []]) for p in SIX]
    table = render(lines)
    row = next(line for line in table.splitlines() if "execute:create_job#1" in line)
    clear = row.split(" | ")[3]
    assert sorted(clear.split()) == ["Br", "Do", "Ku", "Le!1", "Lo", "Sl"], row
    assert "Le lepton" in table and "Lo local" in table and "6 schedules, 1 with violations" in table
