"""The Brev platform against what the real ``brev`` CLI (v0.6.327) does, as the fake models it: an API key
(``bak-...``) is a credential of its own, a Kubernetes service-account token on the worker is what brev
authenticates with first, and a network error that ends in ``EOF`` is an outage, never a refused token.

(OpenSSH's alias resolution from the private HOME is exercised by every test that runs a job here: the fake
resolves each alias with the real ``ssh -G``.)
"""

from __future__ import annotations

import json
import os
import time

import pytest

from airflow_provider_tao.hooks.base import ConnectionProblem
from airflow_provider_tao.hooks.brev import BrevHook, remote
from airflow_provider_tao.hooks.brev import auth as brev_auth
from airflow_provider_tao.hooks.brev.cli import BrevError
from airflow_provider_tao.jobs import ErrClass, JobSpec
from tests.brevfake.control import BrevWorld
from tests.integration.brev.conftest import CONN_ID, brev_connection

pytestmark = [pytest.mark.integration]
#: A Kubernetes service-account token's first two parts (RS256; iss kubernetes.default.svc, exp in 2100).
_K8S_JWT_HEAD = "eyJhbGciOiJSUzI1NiIsImtpZCI6ImsifQ"
_K8S_JWT_CLAIMS = "eyJpc3MiOiJodHRwczovL2t1YmVybmV0ZXMuZGVmYXVsdC5zdmMiLCJleHAiOjQxMDI0NDQ4MDB9"
_ORIGIN = {"dag_id": "dag", "task_id": "train", "run_id": "manual__1", "map_index": "-1"}


def test_an_api_key_connection_works_in_the_keys_org(brev_world: BrevWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    brev_world.create_instance("box")
    conn = json.loads(brev_connection(brev_world, org_id=brev_world.org["id"]))
    monkeypatch.setenv("AIRFLOW_CONN_TAO_BREV_KEY", json.dumps({**conn, "password": brev_world.api_key}))
    hook = BrevHook("tao_brev_key")
    assert hook.probe_connection() == f"brev answers: 1 instance(s) in org {brev_world.org['name']}, 1 running"
    answer = hook.session.exec("box", "echo from-$(hostname -s)", 60)
    assert answer.text.startswith("from-"), answer.describe()
    seen = {call["credentials"]["state"] for call in brev_world.calls()}
    assert seen == {"apikey"}, seen  # stored as brev login --api-key does; never `brev set` (the key has its org)
    assert hook.session.relogins == 0


def test_a_kubernetes_service_account_token_on_the_worker_is_told_before_any_call(
    brev_world: BrevWorld, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    home = tmp_path_factory.mktemp("home")
    brev_world.login(home)
    assert brev_world.run("ls", "--json", home=home).returncode == 0
    mounted = brev_world.mount_service_account_token(f"{_K8S_JWT_HEAD}.{_K8S_JWT_CLAIMS}.c2ln")
    # the fake CLI now uses it before the credentials it was logged in with, as GetAuthTokens does
    refused = brev_world.run("ls", "--json", home=home)
    assert refused.returncode == 1, refused.stdout
    monkeypatch.setattr(brev_auth, "SERVICE_ACCOUNT_TOKEN", mounted)
    since = len(brev_world.calls())
    with pytest.raises(ConnectionProblem) as told:
        BrevHook(CONN_ID).probe_connection()
    assert told.value.kind == "config" and "automountServiceAccountToken: false" in str(told.value)
    assert brev_world.calls()[since:] == []  # nothing was called with the wrong token


def test_a_network_eof_is_an_outage_never_a_refused_token(brev_world: BrevWorld) -> None:
    hook = BrevHook(CONN_ID)
    hook.session.instances()  # logged in, org selected
    brev_world.api_errors(1, status=0, reason="EOF")
    with pytest.raises(BrevError) as outage:
        hook.session.instances()
    assert outage.value.err_class is ErrClass.ERR_INFRA, outage.value
    assert 'Get "https://' in str(outage.value) and hook.session.relogins == 0
    assert brev_world.instances() == [] and hook.session.instances() == {}  # the next call after the blip works


@pytest.mark.parametrize("startup_user", ["ubuntu", "root"])
def test_an_instance_whose_worker_died_right_after_create_is_reaped_whoever_ran_its_startup_script(
    brev_world: BrevWorld, startup_user: str
) -> None:
    # Which user Brev runs the startup script as is unknown: the fake does each.
    brev_world.set_startup_user(startup_user)
    hook = BrevHook(CONN_ID)
    spec = JobSpec(name="dag-train-0a1b2c3d4e", job_id="j0a1b2c3d4", command="true", image="x:1", origin=_ORIGIN)
    # What create_job does up to `brev create` -- and then its worker dies: no exec ever wrote the exec user's lease.
    hook.session.create(spec.name, ["g5.xlarge"], remote.startup_script(hook._lease(spec, {}, 1)))
    brev_world.wait_status(spec.name, "RUNNING")
    deadline = time.monotonic() + 180
    while brev_world.exec_in(spec.name, "test -f /var/lib/brevfake/startup-done", user="root")[0] != 0:
        assert time.monotonic() < deadline, "the startup script did not run"
        time.sleep(0.1)
    decisions = {d.instance: d for d in hook.reap(task_state=lambda lease: "failed")}
    assert decisions[spec.name].action == "deleted", decisions[spec.name]
    assert "is failed" in decisions[spec.name].reason


def test_the_fake_reaches_instances_only_through_openssh_resolution(
    brev_world: BrevWorld, tmp_path_factory: pytest.TempPathFactory
) -> None:
    brev_world.create_instance("box")
    home = tmp_path_factory.mktemp("home")
    brev_world.login(home)
    # brev wrote the alias under $HOME; OpenSSH reads the passwd home's config: the alias is unknown
    bare = brev_world.run("exec", "box", "echo hi", home=home, env={"PATH": os.environ["PATH"]})
    assert bare.returncode == 1 and "Could not resolve hostname box" in bare.stderr, bare.stderr
    assert (home / ".ssh" / "config").read_text().startswith(f'Include "{home}/.brev/ssh_config"')
    # a user whose HOME is their passwd home (the world's ssh wrappers give OpenSSH $HOME/.ssh/config)
    done = brev_world.run("exec", "box", "echo hi", home=home)
    assert (done.returncode, done.stdout) == (0, "hi\nbox\n"), done.stderr
