"""``[tao] freeze_triggerer_heap``: the first poller of a triggerer process freezes the heap alive then (issue 24: at
10,000 watched jobs a full garbage collection of that heap is the event loop's worst stall), once, and what comes
after is still collected. Each case runs in a fresh interpreter: a freeze is process-wide."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# Two triggers of two connections (two pollers) run to their end on the in-memory platform; then a reference cycle
# made after them must still be collected. Prints what the freeze did.
_SCRIPT = """
import asyncio, gc, json, uuid, weakref
from airflow_provider_tao import hooks
from airflow_provider_tao.jobs import JobSpec, JobState
from airflow_provider_tao.triggers.job import TAOJobTrigger
from tests.unit.fakes import FakeHook

hooks.PLATFORMS["fake"] = ("tao_fake", "tests.unit.fakes.FakeHook")
FakeHook.reset()
frozen = []

async def watch(conn_id):
    job_id = uuid.uuid4().hex[:12]
    handle = FakeHook(conn_id=conn_id).create_job(JobSpec(name="j-" + job_id, job_id=job_id, command="x", image="i"))
    FakeHook.jobs[job_id]["state"] = JobState.COMPLETE
    trigger = TAOJobTrigger(handle=handle.to_json(), poll_interval=0.02)
    await asyncio.wait_for(trigger.run().__anext__(), 300)
    frozen.append(gc.get_freeze_count())

class Node:
    pass

before = gc.get_freeze_count()  # Python 3.12 starts with a few hundred frozen already
asyncio.run(watch("fake_a"))
asyncio.run(watch("fake_b"))
node = Node()
node.me = node  # a cycle: only the collector frees it
alive = weakref.ref(node)
del node
gc.collect()
print(json.dumps({"frozen": [n - before for n in frozen], "cycle_collected": alive() is None}))
"""


def _run(freeze: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "AIRFLOW__TAO__FREEZE_TRIGGERER_HEAP"}
    if freeze is not None:
        env["AIRFLOW__TAO__FREEZE_TRIGGERER_HEAP"] = freeze
    env["AIRFLOW_CONN_FAKE_A"] = env["AIRFLOW_CONN_FAKE_B"] = '{"conn_type": "tao_fake"}'
    env["AIRFLOW__TAO__TRIGGER_EVENT_HOLD_SECONDS"] = "0"
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2]), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], check=False, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_first_poller_freezes_the_heap_once_and_later_garbage_is_still_collected() -> None:
    result = _run(None)  # the default
    first, second = result["frozen"]  # type: ignore[misc]
    assert first > 50_000  # the imports (Airflow's, the SDK's, the provider's) are out of the collector's walk
    assert second <= first  # the second connection's poller froze nothing more (frozen objects freed by refcount leave)
    assert result["cycle_collected"]


def test_the_freeze_is_off_when_the_setting_says_so() -> None:
    assert all(n <= 0 for n in _run("False")["frozen"])  # nothing frozen (what was may be freed)
