"""What the real ``brev`` CLI (brevdev/brev-cli v0.6.327) and the programs it runs do, against the Brev platform's
session and rules: OpenSSH's alias resolution from a private HOME, the Kubernetes service-account token brev prefers
to its credentials file, API-key credentials, and the CLI's words for a bad instance type or a network error.

The ssh resolution is the real OpenSSH client's (``ssh -G``, and ``scp`` with the fake's resolving shim as its ssh
program), exactly as the fake ``brev`` resolves an alias (``tests/brevfake/instances.py``).
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.hooks.brev import auth as brev_auth
from airflow_provider_tao.hooks.brev import hook as bv
from airflow_provider_tao.hooks.brev import remote
from airflow_provider_tao.hooks.brev.auth import credentials_for
from airflow_provider_tao.hooks.brev.cli import BrevError, BrevSession, create_failure
from airflow_provider_tao.jobs import ErrClass, JobHandle
from tests.brevfake import instances
from tests.unit.test_hooks_brev import Instance, ScriptedSession, _hook, _result, _spec, _staged

TOKEN = "brev-secret-token-0123456789"


def _session(tmp_path: Path, token: str = TOKEN, org: str | None = None, **kwargs: str) -> BrevSession:
    BrevSession._states.clear()
    return BrevSession(
        executable=str(tmp_path / "brev"), token=token, org=org, identity="c", home_root=tmp_path / "homes", **kwargs
    )


def _brev_refresh(home: Path, alias: str, ip: str) -> None:
    """What ``brev refresh`` writes (pkg/ssh/sshconfigurer.go): ``~/.brev/ssh_config`` with the alias, and an
    ``Include`` of it at the top of ``~/.ssh/config`` -- both under ``$HOME``."""
    (home / ".brev").mkdir(exist_ok=True)
    (home / ".brev" / "ssh_config").write_text(
        f'Host {alias}\n  Hostname {ip}\n  IdentityFile "{home}/.brev/brev.pem"\n  User ubuntu\n'
        "  ControlMaster auto\n  ControlPath ~/.ssh/brev-control-%C\n  ControlPersist 10m\n"
    )
    (home / ".ssh").mkdir(mode=0o700, exist_ok=True)
    (home / ".ssh" / "config").write_text(f'Include "{home}/.brev/ssh_config"\n')


def test_ssh_and_scp_run_by_brev_find_the_alias_it_wrote_in_the_private_home(tmp_path: Path) -> None:
    session = _session(tmp_path)
    session.login()
    env = session.environment()
    _brev_refresh(session.home, "my-gpu", "10.9.8.7")
    # OpenSSH reads the passwd home's config, not $HOME's: a bare `ssh` does not know the alias
    bare = {**env, "PATH": os.environ["PATH"]}
    assert instances.openssh_resolve(["my-gpu"], bare)["hostname"] == "my-gpu"
    # brev exec (bash -c "... ssh ...") and its readiness probe (exec.Command("ssh", ...)): the ssh on PATH
    resolved = instances.openssh_resolve(["-T", "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR", "my-gpu"], env)
    assert resolved["hostname"] == "10.9.8.7"
    # the multiplexing sockets stay in the private HOME, never in the worker user's ~/.ssh
    assert resolved["controlpath"].startswith(f"{session.home}/")
    # brev copy: exec.Command("scp", ...), whose ssh is /usr/bin/ssh (not PATH's): it must get -F from scp
    assert instances.scp_resolve("my-gpu", upload=True, env=env)["hostname"] == "10.9.8.7"
    assert instances.scp_resolve("my-gpu", upload=True, env=bare)["hostname"] == "my-gpu"


@pytest.mark.parametrize("program", ["ssh", "scp"])
def test_the_wrappers_hold_no_secret_and_only_their_user_reads_them(tmp_path: Path, program: str) -> None:
    session = _session(tmp_path)
    session.login()
    wrapper = session.home / ".tao-bin" / program
    assert wrapper.stat().st_mode & 0o777 == 0o700
    assert TOKEN not in wrapper.read_text()


# --------------------------------------------------------------------------- credentials (brev_auth)


def test_an_api_key_is_stored_as_brev_login_api_key_does_and_needs_its_org_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "bak-0123456789abcdef"
    assert credentials_for(key, "org-42") == {
        "access_token": "",
        "refresh_token": "",
        "api_key": key,
        "api_key_org_id": "org-42",
    }
    with pytest.raises(BrevError) as refused:
        _session(tmp_path, token=key).login()
    assert refused.value.err_class is ErrClass.ERR_CONFIG and "org_id" in str(refused.value)
    hook = _hook(monkeypatch)
    monkeypatch.setenv("AIRFLOW_CONN_BREV_T", json.dumps({"conn_type": "tao_brev", "password": key}))
    with pytest.raises(JobValidationError, match="org_id"):
        bv.BrevHook("brev_t").validate_spec(_spec())
    hook.validate_spec(_spec())  # a login token needs no org id


def test_a_kubernetes_service_account_token_is_told_before_any_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mounted = tmp_path / "serviceaccount" / "token"
    monkeypatch.setattr(brev_auth, "SERVICE_ACCOUNT_TOKEN", mounted)
    assert brev_auth.service_account_problem() is None
    mounted.parent.mkdir()
    mounted.write_text("")
    assert brev_auth.service_account_problem() is None  # empty: brev reads credentials.json (GetAuthTokens)
    mounted.write_text("eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiJrdWJlcm5ldGVzIn0.c2ln")
    with pytest.raises(BrevError) as told:
        _session(tmp_path).login()
    assert told.value.err_class is ErrClass.ERR_CONFIG
    assert str(mounted) in str(told.value) and "automountServiceAccountToken: false" in str(told.value)


# --------------------------------------------------------------------------- the CLI's words


def test_an_invalid_or_unavailable_type_is_a_configuration_error_without_failover() -> None:
    said = (
        "Trying g5.xlarge for 1 instance(s)...\n[Worker 1] Trying g5.xlarge for instance 'x'...\n"
        "[Worker 1] g5.xlarge Failed: instance type \"g5.xlarge\" is invalid or unavailable; run 'brev search' to "
        "see available types\n\nWarning: Only created 0/1 instances\n"
    )
    failure = create_failure(_result(stderr=said, code=1), ["g5.xlarge"])
    assert failure.err_class is ErrClass.ERR_CONFIG and "g5.xlarge" in str(failure)


# --------------------------------------------------------------------------- find_job


def _find_answer(instance: str, command: str) -> bytes | None:
    return None if instance == "silent-box" else b""


def test_find_job_asks_only_the_instances_that_can_hold_the_tasks_job(monkeypatch: pytest.MonkeyPatch) -> None:
    listing = {
        "other-task-0123456789": {"status": "RUNNING"},  # another task's own instance: never its job
        "shared-box": {"status": "RUNNING"},
        "stopped-box": {"status": "STOPPED"},
    }
    session = ScriptedSession(listing, _find_answer)
    assert _hook(monkeypatch, session).find_job("dag-train-abcdef0123") is None
    assert [call for call in session.calls if call[0] == "exec"] == [("exec", "shared-box")]
    with pytest.raises(JobValidationError, match="instance_id"):
        _hook(monkeypatch).validate_spec(_spec(backend_details={"instance_id": "other-task-0123456789"}))


def test_find_job_never_turns_an_error_into_no_job(monkeypatch: pytest.MonkeyPatch) -> None:
    silent = ScriptedSession({"shared-box": {"status": "RUNNING"}, "silent-box": {"status": "RUNNING"}}, _find_answer)
    with pytest.raises(BrevError) as outage:
        _hook(monkeypatch, silent).find_job("dag-train-abcdef0123")
    assert outage.value.err_class is ErrClass.ERR_INFRA
    for err_class in (ErrClass.ERR_AUTH, ErrClass.ERR_INFRA):
        refused = ScriptedSession({}, _find_answer)
        monkeypatch.setattr(refused, "instances", _raises(BrevError(err_class, "no answer")))
        with pytest.raises(BrevError):
            _hook(monkeypatch, refused).find_job("dag-train-abcdef0123")


def _raises(exc: Exception) -> Any:
    def call(*_args: Any, **_kwargs: Any) -> Any:
        raise exc

    return call


def test_one_listing_without_a_starting_instance_is_not_yet_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([{}, {"box": {"status": "RUNNING"}}])

    class Flickering(ScriptedSession):
        def instances(self, timeout: float = 0) -> dict[str, dict[str, Any]]:
            self.listing = next(answers, self.listing)
            return super().instances(timeout)

    session = Flickering({}, lambda instance, command: b"DOCKER 20.10.24\n")
    monkeypatch.setattr(bv.time, "sleep", lambda seconds: None)
    assert _hook(monkeypatch, session)._wait_ready("box", None)["status"] == "RUNNING"
    gone = Flickering({}, lambda instance, command: None)
    answers = iter([{}, {}])
    with pytest.raises(BrevError, match="disappeared"):
        _hook(monkeypatch, gone)._wait_ready("box", None)


# --------------------------------------------------------------------------- issue 22 hole 3: check, then act


@pytest.fixture
def stand_in(tmp_path: Path) -> Instance:
    """An instance's home and a stand-in ``docker``, the remote scripts run by a real ``sh``."""
    return Instance(tmp_path)


def test_a_stop_decided_by_an_older_try_leaves_the_newer_tries_job_running(stand_in: Instance) -> None:
    """The old try's cancel passed its ownership check, then a clear's new try claimed the job before the stop
    arrived: the stop re-reads the marks on the instance right before it acts, and leaves the container alone."""
    _staged(stand_in, ngc_key=None)  # owner_try 2
    stand_in.run(remote.launch("a1b2c3"))
    stand_in.run(remote.write_mark("a1b2c3", "cancel_requested_by", 1))  # try 1's cancel, decided earlier
    answer = stand_in.run(remote.stop("a1b2c3", 0))
    assert answer is not None and remote.parse_probe(answer).kept == {"a1b2c3"}
    assert not [call for call in stand_in.docker_calls() if call[:1] == ["stop"]]
    stand_in.run(remote.write_mark("a1b2c3", "cancel_requested_by", 2))  # the owner's own cancel
    answer = stand_in.run(remote.stop("a1b2c3", 0))
    assert answer is not None and remote.parse_probe(answer).kept == set()
    assert [call for call in stand_in.docker_calls() if call[:1] == ["stop"]]


def test_a_cancel_the_instance_refuses_keeps_the_tasks_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    session = ScriptedSession({"dag-train-0123456789": {"status": "RUNNING"}}, lambda i, c: b"KEPT j1 3\n")
    hook = _hook(monkeypatch, session)
    assert hook._cancel(JobHandle("brev", "brev_t", "j1", "dag-train-0123456789", "dag-train-0123456789")) is False
    assert not [call for call in session.calls if call[0] == "delete"]


# --------------------------------------------------------------------------- issue 32: listing, JWT alg


def test_a_type_listing_brev_could_not_read_is_an_outage_not_no_capacity() -> None:
    """``newCreateContext`` only warns when ``alltypesavailable`` fails; ``createWorkspace`` then refuses every
    type with "(instance-type listing was unavailable); please retry" (brev-cli v0.6.327 gpucreate.go)."""
    said = (
        "Warning: could not fetch instance types with workspace groups: 502 Bad Gateway\n"
        "Trying g5.xlarge for 1 instance(s)...\n[Worker 1] Trying g5.xlarge for instance 'x'...\n"
        '[Worker 1] g5.xlarge Failed: could not resolve workspace group for "g5.xlarge" (instance-type listing '
        "was unavailable); please retry\n\nWarning: Only created 0/1 instances\n"
    )
    failure = create_failure(_result(stderr=said, code=1), ["g5.xlarge"])
    assert failure.err_class is ErrClass.ERR_INFRA and failure.err_class.retriable, failure
    assert "no capacity" not in str(failure) and "instance types" in str(failure)


def _token(header: dict[str, Any]) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part(header)}.{part({'exp': 4102444800, 'sub': 'u'})}.c2ln"


@pytest.mark.parametrize("header", [{"typ": "JWT"}, {"alg": "XS999"}, {"alg": 5}])
def test_a_jwt_whose_alg_brev_refuses_is_an_auth_error_before_any_call(tmp_path: Path, header: dict[str, Any]) -> None:
    """golang-jwt v5.3.0 ``ParseUnverified`` (brev's ``isAccessTokenValid``) refuses a header without ``alg`` or
    with one it has no signing method for: brev would keep the token as a malformed refresh token and log out."""
    session = _session(tmp_path, token=_token(header))
    with pytest.raises(BrevError) as told:
        session.login()
    assert told.value.err_class is ErrClass.ERR_AUTH and "alg" in str(told.value), told.value
    assert not session.home.exists()  # nothing written, brev never ran


@pytest.mark.parametrize("alg", ["RS256", "ES256", "EdDSA", "none"])
def test_a_jwt_with_an_alg_brev_knows_is_its_access_token(alg: str) -> None:
    token = _token({"alg": alg, "typ": "JWT"})
    assert brev_auth.token_problem(token) is None
    assert credentials_for(token) == {"access_token": token, "refresh_token": "auto-login"}
