"""Settings every test process shares."""

from __future__ import annotations

import os

# No Airflow scheduler runs in the unit and integration tests: the hold that keeps a trigger's first event clear of
# the scheduler's deferral race (``[tao] trigger_event_hold_seconds``) would only slow them down. The e2e tests'
# ``airflow standalone`` gets a clean environment and the real default.
os.environ.setdefault("AIRFLOW__TAO__TRIGGER_EVENT_HOLD_SECONDS", "0")
