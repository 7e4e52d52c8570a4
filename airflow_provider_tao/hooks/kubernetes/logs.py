"""How the ``kubernetes`` platform reads a pod's log: bounded reads that follow a timestamp cursor.

``read_namespaced_pod_log`` of both clients (kubernetes 36.0.3, kubernetes_asyncio 36.1.0) declares ``container``,
``follow``, ``insecure_skip_tls_verify_backend``, ``limit_bytes``, ``pretty``, ``previous``, ``since_seconds``,
``stream``, ``tail_lines`` and ``timestamps`` -- not the REST API's ``sinceTime`` (any other keyword raises
``ApiTypeError`` before a request is sent). So a read asks for the lines of the last ``since_seconds`` (reaching a
little before the cursor: the node's clock stamps the lines and resolves ``since_seconds``, the Airflow host's
clock computes it), with ``timestamps``, and drops the lines at or before the cursor again.

Every read carries ``limit_bytes``: a job that writes fast never makes a poll download and split more than
:data:`LOG_READ_BYTES` on the triggerer's event loop. A cut answer's unfinished last line is left for the next read.
When one bounded read holds nothing after the cursor (the job wrote more than a read within the overlap), the reader
jumps to the newest lines (``tail_lines``), says that lines were skipped, and keeps reading by tail -- asking for
fewer lines while they do not fit in a read, at most :data:`MAX_READS` reads a call -- until a window reaching back to
the cursor fits in one read again; ``kubectl logs`` still has every line. The mode travels in the cursor (opaque
outside the hook), so a restarted triggerer resumes alike.
"""

from __future__ import annotations

import math
from typing import Any

from airflow_provider_tao.hooks.base import LOG_READ_LIMIT
from airflow_provider_tao.hooks.kubernetes.status import CONTAINER
from airflow_provider_tao.hooks.shared import container as ct

#: The most bytes one log read downloads (the API's ``limitBytes``).
LOG_READ_BYTES = LOG_READ_LIMIT
#: The failure analysis' tail: its last lines, at most this many bytes.
TAIL_READ_BYTES = 256 * 1024
#: How far before the cursor's second a read reaches: the node's clock may be ahead of the Airflow host's.
OVERLAP_SECONDS = 3
#: How many of the newest lines a read by tail asks for at first (fewer while they do not fit in a read).
CATCH_UP_LINES = 2000
#: The most reads one call makes (a read by time that cannot get past the cursor, then one by tail).
MAX_READS = 2
#: Marks the cursor while the reader follows by tail: ``<cursor>@tail<lines>``.
_TAIL_MODE = "@tail"
SKIPPED_NOTE = (
    "[kubernetes] the job writes faster than one log read ({limit} bytes) can follow: lines were skipped here; "
    "`kubectl logs` has them all"
)


class PodLogRead:
    """One ``get_job_logs`` call: which reads to make (each bounded) and what they add up to.

    Use: ``params = read.request()``; then ``params = read.feed(answer)`` until it is None; then ``read.result``.

    :param cursor: where the last call stopped ("" = from the start).
    :param tail: read the last ``tail`` lines instead (the cursor then ends at the end of the log).
    :param now: the Airflow host's time (epoch seconds).
    """

    def __init__(self, cursor: str, tail: int | None, now: float) -> None:
        cursor = "" if tail is not None else cursor
        base, mode, lines = cursor.partition(_TAIL_MODE)
        self.cursor = base
        #: None while reading by time; else how many of the newest lines to ask for
        self.tail_lines: int | None = int(lines) if mode and lines.isdigit() else CATCH_UP_LINES if mode else None
        self.tail = tail
        self.now = now
        self.reads = 0
        self.result: tuple[str, str] = ("", cursor)
        self._params: dict[str, Any] = {}

    def request(self) -> dict[str, Any]:
        """The keyword arguments of the next ``read_namespaced_pod_log`` call (all declared by both clients)."""
        last, _ = ct.parse_log_cursor(self.cursor)
        params: dict[str, Any] = {"container": CONTAINER, "timestamps": True, "limit_bytes": LOG_READ_BYTES}
        if self.tail is not None:
            params["tail_lines"] = self.tail
        elif self.tail_lines is not None:
            params["tail_lines"] = self.tail_lines
        elif last:
            params["since_seconds"] = max(1, math.ceil(self.now - ct.cursor_second(last)) + OVERLAP_SECONDS)
        self._params = params
        self.reads += 1
        return params

    def feed(self, data: bytes) -> dict[str, Any] | None:
        """Take a read's answer; the next read's keyword arguments, or None when this call is done."""
        cut = len(data) >= self._params["limit_bytes"]
        lines = complete_lines(data, cut)
        text, cursor = ct.read_after(lines, self.cursor)
        stuck = cut and cursor == self.cursor  # a full read, and nothing in it after the cursor
        if self.tail is None and "since_seconds" in self._params and stuck:
            self.tail_lines = CATCH_UP_LINES  # the overlap alone fills a read: no read by time gets past it
            return self.request()
        if self.tail is None and "tail_lines" in self._params:
            # fewer lines while the newest ones do not fit in a read; back to reads by time once a window reaching
            # back to the cursor fits in one read
            fitted = max(1, len(lines) // 2 if stuck else len(lines))
            if stuck and self.reads < MAX_READS and fitted < int(self._params["tail_lines"]):
                self.tail_lines = fitted
                return self.request()
            if self.cursor and lines and _after(lines[0][0], self.cursor):
                text = SKIPPED_NOTE.format(limit=self._params["limit_bytes"]) + "\n" + text
            if cut:
                self.tail_lines = fitted
            elif lines and _older(lines[0][0], cursor, OVERLAP_SECONDS + 1):
                self.tail_lines = None
            else:
                self.tail_lines = min(CATCH_UP_LINES, 2 * int(self._params["tail_lines"]))
        mode = f"{_TAIL_MODE}{self.tail_lines}" if self.tail_lines is not None and cursor else ""
        self.result = (text, cursor + mode)
        return None


def complete_lines(data: bytes, cut: bool) -> list[tuple[str, str]]:
    """``(timestamp, text)`` of each line; a cut answer's unfinished last line is left out (the next read has it),
    unless it is the only line (a line longer than a read: shown cut, so the reader moves on)."""
    if cut and not data.endswith(b"\n") and b"\n" in data:
        data = data[: data.rindex(b"\n") + 1]
    return list(ct.timestamped_lines([data]))


def _after(stamp: str, cursor: str) -> bool:
    last, _ = ct.parse_log_cursor(cursor)
    return stamp > last


def _older(stamp: str, cursor: str, seconds: int) -> bool:
    last, _ = ct.parse_log_cursor(cursor)
    return bool(last) and ct.cursor_second(stamp) < ct.cursor_second(last) - seconds


def expected_log_refusal(status: int | None, body: str) -> bool:
    """A refusal the log path expects: the container has not started yet (400 "is waiting to start", as the
    kubelet says it) or the pod is gone (404). Anything else is a problem worth a warning."""
    return status == 404 or (status == 400 and "waiting to start" in body)


def log_refusal_expected(exc: Exception, job_id: str, log: Any, warned: set[str]) -> bool:
    """Whether a failed log read is one the log path expects (then it reads as "no new lines"). Any other failure
    is logged as a warning once per job and kind -- the caller raises it on, never swallows it."""
    body = getattr(exc, "body", None) or b""
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
    if expected_log_refusal(getattr(exc, "status", None), text):
        return True
    key = f"{job_id}/{type(exc).__name__}/{getattr(exc, 'status', '')}"
    if key not in warned:
        warned.add(key)
        log.warning("Reading the log of job %s failed: %s", job_id, exc)
    return False
