"""Contracts with Airflow itself: the real CLI lists our provider, trigger kwargs and events survive
``airflow.sdk.serde`` (the triggerer's storage path), and importing the operator stays light.

Fresh interpreters are used wherever "what gets imported" or "what Airflow's CLI sees" is the question.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import uuid
from datetime import UTC, datetime, timedelta
from importlib.metadata import entry_points
from pathlib import Path
from unittest import mock

import pytest
from airflow.sdk import serde
from airflow.sdk.exceptions import TaskDeferred
from airflow.triggers.base import TriggerEvent

from airflow_provider_tao.get_provider_info import get_provider_info
from airflow_provider_tao.jobs import JobHandle
from airflow_provider_tao.operators.submit import TAOSubmitOperator
from airflow_provider_tao.triggers.job import TAOJobTrigger

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
AIRFLOW = str(Path(PY).with_name("airflow"))
HEAVY = ("leptonai", "kubernetes", "docker", "boto3", "botocore", "optuna")
JSON_PRIMITIVES = (str, int, float, bool, type(None))


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TAO_"))}
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    return env


def _walk_primitives(value, path="kwargs"):
    """Every leaf is a JSON primitive and every mapping key a string (what the trigger table can hold as-is)."""
    if isinstance(value, dict):
        for key, item in value.items():
            assert type(key) is str, f"{path}: key {key!r} is a {type(key).__name__}"
            _walk_primitives(item, f"{path}[{key!r}]")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _walk_primitives(item, f"{path}[{index}]")
    else:
        assert type(value) in JSON_PRIMITIVES, f"{path} = {value!r} is a {type(value).__name__}"


# ----------------------------------------------------------------------------- the real CLI


@pytest.fixture(scope="module")
def cli_output(tmp_path_factory) -> dict[str, tuple[int, list, str]]:
    """`airflow providers hooks|triggers|links -o json`, run concurrently in fresh processes."""
    home = tmp_path_factory.mktemp("airflow_home")
    (home / "dags").mkdir()
    env = _clean_env(home)
    procs = {
        kind: subprocess.Popen(
            [AIRFLOW, "providers", kind, "-o", "json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=home,
        )
        for kind in ("hooks", "triggers", "links")
    }
    results = {}
    for kind, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"airflow providers {kind} failed:\n{err}"
        results[kind] = (proc.returncode, json.loads(out), err)
    return results


def test_cli_lists_our_hooks(cli_output):
    _, rows, stderr = cli_output["hooks"]
    info = get_provider_info()
    ours = {row["connection_type"]: row for row in rows if row.get("package_name") == info["package-name"]}
    expected = {c["connection-type"]: c for c in info["connection-types"]}
    assert set(ours) == set(expected)
    for conn_type, row in ours.items():
        assert row["class"] == expected[conn_type]["hook-class-name"]
        assert row["hook_name"] == expected[conn_type]["hook-name"]
        assert row["conn_id_attribute_name"] == "conn_id"
    # ProvidersManager warns (and drops the hook) on inconsistencies; there must be none for us.
    assert "airflow_provider_tao" not in stderr, stderr
    assert "Inconsistency" not in stderr, stderr


def test_cli_lists_our_triggers(cli_output):
    _, rows, stderr = cli_output["triggers"]
    info = get_provider_info()
    ours = [row for row in rows if row.get("package_name") == info["package-name"]]
    assert {row["class"] for row in ours} == {m for t in info["triggers"] for m in t["python-modules"]}
    assert {row["integration_name"] for row in ours} == {t["integration-name"] for t in info["triggers"]}
    assert "airflow_provider_tao" not in stderr, stderr


def test_cli_lists_our_links(cli_output):
    _, rows, stderr = cli_output["links"]
    listed = {row["extra_link_class_name"] for row in rows}
    assert set(get_provider_info()["extra-links"]) <= listed
    assert "airflow_provider_tao.links.TAOJobLink" in listed
    assert "airflow_provider_tao" not in stderr, stderr


def test_cli_sees_our_config_defaults(tmp_path):
    (tmp_path / "dags").mkdir()
    proc = subprocess.run(  # noqa: PLW1510 -- the return code is asserted with the output
        [AIRFLOW, "config", "get-value", "tao", "default_poll_interval"],
        env=_clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    default = get_provider_info()["config"]["tao"]["options"]["default_poll_interval"]["default"]
    assert proc.stdout.strip() == str(default)


# ----------------------------------------------------------------------------- trigger kwargs through serde


def _handle(**overrides) -> dict:
    values = {
        "platform": "local",
        "conn_id": "tao_local_default",
        "job_id": uuid.uuid4().hex[:12],
        "name": "dag-task-0123456789",
        "backend_job_id": "4242",
        "results_dir": "/results/x",
        "try_number": 2,
        "submitted_at": 1_790_000_000.125,
        "console_url": "file:///jobs/x/job.log",
    }
    values.update(overrides)
    return JobHandle(**values).to_json()


TRIGGER_CASES = [
    {"handle": _handle()},
    {"handle": _handle(conn_id=None), "deadline": None},
    {
        "handle": _handle(),
        "poll_interval": 0.5,
        "deadline": 1_900_000_000.75,
        "log_cursor": "123456789:42",
        "stream_logs": False,
        "cancel_on_kill": False,
        "secret_conn_ids": ["aws_default"],
    },
    {"handle": _handle(name="n" * 128, results_dir="/ü/ñ/path with spaces"), "poll_interval": 1},
]


@pytest.mark.parametrize("kwargs", TRIGGER_CASES)
def test_trigger_kwargs_survive_serde_and_rebuild_an_equal_trigger(kwargs):
    original = TAOJobTrigger(**kwargs).serialize()
    classpath, trigger_kwargs = original
    assert classpath == f"{TAOJobTrigger.__module__}.{TAOJobTrigger.__qualname__}"
    encoded = serde.serialize(trigger_kwargs)
    text = json.dumps(encoded)  # what the trigger table stores (before Fernet)
    decoded = serde.deserialize(json.loads(text))
    assert decoded == trigger_kwargs
    module, _, name = classpath.rpartition(".")
    cls = getattr(__import__(module, fromlist=[name]), name)
    assert cls(**decoded).serialize() == original


@pytest.mark.parametrize("kwargs", TRIGGER_CASES)
def test_trigger_kwargs_are_json_primitives_only(kwargs):
    _, trigger_kwargs = TAOJobTrigger(**kwargs).serialize()
    _walk_primitives(trigger_kwargs)
    # serde leaves primitives as they are: nothing needs an allow-list to deserialize.
    assert serde.serialize(trigger_kwargs) == trigger_kwargs


def test_walk_primitives_catches_non_primitives():
    for bad in ({"when": datetime.now(UTC)}, {"t": (1, 2)}, {"p": Path("/x")}, {1: "int key"}, {"s": {1}}):
        with pytest.raises(AssertionError):
            _walk_primitives(bad)


def test_trigger_kwargs_survive_the_trigger_tables_encryption(monkeypatch):
    """The exact path the scheduler and triggerer use: Trigger.encrypt_kwargs / _decrypt_kwargs."""
    from airflow.models import crypto
    from airflow.models.trigger import Trigger
    from cryptography.fernet import Fernet

    monkeypatch.setenv("AIRFLOW__CORE__FERNET_KEY", Fernet.generate_key().decode())
    crypto.get_fernet.cache_clear()
    try:
        original = TAOJobTrigger(**TRIGGER_CASES[2]).serialize()
        encrypted = Trigger.encrypt_kwargs(original[1])
        assert original[1]["handle"]["job_id"] not in encrypted  # really encrypted
        decrypted = Trigger._decrypt_kwargs(encrypted)
        assert decrypted == original[1]
        assert TAOJobTrigger(**decrypted).serialize() == original
    finally:
        crypto.get_fernet.cache_clear()


# ----------------------------------------------------------------------------- what the operator really defers with


class _StateStore(dict):
    def set(self, key, value):
        self[key] = value


def _context(try_number: int = 1):
    ti = mock.Mock(
        dag_id="contract_dag",
        task_id="train",
        run_id="manual__2026-01-01T00:00:00+00:00",
        map_index=-1,
        try_number=try_number,
        start_date=datetime.now(UTC),
    )
    return {"ti": ti, "task_state_store": _StateStore()}


@pytest.fixture
def local_home(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    return tmp_path


def test_operator_defers_with_serde_safe_kwargs_and_the_event_resumes_it(local_home):
    operator = TAOSubmitOperator(
        task_id="train",
        platform="local",
        command="echo contract-ok",
        gpu_count=0,
        deferrable=True,
        poll_interval=0.1,
        execution_timeout=timedelta(minutes=5),
    )
    context = _context()
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute(context)
    trigger = deferred.value.trigger
    assert isinstance(trigger, TAOJobTrigger)
    assert deferred.value.method_name == "execute_complete"
    classpath, kwargs = trigger.serialize()
    _walk_primitives(kwargs)
    stored = json.loads(json.dumps(serde.serialize(kwargs)))  # through the trigger table
    rebuilt = TAOJobTrigger(**serde.deserialize(stored))
    assert rebuilt.serialize() == (classpath, kwargs)
    assert kwargs["deadline"] is not None  # execution_timeout became an absolute deadline

    # The triggerer runs the rebuilt trigger; its event goes back to the worker through serde as next_kwargs.
    async def first_event() -> TriggerEvent:
        return await asyncio.wait_for(anext(rebuilt.run()), timeout=30)

    event = asyncio.run(first_event())
    assert event.payload["status"] == "complete"
    _walk_primitives(event.payload, "event")
    payload = serde.deserialize(json.loads(json.dumps(serde.serialize({"event": event.payload}))))["event"]
    assert payload == event.payload
    result = operator.execute_complete(context, payload)
    assert result["state"] == "Complete"
    assert result["job_id"] == kwargs["handle"]["job_id"]
    _walk_primitives(result, "xcom")


# ----------------------------------------------------------------------------- light imports (fresh interpreters)


IMPORT_SPY = textwrap.dedent(
    """
    import importlib, json, runpy, sys
    HEAVY = {heavy!r}
    attempts = []

    class Spy:
        # records every attempt, even of modules that are not installed (those never reach sys.modules)
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in HEAVY:
                attempts.append(name)
            return None

    sys.meta_path.insert(0, Spy())
    target = sys.argv[1]
    if target.endswith(".py"):
        sys.path.insert(0, target.rsplit("/", 1)[0])  # Airflow puts the DAGs folder on sys.path
        runpy.run_path(target, run_name="__dag_file__")
    else:
        importlib.import_module(target)
    loaded = sorted(m for m in sys.modules if m.partition(".")[0] in HEAVY)
    ours = sorted(m for m in sys.modules if m.startswith("airflow_provider_tao"))
    seen = list(attempts)
    try:
        import docker  # positive control: the spy does see a heavy import
    except ImportError:
        pass
    print(json.dumps({{"attempts": seen, "loaded": loaded, "ours": ours, "control": "docker" in attempts}}))
    """
).format(heavy=HEAVY)


def _fresh_import(target: str, home: Path) -> dict:
    proc = subprocess.run(  # noqa: PLW1510 -- the return code is asserted with the output
        [PY, "-c", IMPORT_SPY, target],
        env=_clean_env(home),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=home,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "target",
    [
        "airflow_provider_tao.operators.submit",
        "airflow_provider_tao.triggers.job",
        "airflow_provider_tao.links",
        "airflow_provider_tao.operators.automl",
        "airflow_provider_tao.triggers.automl",
    ],
)
def test_importing_imports_no_heavy_sdk(tmp_path, target):
    result = _fresh_import(target, tmp_path)
    assert target in result["ours"]
    assert result["control"] is True
    assert result["attempts"] == [], f"{target} tried to import {result['attempts']}"
    assert result["loaded"] == []


@pytest.mark.parametrize("dag_file", ["tao_quickstart.py", "tao_retraining_pipeline.py", "tao_automl.py"])
def test_parsing_the_example_dag_imports_no_heavy_sdk(tmp_path, dag_file):
    result = _fresh_import(str(REPO / "example_dags" / dag_file), tmp_path)
    assert "airflow_provider_tao.operators.submit" in result["ours"]
    assert result["attempts"] == [], result["attempts"]
    assert result["loaded"] == []


# ----------------------------------------------------------------------------- the CLI group and the plugin


def _airflow(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    (home / "dags").mkdir(exist_ok=True)
    return subprocess.run(  # noqa: PLW1510 -- the return code is asserted with the output
        [AIRFLOW, *args], env={**_clean_env(home), **(env or {})}, capture_output=True, text=True, timeout=180, cwd=home
    )


def test_the_cli_group_is_registered_through_provider_info(tmp_path):
    proc = _airflow(tmp_path, "tao", "--help")
    assert proc.returncode == 0, proc.stderr
    for command in ("jobs", "logs", "cancel", "reap"):
        assert command in proc.stdout
    for command in ("jobs", "logs", "cancel", "reap"):
        sub = _airflow(tmp_path, "tao", command, "--help")
        assert sub.returncode == 0 and "--output" in sub.stdout, sub.stderr


def _plugins(home: Path, env: dict[str, str]) -> list[dict]:
    proc = _airflow(home, "plugins", "-o", "json", env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip()
    return [] if out.startswith("No plugins") else json.loads(out.splitlines()[-1])


def _entry_point_dist(root: Path) -> Path:
    """A distribution carrying exactly the ``airflow.plugins`` entry points pyproject.toml declares (what
    ``pip install`` writes), so the entry-point route is checked against the declaration, not the venv's install."""
    import tomllib

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["airflow.plugins"]
    dist = root / "tao_plugin_entry_point-0.0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tao-plugin-entry-point\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text("[airflow.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in declared.items()))
    return root


@pytest.mark.parametrize("lazy", ["True", "False"], ids=["default-lazy-providers", "eager-providers"])
def test_the_plugin_loads_exactly_once_whatever_provider_discovery_does(tmp_path, lazy):
    env = {"AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": lazy}
    installed = [ep for ep in entry_points(group="airflow.plugins") if ep.value.startswith("airflow_provider_tao")]
    if not installed:  # an install older than pyproject.toml (a worktree on a shared venv): add what pip would write
        path = _entry_point_dist(tmp_path / "site")
        env["PYTHONPATH"] = os.pathsep.join([str(path), os.environ.get("PYTHONPATH", "")])
    plugins = [p for p in _plugins(tmp_path, env) if p["name"] == "tao"]
    assert len(plugins) == 1, plugins
    (plugin,) = plugins
    assert [app["url_prefix"] for app in plugin["fastapi_apps"]] == ["/tao"]
    (view,) = plugin["external_views"]
    assert (view["name"], view["href"], view["url_route"]) == ("TAO jobs", "/tao/jobs", "tao-jobs")
    proc = _airflow(tmp_path, "plugins", "-o", "json", env=env)
    assert "already registered" not in proc.stderr and "Failed to" not in proc.stderr, proc.stderr
