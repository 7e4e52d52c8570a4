"""TAO's own progress file, followed into the job log.

A TAO training program appends one JSON line per event to ``status.json`` in its results folder (TAO's
``StatusLogger``, opened by its ``monitor_status`` decorator in the action's results folder, e.g.
``<results_dir>/train/status.json``): ``{"epoch": 3, "max_epoch": 10, "kpi": {"val_loss": 0.41}, "status":
"RUNNING", ...}``. The runner follows every ``status.json`` under the job's results folder (up to
:data:`MAX_DEPTH` folders down) while the command runs and once more after it ends, and prints each new line as
``TAO_STATUS <line>`` into the job log -- where the trigger already reads, so an AutoML search sees the ``kpi``
values of every epoch without a platform call of its own. A file already there when the command starts is followed
from its end (an earlier run's lines are not this run's).
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import TYPE_CHECKING

from .progress import Ticker
from .tuning import env_float

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .progress import Reporter

STATUS_PREFIX = "TAO_STATUS "
STATUS_NAME = "status.json"
#: Folders below the results folder searched for ``status.json`` (TAO nests it per action, sometimes per output).
MAX_DEPTH = 3
#: Longest line printed as it is; a longer one is printed with only :data:`KEPT_FIELDS` (TAO's ``graphical`` data
#: can be large).
MAX_LINE = 16384
KEPT_FIELDS = ("epoch", "max_epoch", "step", "cur_iter", "max_iter", "status", "message", "kpi")
#: Longest unfinished line kept between two polls; a longer one is skipped whole (never printed in pieces).
MAX_PARTIAL = 1 << 20
_SKIP = b"\0"


class StatusFollower:
    """Follows the ``status.json`` files under ``root`` (a :class:`~.progress.Ticker`'s thread) while the command
    runs, and once more at its end.

    :param root: the job's results folder (local).
    :param reporter: where lines go.
    """

    def __init__(self, root: str, reporter: Reporter) -> None:
        self.root = root
        self.r = reporter
        self.interval = max(0.05, env_float("TAO_STATUS_INTERVAL", 2.0))
        self.offsets: dict[str, int] = {path: _size(path) for path in self.files()}  # followed from their end
        self.partial: dict[str, bytes] = {}
        self._ticker = Ticker(self.interval, self.poll)  # following the file never breaks the run

    def files(self) -> list[str]:
        """Every ``status.json`` under the root, at most :data:`MAX_DEPTH` folders down (links not followed)."""
        found: list[str] = []
        folders = [(self.root, 0)]
        while folders:
            folder, depth = folders.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False) and depth < MAX_DEPTH:
                        folders.append((entry.path, depth + 1))
                    elif entry.name == STATUS_NAME and entry.is_file(follow_symlinks=False):
                        found.append(entry.path)
        return sorted(found)

    def poll(self, final: bool = False) -> None:
        """Print the lines appended since the last poll (``final``: an unfinished last line too)."""
        for path in self.files():
            offset = self.offsets.get(path, 0)
            if _size(path) < offset:
                offset = 0  # the file was written anew
            try:
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    data = fh.read()
            except OSError:
                continue
            self.offsets[path] = offset + len(data)
            lines = (self.partial.pop(path, b"") + data).split(b"\n")
            rest = lines.pop()
            if final:
                lines.append(rest)
            elif rest:
                self.partial[path] = rest if len(rest) <= MAX_PARTIAL else _SKIP
            for raw in lines:
                self._print(raw.decode("utf-8", "replace").strip())

    def _print(self, line: str) -> None:
        if not line or line.startswith(_SKIP.decode()):
            return
        if len(line) > MAX_LINE:
            try:
                data = json.loads(line)
            except ValueError:
                return
            if not isinstance(data, dict):
                return
            line = json.dumps({k: data[k] for k in KEPT_FIELDS if k in data}, separators=(",", ":"))
        self.r.line(STATUS_PREFIX + line)

    def __enter__(self) -> StatusFollower:
        self._ticker.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ticker.__exit__()
        with contextlib.suppress(Exception):
            self.poll(final=True)  # the lines of the last epoch, written as the command ended


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
