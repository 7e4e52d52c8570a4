"""Hostile input and secrets on every platform, through ``TAOSubmitOperator`` as Airflow runs it (templates rendered
by Airflow's own Jinja, execute -> defer -> the trigger on the shared triggerer loop -> execute_complete).

* Generated strings (quotes, ``;``, ``&&``, ``$()``, backticks, newlines, control characters, non-ASCII, Jinja in
  the DAG-run conf) in the command (argv or a bash string), the environment, the spec file and args -- many values in
  ONE job per platform and shape, the 24 jobs (four shapes on six platforms) at the same time -- arrive in the job
  byte for byte: the job prints a SHA-256 of the exact bytes it received (argv, environ, spec file) and the test
  compares.
* Every value tries to ``touch`` a sentinel; no sentinel ever appears on this host (the worker, the docker daemon's
  host), on the SLURM login node, or in the job.
* What no process can carry (NUL, lone surrogates, 1 MiB strings in argv or environment) and what no platform can
  name (shell characters in job names and images) is refused before submission with an error naming the field,
  and the backend never sees a job of that task.
* While the jobs run, the S3 secret key, the NGC key, the platform tokens, the SSH key passphrase and the DAG author's
  own secret (``secret_env``, a connection field reference) are nowhere but in the job's own environment: not in
  any process's command line, not in the environment of a process that is not the job, not in the task log, the
  serialized trigger, the XCom values, the result, any container's inspect (job containers, Brev instances,
  Kubernetes pods, Lepton replicas), the sbatch script, the Kubernetes objects but Secrets, the Lepton job specs,
  the Brev CLI's command lines, or a world-readable file.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from airflow_provider_tao.hooks import get_platform_hook
from airflow_provider_tao.jobs import JobHandle, JobState
from tests.integration.hostile.conftest import (
    AUTHOR_CONN,
    AUTHOR_SECRET,
    PLATFORMS,
    S3_SECRET,
    STORAGE_CONN,
    Platform,
    on_login_node,
)
from tests.integration.taskrun import TaskRun, Triggerer, finish, make_operator, start
from tests.unit.fakes import Store, make_context

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_trigger_outlives_its_test")]

SENTINEL = f"/tmp/tao-hostile-sentinel-{uuid.uuid4().hex[:10]}"
#: Shell and template fragments, each trying to run ``touch SENTINEL`` in its own way.
ATTACKS = [
    f"$(touch {SENTINEL})",
    f"`touch {SENTINEL}`",
    f"; touch {SENTINEL}",
    f"&& touch {SENTINEL}",
    f"| touch {SENTINEL}",
    f"\ntouch {SENTINEL}\n",
    f"'; touch {SENTINEL}; '",
    f'"; touch {SENTINEL}; "',
    f"${{IFS}}touch${{IFS}}{SENTINEL}",
    "$HOME ${PATH} $0 $@ * ? ~ ! # %s %(x)s {x} {0} \\ \\n",
    "-rf --help --config=/etc/passwd",
    "\r\t\x1b[31m\x7f\x01 \u202e\u00e9\u65e5\U0001f642 \u0000"[:-1],  # (no NUL: that one is refused, below)
]
#: Jinja syntax is a template in a templated field (Airflow's rule), so it only comes in through the DAG-run conf.
JINJA = ["{{ 7 * 7 }}", "{% raw %}", "{# c #}", "{{ dag_run.conf }}"]
_TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00{}%#"), max_size=24)
_FRAGMENT = st.one_of(st.sampled_from(ATTACKS), _TEXT)
VALUE = st.lists(_FRAGMENT, min_size=1, max_size=4).map("".join)
CONF_VALUE = st.lists(st.one_of(_FRAGMENT, st.sampled_from(JINJA)), min_size=1, max_size=4).map("".join)

#: The job: SHA-256 of exactly what it received, the secrets it must have, whether the sentinel exists in it; then
#: it stays up while the test looks at every process, container and record.
JOB = r"""
import hashlib, json, os, sys, time
def h(parts): return hashlib.sha256(b"\0".join(parts)).hexdigest()
job = os.environ["TAO_JOB_ID"]
argv = [os.fsencode(a) for a in sys.argv[1:]]
spec = b""
if argv and argv[0] == b"--spec":
    spec = open(argv[1], "rb").read()
    spec = json.dumps(json.loads(spec)["hostile"], sort_keys=True).encode()
    argv = argv[2:]
env = [k + b"=" + v for k, v in sorted(os.environb.items()) if k.startswith(b"HV_")]
print("HOSTILE", job, "argv", h(argv), "env", h(env), "spec", hashlib.sha256(spec).hexdigest(), flush=True)
wanted = os.environ.get("WANT_SECRETS", "").split()
got = {k: hashlib.sha256(os.environ.get(k, "").encode()).hexdigest() for k in wanted}
print("HOSTILE", job, "secrets", hashlib.sha256(json.dumps(got, sort_keys=True).encode()).hexdigest(), flush=True)
print("HOSTILE", job, "sentinel", os.path.exists(os.environ["HOSTILE_SENTINEL"]), flush=True)
time.sleep(float(os.environ["HOSTILE_HOLD"]))
"""
#: A job runs this long after its prints: the looker's rounds must see it running before and after its look (a round
#: with Brev jobs takes seconds, more while submitting; under a CPU hog beside three lanes one took over 25 s, issue 35)
HOLD_SECONDS = 60
#: How long a job may wait for a busy shared backend (the SLURM cluster serves every session of this machine).
RUNNING_TIMEOUT = 600


def _digest(parts: list[str]) -> str:
    return hashlib.sha256(b"\0".join(p.encode() for p in parts)).hexdigest()


@st.composite
def batches(draw: Any) -> dict[str, Any]:
    """One job's worth of hostile values: argv, environment, spec, args, and the DAG-run conf / params."""
    return {
        # as many values in one batch as two batches held: every batch costs 24 real jobs, the values are free
        "argv": draw(st.lists(VALUE, min_size=6, max_size=12)),
        "env": draw(st.lists(VALUE, min_size=6, max_size=12)),
        "spec": draw(st.lists(VALUE, min_size=4, max_size=10)),
        "conf": draw(st.lists(CONF_VALUE, min_size=4, max_size=8)),
        "big": (draw(st.sampled_from(ATTACKS)) * 2000)[: 40 * 1024],  # carried by argv and environ alike
    }


# --------------------------------------------------------------------------- building the jobs


def _task(platform: Platform, shape: str, batch: dict[str, Any]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The operator of one platform's job, the context its templates render with, and what the job must report."""
    conf = {f"c{i}": value for i, value in enumerate(batch["conf"])}
    params = {f"p{i}": value for i, value in enumerate(batch["conf"])}
    # values as written in the DAG, and the templates that bring the conf/params in
    argv = [*batch["argv"], batch["big"]]
    if shape != "string":  # (a value rendered into a bash string is the DAG author's to quote: not tested)
        argv += ["{{ dag_run.conf['%s'] }}" % k for k in conf]  # noqa: UP031
    env = {f"HV_{i}": v for i, v in enumerate([*batch["env"], batch["big"]])}
    env |= {f"HV_P{i}": "{{ params.%s }}" % k for i, k in enumerate(params)}  # noqa: UP031
    secrets = {"AWS_SECRET_ACCESS_KEY": S3_SECRET} if shape in ("specs", "args") else {}
    secrets["AUTHOR_TOKEN"] = AUTHOR_SECRET  # secret_env (issue 38.6): every platform's secret channel
    env |= {"HOSTILE_SENTINEL": SENTINEL, "HOSTILE_HOLD": str(HOLD_SECONDS), "WANT_SECRETS": " ".join(secrets)}
    kwargs = platform.operator_kwargs() | {"secret_env": {"AUTHOR_TOKEN": f"conn:{AUTHOR_CONN}.password"}}
    if shape == "argv":
        kwargs["command"] = ["python3", "-c", JOB, *argv]
    elif shape == "string":  # one bash -c: the values quoted as a DAG author would
        kwargs["command"] = f"python3 -c {shlex.quote(JOB)} " + " ".join(shlex.quote(a) for a in argv)
    elif shape == "specs":
        spec = {"values": batch["spec"], "conf": ["{{ params.%s }}" % k for k in params]}  # noqa: UP031
        spec["nested"] = {"k": batch["spec"][0]}
        kwargs |= {"command": ["python3", "-c", JOB, "--spec", "{config_path}", *argv], "config_format": "json"}
        kwargs |= {"specs": {"hostile": spec}, "storage_conn_id": STORAGE_CONN}
    else:  # args: appended to the command as --name value
        args = {f"a{i}": v for i, v in enumerate(batch["spec"])}
        kwargs |= {"command": ["python3", "-c", JOB], "args": args, "storage_conn_id": STORAGE_CONN}
    op = make_operator(**kwargs, env=env, job_name="hostile")
    context = make_context(Store(), 1, f"manual__{uuid.uuid4().hex[:10]}")
    context |= {"params": params, "dag_run": SimpleNamespace(conf=conf, run_id=context["ti"].run_id)}
    want = {"params": {f"HV_P{i}": v for i, v in enumerate(params.values())}, "secrets": secrets, "shape": shape}
    return op, context, want


def _render(op: Any, context: dict[str, Any]) -> None:
    """Render the operator's templated fields as Airflow does for a task of a DAG (the DAG's Jinja environment:
    sandboxed, trailing newlines kept)."""
    op.render_template_fields(context, jinja_env=DAG(dag_id="hostile", schedule=None).get_template_env())


def _wanted(op: Any, want: dict[str, Any]) -> dict[str, str]:
    """What the job must report: the operator's fields as Airflow rendered them (a literal value is a template: Jinja
    turns its CR and CRLF into LF and drops one trailing newline), and the DAG-run conf / params exactly as given
    (rendered data is never rendered again)."""
    shape = want["shape"]
    assert {k: op.env[k] for k in want["params"]} == want["params"], "a conf value did not survive rendering"
    argv = {
        "argv": lambda: op.command[3:],
        "string": lambda: shlex.split(op.command)[3:],
        "specs": lambda: op.command[5:],
        "args": lambda: [token for key, value in op.args.items() for token in (f"--{key}", value)],
    }[shape]()
    spec = op.specs["hostile"] if shape == "specs" else None
    secrets = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in want["secrets"].items()}
    return {
        "argv": _digest(argv),
        "env": _digest([f"{k}={v}" for k, v in sorted(op.env.items()) if k.startswith("HV_")]),
        "spec": hashlib.sha256(json.dumps(spec, sort_keys=True).encode() if spec else b"").hexdigest(),
        "secrets": hashlib.sha256(json.dumps(secrets, sort_keys=True).encode()).hexdigest(),
    }


def _submit(triggerer: Triggerer, op: Any, context: dict[str, Any]) -> TaskRun:
    """Render the templates as Airflow does, then run the task to its deferral."""
    _render(op, context)
    return start(triggerer, op, store=context["task_state_store"], run_id=context["ti"].run_id)


# --------------------------------------------------------------------------- watching the machine


class Watcher:
    """Samples every process's command line, and the environment of every process that is not a job, until
    stopped: any line holding one of ``secrets`` is kept."""

    def __init__(self, secrets: list[str]) -> None:
        self.secrets = [s.encode() for s in secrets]
        self.found: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for proc in Path("/proc").iterdir():
                if proc.name.isdigit():
                    self._look(proc)
            self.samples += 1
            self._stop.wait(0.05)

    def _look(self, proc: Path) -> None:
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:
            return
        if b"tests.leptonfake" in cmdline:  # the fake Lepton cloud: its token on its command line is the server's
            return
        is_job = b"TAO_JOB_ID=" in environ  # the job's processes: its environment is where its secrets belong
        for secret in self.secrets:
            if secret in cmdline:
                self.found.append(f"command line of {cmdline[:200]!r}")
            if secret in environ and not is_job:
                self.found.append(f"environment of {cmdline[:200]!r} (not a job)")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class RunningLook:
    """Each job's records on its backend, taken as soon as that job runs (jobs wait for a busy shared cluster for
    different times), and every container's inspect once a round in which a container job began to run; each job
    checked to be still running afterwards. The rounds run in a thread of their own from the first submission on:
    a job is looked at within a round of its start while the next ones are submitted, so its hold stays short."""

    def __init__(self, platforms: dict[str, Platform], engine: Any, since: float) -> None:
        self.platforms, self.engine, self.since = platforms, engine, since
        self.records: dict[str, str] = {}
        self._waiting: dict[tuple[str, str], TaskRun] = {}
        self._lock = threading.Lock()
        self._submitted, self._stop = threading.Event(), threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def add(self, key: tuple[str, str], run: TaskRun) -> None:
        with self._lock:
            self._waiting[key] = run

    def all_looked(self) -> dict[str, str]:
        """Once every job was submitted: the records, when every job has been looked at."""
        self._submitted.set()
        self._thread.join()
        if self._failure is not None:
            raise self._failure
        return self.records

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        deadline = time.monotonic() + RUNNING_TIMEOUT
        try:
            while not self._stop.is_set():
                with self._lock:
                    waiting = dict(self._waiting)
                if self._submitted.is_set() and not waiting:
                    return
                self._round(waiting)
                assert time.monotonic() < deadline, f"not running after {RUNNING_TIMEOUT} s: {sorted(waiting)}"
                self._stop.wait(0.3)
        except BaseException as exc:  # raised in the test's thread by all_looked
            self._failure = exc

    def _round(self, waiting: dict[tuple[str, str], TaskRun]) -> None:
        looked: list[tuple[tuple[str, str], Any, JobHandle]] = []
        for key, run in waiting.items():
            hook = get_platform_hook(run.trigger.handle.platform, run.trigger.handle.conn_id)
            handle = JobHandle.from_json(run.handle)
            state = hook.get_job_status(handle).state
            assert not state.is_terminal, f"{key} job {handle.job_id} ended before it was looked at: {state}"
            if state is JobState.RUNNING:
                self.records |= self.platforms[key[0]].records(run.job_id, handle.name)
                looked.append((key, hook, handle))
        if any(self.platforms[key[0]].image for key, _, _ in looked):  # a container: every one of the engine, now
            self.records |= _inspect_all(self.engine, self.since)
        for key, hook, handle in looked:
            state = hook.get_job_status(handle).state
            assert state is JobState.RUNNING, f"{key} job {handle.job_id} ended while it was looked at"
            with self._lock:
                del self._waiting[key]


@pytest.fixture(scope="module")
def started() -> float:
    """When this module's tests began: a container made before cannot hold their secrets (made for them); one that
    runs still might, and is inspected whatever its age."""
    return time.time() - 5  # the engine's creation times have whole seconds


def _inspect_all(engine: Any, since: float) -> dict[str, str]:
    """``docker inspect`` of every container on the engine this module's tests may have reached (job containers,
    Brev instances, Kubernetes pods, Lepton replicas -- and other sessions', which must not hold our secrets either:
    every running one and every one made since these tests began; the hundreds that earlier tests left exited would
    take longer to inspect than a job runs); a container's environment aside on the platforms whose runtime holds the
    job's environment (Kubernetes pods, Lepton replicas)."""
    texts = {}
    client = engine.client
    for summary in client.containers(all=True):
        if summary.get("State") != "running" and summary.get("Created", 0) < since:
            continue
        try:
            info = client.inspect_container(summary["Id"])
        except Exception:  # gone meanwhile
            continue
        labels = info["Config"].get("Labels") or {}
        if any(key.startswith(("kubefake", "leptonfake", "io.kubernetes")) for key in labels):
            info["Config"].pop("Env", None)
        texts[f"docker inspect {info['Name']}"] = json.dumps(info)
    return texts


def _readable_files_with(secrets: list[str], roots: list[Path]) -> list[str]:
    """Files under ``roots`` that users other than their owner may read and that hold one of ``secrets`` (the SLURM
    login node's shared folder, the docker daemon's results root, the fakes' volumes, every temporary folder of the
    session: all on this machine)."""
    found = []
    for root in roots:
        for path in root.rglob("*"):
            if any(part.startswith("leptonfake") for part in path.relative_to(root).parts[:1]):
                continue  # the fake server's own control files (its token is the server's): not this host's
            try:
                info = path.lstat()
                if not path.is_file() or path.is_symlink() or not info.st_mode & 0o044 or info.st_size > 1 << 24:
                    continue
                data = path.read_bytes()
            except OSError:
                continue
            found += [f"{path} ({oct(info.st_mode)})" for s in secrets if s.encode() in data]
    return found


def _sentinel_anywhere(platforms: dict[str, Platform], slurm: Any) -> list[str]:
    found = [f"this host: {SENTINEL}"] if Path(SENTINEL).exists() else []
    if on_login_node(slurm, f"test -e {SENTINEL}").returncode == 0:
        found.append(f"the SLURM login node: {SENTINEL}")
    return found


# --------------------------------------------------------------------------- the tests


SHAPES = ("argv", "string", "specs", "args")


@settings(
    max_examples=1,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: every example costs 24 real jobs
    suppress_health_check=list(HealthCheck),
)
@given(batch=batches())
def test_hostile_values_arrive_verbatim_and_no_secret_leaks(  # noqa: PLR0917
    batch: dict[str, Any],
    platforms: dict[str, Platform],
    docker_engine: Any,
    slurm_cluster: Any,
    kubefake: Any,
    lepton_server: Any,
    triggerer: Triggerer,
    tmp_path_factory: pytest.TempPathFactory,
    capfd: Any,
    started: float,
) -> None:
    """Every shape a value can come in (argv, one bash string, a spec file, args) on every platform: 24 jobs at
    once, watched together (each costs its platform's start and the job's hold, not the other jobs')."""
    capfd.readouterr()
    secrets = {S3_SECRET: "s3 secret key", AUTHOR_SECRET: "secret_env value"}
    secrets |= {v: k for p in platforms.values() for k, v in p.secrets.items()}
    watcher = Watcher(list(secrets))
    runs: dict[tuple[str, str], TaskRun] = {}
    wanted: dict[tuple[str, str], dict[str, str]] = {}
    records: dict[str, str] = {}
    results: dict[tuple[str, str], Any] = {}
    look = RunningLook(platforms, docker_engine, started)
    try:
        for shape in SHAPES:  # all submitted before any is waited for: their jobs run at the same time
            for name in PLATFORMS:
                op, context, want = _task(platforms[name], shape, batch)
                runs[name, shape] = _submit(triggerer, op, context)
                look.add((name, shape), runs[name, shape])
                wanted[name, shape] = _wanted(op, want)
        records = look.all_looked()
        for key, run in runs.items():
            results[key] = finish(run, timeout=RUNNING_TIMEOUT)
    finally:
        look.stop()
        watcher.stop()
        for run in runs.values():
            run.future.cancel()
    logged = capfd.readouterr()
    log = logged.out + logged.err

    for key, run in runs.items():
        said = rf"HOSTILE {run.job_id} (argv \w+ env \w+ spec \w+|secrets \w+|sentinel \w+)"
        lines = set(re.findall(said, log))
        want = wanted[key]
        assert f"argv {want['argv']} env {want['env']} spec {want['spec']}" in lines, (key, lines)
        assert f"secrets {want['secrets']}" in lines, (key, "the job did not get its secrets", lines)
        assert "sentinel False" in lines, (key, lines)
        assert results[key]["state"] == "Complete", (key, results[key])
    assert not _sentinel_anywhere(platforms, slurm_cluster)
    roots = [tmp_path_factory.getbasetemp(), slurm_cluster.results_root, kubefake.workdir]
    roots += list(lepton_server.volumes().values())  # (the docker platform's results root is a temporary folder)
    assert not _readable_files_with(list(secrets), [r for r in roots if r.exists()])
    assert watcher.samples > 10 and not watcher.found, sorted(set(watcher.found))

    places = dict(records)
    places["the task logs (operator and trigger)"] = log
    for key, run in runs.items():
        places[f"{key} serialized trigger"] = json.dumps(run.deferred.trigger.serialize())
        places[f"{key} XCom"] = json.dumps([c.kwargs for c in run.context["ti"].xcom_push.call_args_list], default=str)
        places[f"{key} result"] = json.dumps(results[key], default=str)
        places[f"{key} task_state_store"] = json.dumps(run.store.data, default=str)
    leaks = [
        f"{what} in {where}" for where, text in places.items() for secret, what in secrets.items() if secret in text
    ]
    assert not leaks, leaks


#: What no process can carry or no platform can name, by the field it goes in.
POISONS = {
    "nul": "\x00",
    "lone surrogate": "\ud800",
    "1 MiB": "x" * (1 << 20),
}


@st.composite
def refusals(draw: Any) -> tuple[str, str, dict[str, Any]]:
    """(the field the error must name, how, operator arguments that put one impossible value in it)."""
    value = draw(VALUE)
    poison = draw(st.sampled_from(sorted(POISONS)))
    bad = value + POISONS[poison] + value
    cases = {
        "command": {"command": ["python3", "-c", "pass", bad]},
        "command string": {"command": f"echo {shlex.quote(bad)}"},
        "env": {"env": {"HV": bad}},
        "env from params": {"env": {"HV": "{{ params.p }}"}, "params": bad},
        "specs": {"specs": {"hostile": [bad]}, "command": ["true"]},
        "args": {"args": {"a": bad}},
        "env name": {"env": {f"HV{value}=": "x"}},
        "job_name": {"job_name": f"x{value}"},
        "image": {"image": f"busybox{value}"},
    }
    where = draw(st.sampled_from(sorted(cases)))
    if where == "specs" and poison != "lone surrogate":  # a file carries NUL and 1 MiB: those arrive verbatim
        poison, cases[where] = "lone surrogate", {"specs": {"hostile": [value + "\udfff"]}, "command": ["true"]}
    field = {"command string": "command", "env from params": "env", "env name": "env"}.get(where, where)
    if where in ("env name", "job_name", "image"):  # no poison needed: a shell fragment is enough
        attack = draw(st.sampled_from(ATTACKS))
        poison = repr(attack[:12])
        cases[where] = {
            "env name": {"env": {f"HV{value}{attack}=": "x"}},
            "job_name": {"job_name": f"x{value}{attack}"},
            "image": {"image": f"busybox{value}{attack}"},
        }[where]
    return field, f"{where} ({poison})", cases[where]


@pytest.mark.parametrize("platform_name", PLATFORMS)
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=refusals())
def test_impossible_values_are_refused_before_anything_is_submitted(
    platform_name: str, case: tuple[str, str, dict[str, Any]], platforms: dict[str, Platform], slurm_cluster: Any
) -> None:
    field, what, arguments = case
    platform = platforms[platform_name]
    params = arguments.pop("params", None)
    kwargs = platform.operator_kwargs() | {"command": ["true"]} | arguments
    op = make_operator(**kwargs)
    context = make_context(Store(), 1, f"manual__{uuid.uuid4().hex[:10]}")
    context |= {"params": {"p": params}, "dag_run": SimpleNamespace(conf={}, run_id=context["ti"].run_id)}
    digest = hashlib.sha256(f"dag\ntrain\n{context['ti'].run_id}\n-1".encode()).hexdigest()[:10]
    _render(op, context)
    with pytest.raises(AirflowFailException, match="nothing was submitted") as refused:
        op.execute(context)
    message = str(refused.value)
    assert f"submitted: {field}" in message, (what, message)
    assert not [n for n in platform.names() if n.endswith(digest)], f"{platform_name} saw a job of the task"
    assert not context["ti"].xcom_push.called
    assert not _sentinel_anywhere(platforms, slurm_cluster)
