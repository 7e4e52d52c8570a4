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
    :param last: each pair's key -> its last run's (violations, reproducer).
    :param seconds: the pairs' own run time, summed over every run.
    :param sittings: each sitting's commit and start (UTC), in the order they ran.
    """

    product: int = 0
    whole: bool = False
    last: dict[str, tuple[list[str], str]] = field(default_factory=dict)
    seconds: float = 0.0
    sittings: list[str] = field(default_factory=list)

    @property
    def failing(self) -> list[str]:
        return [reproducer for found, reproducer in self.last.values() if found]

    def line(self, platform: str) -> str:
        return (
            f"{platform}: product {self.product or 'unknown'}{'' if self.whole else ' (not explored whole yet)'}, "
            f"pairs run {len(self.last)}, passed "
            f"{len(self.last) - len(self.failing)}, violations {len(self.failing)}, pair run time {self.seconds:.0f} s"
            f"; {len(self.sittings)} sitting(s) on {', '.join(sorted(set(self.sittings))) or 'commits not recorded'}"
        )


def rows(path: str) -> Iterator[list[Any]]:
    """A report's rows: ``sitting``, ``product`` and ``whole`` lines (platform first after the kind), else a pair's
    ``[platform, key, reproducer, passed, violations, seconds]``."""
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as lines:
        yield from map(json.loads, lines)


def accounts(paths: list[str]) -> dict[str, Account]:
    out: dict[str, Account] = {}
    for path in paths:
        for row in rows(path):
            if row[0] == "sitting":
                out.setdefault(row[1], Account()).sittings.append(str(row[2]))
            elif row[0] in ("product", "whole"):
                account = out.setdefault(row[1], Account())
                account.product = int(row[2])
                account.whole |= row[0] == "whole"
            else:
                account = out.setdefault(row[0], Account())
                account.last[row[1]] = (list(row[4]), str(row[2]))
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
