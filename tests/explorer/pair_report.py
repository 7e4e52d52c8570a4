"""The pair product's account over every sitting that ran it (``TAO_EXPLORE_PAIR_REPORT`` files, appended to by
resumed runs): per platform, its product's size, the pairs run, those whose last run passed, and the reproducer of
each pair whose last run found a violation::

    python -m tests.explorer.pair_report build/explore-pairs/pairs-*.jsonl

Exit code 0 only if every product was explored whole with no violation left. A report may be gzipped: the sittings
kept in the repository (``tests/explorer/sittings/``, as a session ends; ``explore-pairs.sh`` resumes from them).
"""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Account:
    """One platform's pairs as its report files tell them.

    :param product: the product's size as the last sitting counted it (0: no sitting listed it whole).
    :param whole: whether a sitting explored the whole product to its end (its pairs run, or passed before).
    :param last: each pair's key -> its last run's (row number, violations, reproducer).
    :param seconds: the pairs' own run time, summed over every run.
    :param sittings: each sitting's commit and start (UTC), in the order they ran.
    :param whole_from: the row number where the last sitting that explored the whole product began. A pair that
        failed before it and has no run since is not in that product (the code changed its decision's facts): a
        resumed sitting runs again every pair of its product whose last run failed.
    """

    product: int = 0
    whole: bool = False
    last: dict[str, tuple[int, list[str], str]] = field(default_factory=dict)
    seconds: float = 0.0
    sittings: list[str] = field(default_factory=list)
    whole_from: int = -1

    @property
    def failing(self) -> list[str]:
        return [reproducer for row, found, reproducer in self.last.values() if found and row > self.whole_from]

    @property
    def superseded(self) -> int:
        """Pairs whose last run failed on code whose product no longer holds them."""
        return sum(bool(found) and row < self.whole_from for row, found, _ in self.last.values())

    def line(self, platform: str) -> str:
        return (
            f"{platform}: product {self.product or 'unknown'}{'' if self.whole else ' (not explored whole yet)'}, "
            f"pairs run {len(self.last)}, passed {len(self.last) - len(self.failing) - self.superseded}, violations "
            f"{len(self.failing)} (and {self.superseded} on earlier code, not in the product since), pair run time "
            f"{self.seconds:.0f} s; {len(self.sittings)} sitting(s) on "
            f"{', '.join(sorted(set(self.sittings))) or 'commits not recorded'}"
        )


def rows(path: str) -> Iterator[list[Any]]:
    """A report's rows: ``sitting``, ``product`` and ``whole`` lines (platform first after the kind), else a pair's
    ``[platform, key, reproducer, passed, violations, seconds]``."""
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as lines:
        yield from map(json.loads, lines)


def accounts(paths: list[str]) -> dict[str, Account]:
    out: dict[str, Account] = {}
    began: dict[str, int] = {}  # each platform's current sitting's first row
    for number, row in enumerate(row for path in paths for row in rows(path)):
        if row[0] == "sitting":
            out.setdefault(row[1], Account()).sittings.append(str(row[2]))
            began[row[1]] = number
        elif row[0] in ("product", "whole"):
            account = out.setdefault(row[1], Account())
            account.product = int(row[2])
            if row[0] == "whole":
                account.whole, account.whole_from = True, began.get(row[1], -1)
        else:
            account = out.setdefault(row[0], Account())
            account.last[row[1]] = (number, list(row[4]), str(row[2]))
            account.seconds += float(row[5])
    return out


def main(paths: list[str]) -> int:
    whole = True
    for platform, account in sorted(accounts(paths).items()):
        print(account.line(platform))
        for reproducer in account.failing:
            print(f"    {reproducer}")
        whole &= account.whole and not account.failing
    return 0 if whole else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
