"""``python -m tests.explorer.table <report>``: the explored table of docs/reliability.md from a
``TAO_EXPLORE_REPORT`` file -- boundary x interruption, each cell the platforms that ran it and their violations."""

from __future__ import annotations

import json
import sys
from collections import defaultdict

from tests.explorer.simulate import INTERRUPTIONS


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
    head = "| job, boundary | " + " | ".join(INTERRUPTIONS) + " |"
    out = [head, "|---" * (len(INTERRUPTIONS) + 1) + "|"]
    for row in rows:
        marks = []
        for interruption in INTERRUPTIONS:
            cell = cells.get((row, interruption))
            if not cell:
                marks.append("=")  # equivalent to an explored schedule (pruned)
            else:
                marks.append(" ".join(p[0].upper() + ("" if n == 0 else f"!{n}") for p, n in sorted(cell.items())))
        out.append(f"| {row} | " + " | ".join(marks) + " |")
    out.append(f"\n{total} schedules, {bad} with violations")
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as report:
        print(render(report.read().splitlines()))
