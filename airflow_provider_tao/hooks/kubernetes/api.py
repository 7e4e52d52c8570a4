"""The Kubernetes API: the provider's sync and async clients, one call each, answers as plain Python."""

from __future__ import annotations

import contextlib
import time
from functools import cached_property
from typing import Any

from airflow_provider_tao.hooks.base import TAOPlatformHook
from airflow_provider_tao.hooks.shared import container as ct

DEFAULT_NAMESPACE = "default"
#: How long an exec-auth client (EKS, GKE tokens) is used before it is rebuilt with a fresh token.
EXEC_AUTH_REFRESH_SECONDS = 600.0


def _decode(data: bytes | None) -> Any:
    """An API answer as plain Python. msgspec (an Airflow dependency) parses a namespace's Job list about five times
    faster than ``json``; that parse is most of a poll's CPU."""
    import msgspec

    return msgspec.json.decode(data or b"null")


class KubernetesAPIHook(TAOPlatformHook):
    """The clients of a ``tao_kubernetes`` connection and the calls every part of the hook makes through them."""

    def __init__(self, conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(conn_id, **kwargs)
        self._log_pods: dict[str, str] = {}  # job id -> the pod whose log is the job's (rank 0), from the last poll
        self._log_warned: set[str] = set()  # log read failures already warned about (once each)
        self._aclient: Any = None
        self._aclient_stack: contextlib.AsyncExitStack | None = None
        self._aclient_born = 0.0
        self._aclient_refresh = False

    @property
    def namespace(self) -> str:
        self.load_connection()
        return str(self.setting("namespace", DEFAULT_NAMESPACE))

    def _int_setting(self, name: str, default: int) -> int:
        self.load_connection()
        return int(float(self.setting(name, default)))

    @cached_property
    def api_client(self) -> Any:
        """The provider's ``KubernetesHook`` client (kubeconfig file, inline kubeconfig or in-cluster)."""
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        self.load_connection()
        return KubernetesHook(conn_id=self.conn_id, kubernetes_conn_id=None).api_client

    def _api(self, group: str) -> Any:
        from kubernetes import client

        return client.BatchV1Api(self.api_client) if group == "batch" else client.CoreV1Api(self.api_client)

    def _call(self, group: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """One API call; the answer as parsed JSON (or bytes for logs). Errors raise ``ApiException``."""
        response = getattr(self._api(group), method)(*args, _preload_content=False, **kwargs)
        return response.data if method.endswith("_log") else _decode(response.data)

    async def _aapi(self, group: str) -> Any:
        from kubernetes_asyncio import client

        if (
            self._aclient is not None
            and self._aclient_refresh
            and time.monotonic() - self._aclient_born > (EXEC_AUTH_REFRESH_SECONDS)
        ):
            await self.aclose()  # an exec-auth token (EKS, GKE) expires: a new client asks for a new one
        if self._aclient is None:
            from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook

            await self.aload_connection()
            hook = AsyncKubernetesHook(conn_id=self.conn_id, kubernetes_conn_id=None, connection_extras=self._extras)
            stack = contextlib.AsyncExitStack()
            self._aclient = await stack.enter_async_context(hook.get_conn())
            self._aclient_stack, self._aclient_born = stack, time.monotonic()
            self._aclient_refresh = bool(hook._is_exec_auth)
        return client.BatchV1Api(self._aclient) if group == "batch" else client.CoreV1Api(self._aclient)

    async def _acall(self, group: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Async twin of :meth:`_call` (the async client does not raise on errors without preloading: we do)."""
        from kubernetes_asyncio.client.exceptions import ApiException
        from kubernetes_asyncio.client.rest import RESTResponse

        response = await getattr(await self._aapi(group), method)(*args, _preload_content=False, **kwargs)
        try:
            data = await response.read()
            if not 200 <= response.status <= 299:
                raise ApiException(http_resp=RESTResponse(response, data))  # type: ignore[arg-type]  # what rest.py passes
        finally:
            response.release()
        return data if method.endswith("_log") else _decode(data)

    async def aclose(self) -> None:
        stack, self._aclient, self._aclient_stack = self._aclient_stack, None, None
        if stack is not None:
            await stack.aclose()

    def _read_job(self, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return dict(self._call("batch", "read_namespaced_job", name, self.namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def _aread_job(self, name: str) -> dict[str, Any] | None:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            return dict(await self._acall("batch", "read_namespaced_job", name, self.namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _pods_of(self, name: str) -> list[dict[str, Any]]:
        return list(
            self._call("core", "list_namespaced_pod", self.namespace, label_selector=f"{ct.LABEL_NAME}={name}")["items"]
        )
