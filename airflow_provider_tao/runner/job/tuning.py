"""The runner's tuning knobs, read from the job's environment (a bad value falls back to the default).

``TAO_PROGRESS_INTERVAL`` (s, 10) between heartbeats; ``TAO_TRANSFER_CONCURRENCY`` (16) parallel transfers;
``TAO_PART_SIZE_MB`` (8) multipart threshold and part size; ``TAO_TRANSFER_RETRIES`` (3) attempts of an S3 call or
a cut download stream; ``TAO_S3_MAX_ATTEMPTS`` (5) botocore's own attempts; ``TAO_S3_CONNECT_TIMEOUT`` /
``TAO_S3_READ_TIMEOUT`` (10 / 60 s); ``TAO_RUNNER_DRAIN_SECONDS`` (5) to read what the command left in its pipes;
``TAO_RUNNER_KILL_GRACE`` (5 s) between TERM and KILL of what it left running.
"""

from __future__ import annotations

import os


def env_float(name: str, default: float) -> float:
    """A float knob.

    :param name: the variable.
    :param default: used when it is unset, empty or not a number.
    """
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        return default


def env_int(name: str, default: int) -> int:
    """A positive integer knob (at least 1).

    :param name: the variable.
    :param default: used when it is unset, empty or not a number.
    """
    try:
        return max(1, int(os.environ.get(name, "") or default))
    except ValueError:
        return default
