"""``python -m tests.explorer.table <report>``: the explored table of docs/reliability.md from a
``TAO_EXPLORE_REPORT`` file -- boundary x interruption, each cell the platforms that ran it and their violations."""

from __future__ import annotations

import json
import sys
from collections import defaultdict

from tests.explorer.simulate import INTERRUPTIONS

#: Each platform's mark in a cell: two letters, as first letters collide (local and lepton); an unknown platform is
#: marked by its full name.
MARKS = {"local": "Lo", "docker": "Do", "kubernetes": "Ku", "slurm": "Sl", "lepton": "Le", "brev": "Br"}


def mark(platform: str) -> str:
    return MARKS.get(platform, platform)


def render(lines: list[str]) -> str:
    cells: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    rows: list[str] = []
    total = bad = 0
    for line in lines:
        platform, job, boundary, interruption, found = json.loads(line)
        row = f"{job} `{boundary}`"
        if row not in rows:
            rows.append(row)
        cell = cells[row, interruption]
        cell[platform] = cell.get(platform, 0) + len(found)
        total += 1
        bad += bool(found)
    # the lifecycle's order: by job, then phase; within a phase as the schedules were reported (about their order)
    jobs = list(dict.fromkeys(row.split(" ", 1)[0] for row in rows))
    phase = {"execute": 0, "trigger": 1, "resume": 2}
    rows.sort(key=lambda r: (jobs.index(r.split(" ", 1)[0]), phase.get(r.split("`")[1].split(":")[0], 3)))
    head = "| job, boundary | " + " | ".join(INTERRUPTIONS) + " |"
    out = [head, "|---" * (len(INTERRUPTIONS) + 1) + "|"]
    for row in rows:
        marks = []
        for interruption in INTERRUPTIONS:
            cell = cells.get((row, interruption))
            if not cell:
                marks.append("=")  # equivalent to an explored schedule (pruned)
            else:
                marks.append(" ".join(mark(p) + ("" if n == 0 else f"!{n}") for p, n in sorted(cell.items())))
        out.append(f"| {row} | " + " | ".join(marks) + " |")
    ran = sorted({p for cell in cells.values() for p in cell})
    out.append("\n" + ", ".join(f"{mark(p)} {p}" for p in ran) + "; `=` equivalent to an explored schedule (pruned)")
    out.append(f"\n{total} schedules, {bad} with violations")
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as report:
        print(render(report.read().splitlines()))
