"""How the kubernetes hook reads a pod's log, through the REAL ``kubernetes`` and ``kubernetes_asyncio`` API classes
(their generated ``read_namespaced_pod_log`` checks every keyword against its declared parameters) down to the HTTP
call, which a pod log as the kubelet serves it answers: no server, no clock of ours, milliseconds per test."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_tao.hooks.base import LOG_READ_LIMIT
from airflow_provider_tao.hooks.kubernetes import TAOKubernetesHook
from airflow_provider_tao.hooks.kubernetes.logs import LOG_READ_BYTES, OVERLAP_SECONDS, SKIPPED_NOTE
from airflow_provider_tao.jobs import JobHandle

POD = "job-0-abcde"


class PodLog:
    """One container's log as the kubelet serves it (k8s.io/kubernetes pkg/kubelet/kuberuntime/logs ``ReadLogs``):
    lines stamped by the node's clock (``skew`` seconds ahead of ours); ``sinceSeconds`` back from the node's now,
    ``tailLines`` from the end, then ``limitBytes`` of the output, timestamps included."""

    def __init__(self, skew: float = 0.0) -> None:
        self.skew = skew
        self.lines: list[tuple[float, str]] = []
        self.reads: list[dict[str, Any]] = []
        self.refusal: Exception | None = None

    def write(self, *texts: str) -> None:
        self.lines += [(time.time() + self.skew, text) for text in texts]

    def serve(self, query: dict[str, Any]) -> bytes:
        if self.refusal is not None:
            raise self.refusal
        lines = self.lines
        if "sinceSeconds" in query:
            lines = [line for line in lines if line[0] >= time.time() + self.skew - int(query["sinceSeconds"])]
        if "tailLines" in query:
            lines = lines[-int(query["tailLines"]) :] if int(query["tailLines"]) else []
        data = b"".join(f"{_stamp(t)} {text}\n".encode() for t, text in lines)
        data = data[: int(query["limitBytes"])] if "limitBytes" in query else data
        self.reads.append({**query, "bytes": len(data)})
        return data


def _stamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 1e9):09d}Z"


@pytest.fixture
def handle() -> JobHandle:
    return JobHandle(platform="kubernetes", conn_id="k8s_logs", job_id="abc123", name="job")


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch, handle: JobHandle) -> TAOKubernetesHook:
    monkeypatch.setenv("AIRFLOW_CONN_K8S_LOGS", '{"conn_type": "tao_kubernetes", "extra": {"namespace": "train"}}')
    hook = TAOKubernetesHook("k8s_logs")
    hook._log_pods[handle.job_id] = POD  # the poll named rank 0's pod
    return hook


def _wire(hook: TAOKubernetesHook, log: PodLog, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real clients' API classes over ``log``: only ``ApiClient.call_api`` (the HTTP request) is replaced."""
    from kubernetes import client as sync_client
    from kubernetes_asyncio import client as async_client

    def call_api(path: str, method: str, path_params: dict[str, Any], query: list[Any], *a: Any, **k: Any) -> Any:
        assert (path_params["name"], path_params["namespace"]) == (POD, "train")
        return SimpleNamespace(data=log.serve(dict(query)))

    class Answer:
        status = 200

        def __init__(self, data: bytes) -> None:
            self.data = data

        async def read(self) -> bytes:
            return self.data

        def release(self) -> None:
            return None

    async def acall_api(
        path: str, method: str, path_params: dict[str, Any], query: list[Any], *a: Any, **k: Any
    ) -> Any:
        return Answer(log.serve(dict(query)))

    sync_api = sync_client.ApiClient()
    monkeypatch.setattr(sync_api, "call_api", call_api)
    hook.__dict__["api_client"] = sync_api
    async_api = object.__new__(async_client.ApiClient)  # no session: its call_api is the only thing used
    async_api.client_side_validation = True
    async_api.call_api = acall_api  # type: ignore[method-assign]
    hook._aclient = async_api


def _reader(hook: TAOKubernetesHook, handle: JobHandle, kind: str) -> Any:
    if kind == "sync":
        return lambda cursor: hook.get_job_logs(handle, cursor)
    return lambda cursor: asyncio.run(hook.aget_job_logs(handle, cursor))


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("skew", [0.0, OVERLAP_SECONDS - 0.5])
def test_a_log_is_followed_across_reads_without_a_line_lost_or_repeated(
    hook: TAOKubernetesHook, handle: JobHandle, monkeypatch: pytest.MonkeyPatch, kind: str, skew: float
) -> None:
    """Each read after the first asks for the last seconds (``since_seconds``: neither client has ``since_time``),
    bounded, and drops what the cursor has seen; a node clock ahead of ours within the overlap loses nothing."""
    log = PodLog(skew)
    _wire(hook, log, monkeypatch)
    read = _reader(hook, handle, kind)
    shown, cursor = "", ""
    for batch in range(5):
        log.write(*(f"epoch {batch} step {i}" for i in range(7)))
        text, cursor = read(cursor)
        shown += text
    text, cursor = read(cursor)  # the final read, once the job has ended
    assert shown + text == "".join(f"epoch {b} step {i}\n" for b in range(5) for i in range(7))
    assert all(r["limitBytes"] == LOG_READ_BYTES and "sinceTime" not in r for r in log.reads), log.reads
    assert "sinceSeconds" not in log.reads[0] and all("sinceSeconds" in r for r in log.reads[1:])


def test_a_job_that_writes_faster_than_one_read_is_followed_by_tail_and_says_lines_were_skipped(
    hook: TAOKubernetesHook, handle: JobHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3 MiB in one second: no bounded read by time gets past the first MiB again, so the reader jumps to the newest
    lines (saying so), stays on them while a read by time would not fit, and no read downloads more than its bound."""
    log = PodLog()
    _wire(hook, log, monkeypatch)
    log.write(*(f"burst {i:06d} " + "x" * 90 for i in range(30_000)))
    shown: list[str] = []
    text, cursor = hook.get_job_logs(handle, "")
    shown += text.splitlines()
    text, cursor = hook.get_job_logs(handle, cursor)
    shown += text.splitlines()
    assert SKIPPED_NOTE.format(limit=LOG_READ_BYTES) in shown and shown[-1].startswith("burst 029999")
    log.write("after the burst")
    for _ in range(2):  # the next reads are by tail, and find the new line once
        text, cursor = hook.get_job_logs(handle, cursor)
        shown += text.splitlines()
    numbers = [int(line.split()[1]) for line in shown if line.startswith("burst")]
    assert numbers == sorted(set(numbers)) and shown.count("after the burst") == 1
    assert all(0 < r["limitBytes"] <= LOG_READ_LIMIT and r["bytes"] <= r["limitBytes"] for r in log.reads)
    assert len(log.reads) <= 5  # one read per call, two when the reader had to jump


def test_a_failed_log_read_the_log_path_does_not_expect_is_a_warning_once_and_raised(
    hook: TAOKubernetesHook, handle: JobHandle, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from kubernetes.client.exceptions import ApiException

    log = PodLog()
    _wire(hook, log, monkeypatch)
    waiting = ApiException(status=400, reason="Bad Request")
    waiting.body = b'{"message": "container \\"tao\\" in pod \\"x\\" is waiting to start: ContainerCreating"}'
    log.refusal = waiting
    cursor = "2026-11-26T10:00:00.000000000Z#1"
    assert hook.get_job_logs(handle, cursor) == ("", cursor)  # not started yet: no new lines, no warning
    log.refusal = ApiException(status=500, reason="Internal Server Error")
    for _ in range(3):
        with pytest.raises(ApiException):
            hook.get_job_logs(handle, "")
    logged = capfd.readouterr()
    assert (logged.out + logged.err).count("Reading the log of job abc123 failed: (500)") == 1, logged


def test_after_a_burst_of_long_lines_the_reader_still_shows_every_new_line_within_two_reads_a_call(
    hook: TAOKubernetesHook, handle: JobHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newest lines by tail may not fit in a read either (long lines): the reader asks for fewer until they do,
    at most two reads a call, and remembers how many fit (in the cursor) for the next call."""
    log = PodLog()
    _wire(hook, log, monkeypatch)
    log.write(*(f"long {i:05d} " + "y" * 1500 for i in range(3000)))  # 4.5 MB at once
    shown, cursor, reads = [], "", []
    for n in range(8):
        before = len(log.reads)
        text, cursor = hook.get_job_logs(handle, cursor)
        reads.append(len(log.reads) - before)
        shown += text.splitlines()
        log.write(f"slow {n}")
    text, cursor = hook.get_job_logs(handle, cursor)
    shown += text.splitlines()
    assert [line for line in shown if line.startswith("slow")] == [f"slow {n}" for n in range(8)]
    numbers = [int(line.split()[1]) for line in shown if line.startswith("long")]
    assert numbers == sorted(set(numbers)) and max(reads) <= 2, reads
    assert all(r["bytes"] <= LOG_READ_BYTES for r in log.reads)
