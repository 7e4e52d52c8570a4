"""How a job's log text becomes task-log lines: whole lines as they come, the latest state of a progress bar, a
capped unfinished line, the runner's ``TAO_PROGRESS`` heartbeats in words, and every secret the job received
masked -- whichever process writes them (the triggerer, the worker, ``airflow tao logs``).

A job's log reaches the writer in chunks that end anywhere. A line without its newline yet waits for the next chunk;
but a ``\\r`` progress bar (tqdm) rewrites one line for minutes and may never end it, so the unfinished text keeps only
what follows its last ``\\r`` (what a terminal would show), shows that state once per chunk when it changed, and is
flushed as a line of its own once it grows past :data:`MAX_PARTIAL_CHARS` -- the buffer never grows without bound.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from airflow_provider_tao.hooks.shared.secrets import redact

#: Longest unfinished line kept for its newline; beyond it the text is written as a line of its own.
MAX_PARTIAL_CHARS = 16384
PROGRESS_PREFIX = "TAO_PROGRESS "


def latest_state(line: str) -> str:
    """What a terminal shows of ``line``: the text after its last ``\\r`` that is followed by anything."""
    return line.rstrip("\r").rpartition("\r")[2]


def render_progress(line: str) -> str:
    """A runner ``TAO_PROGRESS {json}`` heartbeat in words (``progress: run, step 120, epoch 2/10``); any other
    line, and a heartbeat whose fields are not what the runner prints, unchanged: a job's output is data, and one
    line must never stop its log from being shown (or its task from ending)."""
    if not line.startswith(PROGRESS_PREFIX):
        return line
    try:
        data = json.loads(line[len(PROGRESS_PREFIX) :])
        return _progress_words(data) if isinstance(data, dict) else line
    except (ValueError, TypeError, OverflowError, RecursionError):  # "x", 1e999, [1], 10**5000, [[[...
        return line


def _progress_words(data: dict[str, Any]) -> str:
    words = [str(data.get("phase", "?"))]
    if status := data.get("status"):
        words.append(str(status))
    if data.get("files"):
        words.append(f"{data['files']} file(s)")
    if data.get("bytes"):
        words.append(f"{int(data['bytes']) / 1e6:.1f} MB")
    if "step" in data:
        words.append(f"step {data['step']}")
    if "epoch" in data:
        total = data.get("epochs") or data.get("num_epochs")
        words.append(f"epoch {data['epoch']}" + (f"/{total}" if total else ""))
    if "exit_code" in data:
        words.append(f"exit code {data['exit_code']}")
    return "progress: " + ", ".join(words)


def collapse_progress(lines: Iterable[str]) -> list[str]:
    """Lines for people: each run of consecutive ``TAO_PROGRESS`` heartbeats becomes its last one, in words."""
    out: list[str] = []
    in_run = False
    for line in lines:
        is_progress = line.startswith(PROGRESS_PREFIX)
        if is_progress and in_run:
            out[-1] = render_progress(line)
        else:
            out.append(render_progress(line))
        in_run = is_progress
    return out


def readable_log(text: str, secrets: Sequence[str] = ()) -> str:
    """A whole job log as people read it (``airflow tao logs``): progress bars at their last state, heartbeats
    collapsed, secrets masked."""
    lines = collapse_progress(latest_state(line) for line in text.split("\n"))
    return redact("\n".join(lines), secrets)


class JobLogWriter:
    """Turns chunks of a job's log into the lines the task log shows.

    :param secrets: values to mask (the secrets the job received); more can be added later with :meth:`mask`.
    :param max_partial: longest unfinished line kept for its newline.
    """

    def __init__(self, secrets: Sequence[str] = (), max_partial: int = MAX_PARTIAL_CHARS) -> None:
        # a tuple, not a set: an empty one is no object of its own for the garbage collector to walk
        self.secrets: tuple[str, ...] = ()
        self.mask(secrets)
        self.max_partial = max_partial
        self.partial = ""  # the unfinished line (only its latest \r state)
        self._shown = ""  # the unfinished line's state already shown

    def mask(self, values: Iterable[str]) -> None:
        """Mask these values too."""
        self.secrets = tuple(dict.fromkeys([*self.secrets, *(v for v in values if v)]))

    def feed(self, text: str, final: bool = False) -> list[str]:
        """The lines to write for this chunk; ``final``: the log ended, the unfinished line is written too."""
        lines = (self.partial + text).split("\n")
        partial = latest_state(lines.pop())
        lines = [latest_state(line) for line in lines]
        if lines:
            if self._shown and lines[0] == self._shown:
                lines.pop(0)  # the progress state shown last time, now ended by its newline: not twice
            self._shown = ""
        if len(partial) > self.max_partial:
            lines.append(partial)  # a line that never ends is written in pieces, never held without bound
            partial = ""
        elif final and partial:
            lines.append(partial)
            partial = ""
        elif "\r" in text and partial and partial != self._shown:
            lines.append(partial)  # a progress bar's newest state, once per chunk
            self._shown = partial
        self.partial = partial
        return [redact(line, sorted(self.secrets)) for line in collapse_progress(lines)]
