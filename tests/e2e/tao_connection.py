"""The ``tao_e2e`` local connection shared by every e2e module (so they share one standalone instance)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

#: Jobs and results folders of the ``tao_e2e`` local connection, shared by every e2e module (one instance).
TAO_E2E_ROOT = Path(tempfile.mkdtemp(prefix="tao-e2e-"))
TAO_E2E_CONN = json.dumps(
    {
        "conn_type": "tao_local",
        "extra": {
            "jobs_dir": str(TAO_E2E_ROOT / "jobs"),
            "results_root": str(TAO_E2E_ROOT / "results"),
            "cancel_grace_seconds": 5,
        },
    }
)
