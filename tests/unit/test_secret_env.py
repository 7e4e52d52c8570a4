"""A DAG author's own secrets (``secret_env``, issue 38.6): references to connection fields, checked before
anything is submitted, handed to the job as ``JobSpec.secret_env`` (each platform's secret channel), never in the
spec's text or the trigger's kwargs, and masked by every process that shows the job's lines."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.joblog import readable_log
from airflow_provider_tao.jobs import JobHandle, JobState
from airflow_provider_tao.operators.submit import TAOSubmitOperator
from airflow_provider_tao.received_secrets import job_secrets
from airflow_provider_tao.records import STATE_KEY, JobRecord
from airflow_provider_tao.triggers.job import TAOJobTrigger
from tests.unit.fakes import FakeHook, Store, make_context

HF_TOKEN = "hf_author-secret-38-6-token"
WANDB_KEY = "wandb-author-secret-38-6-key"


@pytest.fixture
def author_conns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_MY_HF", json.dumps({"conn_type": "generic", "password": HF_TOKEN}))
    extra = {"api_key": WANDB_KEY, "entity": "team"}
    monkeypatch.setenv("AIRFLOW_CONN_WANDB", json.dumps({"conn_type": "generic", "login": "me", "extra": extra}))


def _op(**kwargs: Any) -> TAOSubmitOperator:
    defaults: dict[str, Any] = {"task_id": "train", "conn_id": "fake_conn", "image": "img:1", "command": "train.sh"}
    return TAOSubmitOperator(**{**defaults, **kwargs})


SECRET_ENV = {"HF_TOKEN": "conn:my_hf.password", "WANDB_API_KEY": "conn:wandb.api_key"}


@pytest.mark.parametrize(
    ("secret_env", "where", "why"),
    [
        ({"HF_TOKEN": "hf_literal-value-never-shown"}, "secret_env['HF_TOKEN']", "not a connection field reference"),
        ({"HF_TOKEN": "conn:my_hf"}, "secret_env['HF_TOKEN']", "not a connection field reference"),
        ({"HF_TOKEN": 42}, "secret_env['HF_TOKEN']", "not a connection field reference"),
        ({"1BAD": "conn:my_hf.password"}, "secret_env['1BAD']", "not an environment variable name"),
        (["HF_TOKEN"], "secret_env", "not a mapping"),
    ],
)
def test_a_secret_env_that_is_not_references_fails_the_dag_at_parse_time_without_showing_a_value(
    secret_env: Any, where: str, why: str
) -> None:
    with pytest.raises(JobValidationError) as exc:
        _op(secret_env=secret_env)
    assert exc.value.parameter == where and why in str(exc.value) and "conn:my_hf.password" in str(exc.value)
    assert "hf_literal-value-never-shown" not in str(exc.value)


@pytest.mark.parametrize(
    ("secret_env", "why"),
    [
        ({"HF_TOKEN": "conn:nobody.password"}, "there is no Airflow connection 'nobody'"),
        ({"HF_TOKEN": "conn:my_hf.token"}, "connection 'my_hf' has no 'token'"),
    ],
)
@pytest.mark.usefixtures("author_conns")
def test_a_reference_that_does_not_resolve_fails_before_anything_is_submitted(
    fake_platform: type[FakeHook], secret_env: dict[str, str], why: str
) -> None:
    with pytest.raises(AirflowFailException, match=rf"Bad input, nothing was submitted: .*{why}"):
        _op(secret_env=secret_env).execute(make_context(Store()))
    assert fake_platform.jobs == {}


@pytest.mark.usefixtures("author_conns")
def test_a_name_in_env_and_secret_env_is_refused(fake_platform: type[FakeHook]) -> None:
    with pytest.raises(AirflowFailException, match=r"secret_env.*\['HF_TOKEN'\] are in env too"):
        _op(secret_env=SECRET_ENV, env={"HF_TOKEN": "x"}).execute(make_context(Store()))
    assert fake_platform.jobs == {}


@pytest.mark.usefixtures("author_conns")
async def test_the_values_reach_the_job_only_and_every_reader_of_its_lines_masks_them(
    fake_platform: type[FakeHook], capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store()
    op = _op(secret_env=SECRET_ENV, deferrable=True, poll_interval=0.02)
    with pytest.raises(TaskDeferred) as deferred:
        await asyncio.to_thread(op.execute, make_context(store))
    (job,) = fake_platform.jobs.values()
    spec = job["spec"]
    assert spec.secret_env == {"HF_TOKEN": HF_TOKEN, "WANDB_API_KEY": WANDB_KEY}  # the platform's secret channel
    assert HF_TOKEN not in json.dumps(spec.to_json()) and HF_TOKEN not in spec.command and HF_TOKEN not in str(spec)
    trigger = deferred.value.trigger
    kwargs = json.dumps(trigger.serialize())
    assert HF_TOKEN not in kwargs and WANDB_KEY not in kwargs  # the metadata database never holds them
    assert {"conn:my_hf.password", "conn:wandb.api_key"} <= set(trigger.secret_conn_ids)

    handle = JobHandle.from_json(job["handle"].to_json())
    fake_platform.logs[handle.job_id] = f"token {HF_TOKEN} key {WANDB_KEY} entity team\n"
    job["state"] = JobState.COMPLETE
    revived = TAOJobTrigger(**trigger.serialize()[1])  # the triggerer builds it from the kwargs alone
    await asyncio.wait_for(revived.run().__anext__(), 10)
    out = capsys.readouterr().out
    assert "[job] token *** key *** entity team" in out and HF_TOKEN not in out

    record = JobRecord.from_json(store.get(STATE_KEY))  # what the job page and `airflow tao logs` read
    assert record is not None and HF_TOKEN not in json.dumps(store.get(STATE_KEY))
    secrets = job_secrets(record.secret_conn_ids, handle.conn_id)
    shown = readable_log(fake_platform.logs[handle.job_id], secrets)
    assert shown.startswith("token *** key *** entity team") and WANDB_KEY not in shown
