"""The Brev platform against five more things the real ``brev`` CLI (brev-cli v0.6.327) does, as the fake now models
them (issue 32 points 3, 5, 6, 8, 9): ``brev start`` refuses a STOPPING instance, ``brev copy``'s probe panics on an
ssh failure without a newline, ``refresh`` downloads cloudflared into ``~/.brev``, ``ls`` hides other users'
instances, and a JWT whose ``alg`` golang-jwt refuses is no access token."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from airflow_provider_tao.hooks.brev import BrevHook
from airflow_provider_tao.hooks.brev import cli as brev_cli
from airflow_provider_tao.hooks.brev.cli import BrevError
from airflow_provider_tao.jobs import ErrClass
from tests.brevfake.control import BrevWorld
from tests.integration.brev.conftest import CONN_ID, brev_connection

pytestmark = [pytest.mark.integration]


def test_a_stopping_instance_is_started_once_it_is_stopped(brev_world: BrevWorld) -> None:
    """``startStopppedWorkspace`` refuses all but STOPPED (``Instance is not stopped status=STOPPING``)."""
    brev_world.create_instance("box")
    # STOPPING lasts until the test ends it: a loaded machine must not reach STOPPED before our refused start
    brev_world.set_time_scale(brev_world.world.time_scale(), stop=10**6)
    hook = BrevHook(CONN_ID)
    hook.session.check(["stop", "box"], 60, "stopping box")
    listing = hook.session.instances()
    assert listing["box"]["status"] == "STOPPING", listing
    refused = hook.session.call(["start", "box", "--detached"], 60)
    assert refused.returncode == 1 and "Instance is not stopped status=STOPPING" in refused.stderr
    brev_world.finish_transition("box")
    name, entry = hook._reused_instance("box", listing)
    assert (name, entry["status"]) == ("box", "RUNNING")
    starts = [c for c in brev_world.calls("start")]
    assert [c["exit"] for c in starts] == [1, 0], starts  # ours, then the hook's once STOPPED


def test_a_copy_whose_probe_panics_is_an_outage_tried_again(
    brev_world: BrevWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``copy.go`` ``waitForSSHToBeAvailable`` indexes ``strings.Split(out, "\\n")[1]`` unchecked: an ssh failure
    with no output makes the CLI panic (exit 2, a goroutine trace). Nothing is known about the instance: retried."""
    monkeypatch.setattr(brev_cli, "COPY_PANIC_PAUSE", 0.0, raising=False)
    brev_world.create_instance("box")
    local = tmp_path / "stage.tar"
    local.write_bytes(b"archive")
    hook = BrevHook(CONN_ID)
    brev_world.not_ready("box", 1, kind="silent")
    hook.session.copy(local, "box", "stage.tar", 120)
    copies = [c for c in brev_world.calls("copy")]
    assert [c["exit"] for c in copies] == [2, 0], copies
    assert copies[0]["stderr"].startswith("panic: runtime error: index out of range [1] with length 1\n")
    assert "pkg/cmd/copy/copy.go:264" in copies[0]["stderr"]
    assert brev_world.exec_in("box", "cat ~/stage.tar")[1] == "archive"
    brev_world.not_ready("box", brev_cli.COPY_PANIC_TRIES, kind="silent")
    with pytest.raises(BrevError) as crashed:
        hook.session.copy(local, "box", "stage.tar", 120)
    assert crashed.value.err_class is ErrClass.ERR_INFRA and "panic: runtime error" in str(crashed.value)
    assert "goroutine" not in str(crashed.value)


def test_cloudflared_is_downloaded_once_per_connection_or_taken_from_its_path(
    brev_world: BrevWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``RunRefresh`` -> ``DownloadCloudflaredBinaryIfItDNE`` into ``~/.brev``: each process has its own home, the
    connection keeps one cloudflared for all of them; offline, a configured one does."""
    # two task processes of one connection (live pids: a dead one's home is swept away)
    for pid in (os.getpid(), os.getppid()):
        monkeypatch.setattr(os, "getpid", lambda pid=pid: pid)
        hook = BrevHook(CONN_ID)
        hook.session.check(["refresh"], 60, "brev refresh")
        assert (hook.session.home / ".brev" / "cloudflared").is_file()
    assert len(brev_world.cloudflared_downloads()) == 1, brev_world.cloudflared_downloads()
    brev_world.go_offline()
    monkeypatch.setattr(os, "getpid", lambda: 1)
    monkeypatch.setenv("AIRFLOW_CONN_TAO_BREV_FRESH", brev_connection(brev_world))
    with pytest.raises(BrevError) as offline:
        BrevHook("tao_brev_fresh").session.check(["refresh"], 60, "brev refresh")
    assert "github.com" in str(offline.value) and "cloudflared_path" in str(offline.value)
    installed = tmp_path / "cloudflared"
    installed.write_text("#!/bin/sh\n")
    installed.chmod(0o755)
    monkeypatch.setenv("AIRFLOW_CONN_TAO_BREV_GAPPED", brev_connection(brev_world, cloudflared_path=str(installed)))
    BrevHook("tao_brev_gapped").session.check(["refresh"], 60, "brev refresh")
    assert len(brev_world.cloudflared_downloads()) == 1


def test_a_teammates_instance_is_no_instance_and_the_task_says_why(brev_world: BrevWorld) -> None:
    """``ls`` shows the user's own instances (``FilterForUserWorkspaces``, ``Workspace.CanShow``)."""
    teammate = brev_world.state()["other_users"][0]["id"]
    brev_world.create_instance("their-box", owner=teammate)
    hook = BrevHook(CONN_ID)
    listing = hook.session.instances()
    assert "their-box" not in listing
    with pytest.raises(BrevError) as told:
        hook._reused_instance("their-box", listing)
    assert told.value.err_class is ErrClass.ERR_CONFIG and "teammate" in str(told.value)


def test_a_jwt_without_alg_is_no_access_token_for_brev_nor_for_the_hook(
    brev_world: BrevWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = base64.urlsafe_b64encode(json.dumps({"typ": "JWT"}).encode()).decode().rstrip("=")
    token = f"{head}.{brev_world.jwt().split('.')[1]}.c2ln"
    done = brev_world.run("login", "--token", token, home=tmp_path)
    saved = json.loads((tmp_path / ".brev" / "credentials.json").read_text())
    assert saved["refresh_token"] == token and saved["access_token"] == "auto-login"  # not an access token
    assert done.returncode == 1, done.stderr  # and brev cannot use it
    conn = json.loads(brev_connection(brev_world))
    monkeypatch.setenv("AIRFLOW_CONN_TAO_BREV_NOALG", json.dumps({**conn, "password": token}))
    since = len(brev_world.calls())
    with pytest.raises(BrevError) as told:
        BrevHook("tao_brev_noalg").session.instances()
    assert told.value.err_class is ErrClass.ERR_AUTH and "alg" in str(told.value)
    assert brev_world.calls()[since:] == []
