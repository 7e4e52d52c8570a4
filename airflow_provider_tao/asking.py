"""Asking again: a call whose fact read failed decides nothing (``DecideLater``, a platform blip), so the caller asks
again, with a growing pause, where no later try would do it (a worker's ``on_kill``, a person's cancel)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def asked_again(call: Callable[[], T], *, asks: int, pause: float, log: Any, what: str) -> T:
    """``call()``, asked up to ``asks`` times while it raises; the pause doubles from ``pause`` seconds, and the
    last failure is raised.

    :param what: what is asked, for the log line of each failure (``"Canceling job X"``).
    """
    ask = 1
    while True:
        try:
            return call()
        except Exception as exc:
            if ask >= asks:
                raise
            log.warning("%s failed (%s): asking again", what, exc)
            time.sleep(pause * 2 ** (ask - 1))
            ask += 1
