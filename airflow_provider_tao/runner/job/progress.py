"""Everything the runner prints: the command's output passed through, ``TAO_PROGRESS`` / ``TAO_FAILURE`` lines for
machines (one per line, ASCII JSON after the prefix), heartbeats, and the training steps found in the output.

* ``TAO_PROGRESS {"phase": "download"|"spec"|"run"|"upload"|"done", "files": n, "bytes": n, ...}`` -- at most one
  heartbeat per ``$TAO_PROGRESS_INTERVAL`` seconds (default 10) during transfers and the run, with ``"step"`` /
  ``"epoch"`` once the command prints ``step N``, ``global_step=N`` or ``Epoch N/M``.
* ``TAO_FAILURE {"err_class": "ERR_CONFIG"|"ERR_INFRA"|"ERR_UNKNOWN", "message": "..."}`` -- printed once, just
  before the runner exits non-zero because of its own failure.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Any

from .tuning import env_float

if TYPE_CHECKING:  # pragma: no cover - typing only
    from collections.abc import Callable

PROGRESS_PREFIX = "TAO_PROGRESS "
FAILURE_PREFIX = "TAO_FAILURE "

_STEP_PATTERNS = (
    re.compile(r"\bglobal_step\s*[=:]\s*(\d+)", re.IGNORECASE),
    re.compile(r"\bstep\s*[=:#]?\s*\[?\s*(\d+)", re.IGNORECASE),
)
_EPOCH_PATTERN = re.compile(r"\bepoch\s*[=:\[]?\s*(\d+)\s*/\s*(\d+)", re.IGNORECASE)


class Reporter:
    """Serialises everything the runner and the command print, so machine lines never split a user line.

    :param out: binary stream for stdout (defaults to ``sys.stdout.buffer``).
    :param err: binary stream for stderr.
    """

    def __init__(self, out: IO[bytes] | None = None, err: IO[bytes] | None = None) -> None:
        self.out = out if out is not None else sys.stdout.buffer
        self.err = err if err is not None else sys.stderr.buffer
        self.lock = threading.Lock()
        self._out_at_line_start = True
        self._err_at_line_start = True
        self.interval = env_float("TAO_PROGRESS_INTERVAL", 10.0)

    def _write(self, stream: IO[bytes], data: bytes, is_out: bool) -> None:
        if not data:
            return
        stream.write(data)
        stream.flush()
        at_start = data.endswith((b"\n", b"\r"))
        if is_out:
            self._out_at_line_start = at_start
        else:
            self._err_at_line_start = at_start

    def forward(self, data: bytes, is_out: bool = True) -> None:
        """Pass the command's output through unchanged."""
        with self.lock:
            self._write(self.out if is_out else self.err, data, is_out)

    def line(self, text: str, is_out: bool = True) -> None:
        """Print one whole line, starting a new one if the command left a partial line."""
        with self.lock:
            at_start = self._out_at_line_start if is_out else self._err_at_line_start
            payload = ("" if at_start else "\n") + text + "\n"
            self._write(self.out if is_out else self.err, payload.encode("utf-8", "replace"), is_out)

    def progress(self, phase: str, files: int = 0, nbytes: int = 0, **fields: Any) -> None:
        """Print one ``TAO_PROGRESS`` line."""
        data: dict[str, Any] = {"phase": phase, "files": int(files), "bytes": int(nbytes)}
        data.update({k: v for k, v in fields.items() if v is not None})
        self.line(PROGRESS_PREFIX + json.dumps(data, separators=(",", ":"), sort_keys=False))

    def info(self, message: str) -> None:
        """A human line for the job log."""
        self.line("[tao-runner] " + message)

    def warn(self, message: str) -> None:
        """A loud warning, on stdout (the log people read) and stderr."""
        bar = "!" * 78
        for text in (bar, "[tao-runner] WARNING: " + message, bar):
            self.line(text)
            self.line(text, is_out=False)

    def failure(self, err_class: str, message: str) -> None:
        """The one ``TAO_FAILURE`` line failure analysis reads."""
        payload = {"err_class": err_class, "message": message[:2000]}
        self.line(FAILURE_PREFIX + json.dumps(payload, separators=(",", ":")))


class Ticker:
    """Calls ``fn`` every ``interval`` seconds on a daemon thread until stopped.

    :param interval: seconds between calls.
    :param fn: the callback (a heartbeat).
    """

    def __init__(self, interval: float, fn: Callable[[], None]) -> None:
        self.interval = max(0.01, interval)
        self.fn = fn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tao-heartbeat", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(Exception):  # a heartbeat must never kill the run
                self.fn()

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class Progress:
    """Thread-safe transfer counters with a heartbeat and a final line.

    :param reporter: where lines go.
    :param phase: ``download`` or ``upload``.
    :param total_files: files planned.
    :param total_bytes: bytes planned.
    """

    def __init__(self, reporter: Reporter, phase: str, total_files: int = 0, total_bytes: int = 0) -> None:
        self.reporter = reporter
        self.phase = phase
        self.total_files = total_files
        self.total_bytes = total_bytes
        self.files = 0
        self.nbytes = 0
        self.cached = 0
        self.start = time.monotonic()
        self.lock = threading.Lock()

    def add(self, files: int = 0, nbytes: int = 0, cached: int = 0) -> None:
        """Count finished files / transferred bytes."""
        with self.lock:
            self.files += files
            self.nbytes += nbytes
            self.cached += cached

    def emit(self, final: bool = False) -> None:
        """Print the current state."""
        with self.lock:
            elapsed = max(time.monotonic() - self.start, 1e-9)
            self.reporter.progress(
                self.phase,
                self.files,
                self.nbytes,
                total_files=self.total_files,
                total_bytes=self.total_bytes,
                cached=self.cached or None,
                elapsed_s=round(elapsed, 2),
                mb_per_s=round(self.nbytes / elapsed / 1e6, 2),
                status="complete" if final else "running",
            )


class StepWatcher:
    """Finds training steps in the command's output and reports them (rate-limited) and heartbeats.

    :param reporter: where lines go.
    """

    def __init__(self, reporter: Reporter) -> None:
        self.r = reporter
        self.lock = threading.Lock()
        self.step: int | None = None
        self.epoch: int | None = None
        self.epochs: int | None = None
        self.start = time.monotonic()
        self.last_emit = 0.0
        self.reported: tuple[int | None, int | None] = (None, None)
        self.partial = {True: b"", False: b""}

    def feed(self, data: bytes, is_out: bool) -> None:
        """Scan a chunk of output (split on ``\\n`` and ``\\r`` so progress bars count)."""
        buf = self.partial[is_out] + data
        lines = re.split(rb"[\r\n]", buf)
        self.partial[is_out] = lines.pop()[-4096:]
        changed = False
        for raw in lines:
            if raw:
                changed = self._scan(raw.decode("utf-8", "replace")) or changed
        if changed:
            self._maybe_emit()

    def _scan(self, text: str) -> bool:
        changed = False
        for pattern in _STEP_PATTERNS:
            match = pattern.search(text)
            if match:
                with self.lock:
                    self.step = int(match.group(1))
                changed = True
                break
        match = _EPOCH_PATTERN.search(text)
        if match:
            with self.lock:
                self.epoch, self.epochs = int(match.group(1)), int(match.group(2))
            changed = True
        return changed

    def _maybe_emit(self) -> None:
        now = time.monotonic()
        with self.lock:
            state = (self.step, self.epoch)
            due = state != self.reported and (
                self.reported == (None, None) or now - self.last_emit >= min(self.r.interval, 2.0)
            )
        if due:
            self.emit()

    def heartbeat(self) -> None:
        """Called by the ticker: print a line when nothing was printed for an interval."""
        if time.monotonic() - self.last_emit >= self.r.interval * 0.9:
            self.emit()

    def emit(self, final: bool = False, exit_code: int | None = None) -> None:
        """Print the run state."""
        with self.lock:
            self.last_emit = time.monotonic()
            self.reported = (self.step, self.epoch)
            fields: dict[str, Any] = {
                "status": "exited" if final else "running",
                "elapsed_s": round(time.monotonic() - self.start, 2),
                "step": self.step,
                "epoch": self.epoch,
                "epochs": self.epochs,
                "exit_code": exit_code,
            }
        self.r.progress("run", **fields)
