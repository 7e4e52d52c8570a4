"""How the ``lepton`` platform talks to a DGX Cloud Lepton workspace: ``leptonai``'s ``APIClient`` (imported on first
use, never at DAG parse), one per thread, with the requests every part of the platform makes -- job lists by label
query, single jobs, replicas, user secrets, stopping and deleting jobs -- and one way of reporting a refused token.
A job's user secrets are named ``tao.<job_id>.env.<VAR>``, ``tao.<job_id>.files.<VAR>`` and
``tao.<job_id>.mark.<key>.<try>``; its image pull secret ``tao-<job_id>-pull``.

The client's calls are blocking ``requests``: in the triggerer they run only inside threads
(``asyncio.to_thread``), and the connection itself is read asynchronously before (:meth:`LeptonAPIHook._aready`).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable, Collection, Container
from typing import Any, TypeVar

from airflow_provider_tao.hooks.base import MARK_CANCELED_BY, ConnectionProblem, JobValidationError, TAOPlatformHook
from airflow_provider_tao.hooks.lepton.status import LABEL_JOB_ID, labels_of
from airflow_provider_tao.jobs import JobHandle

T = TypeVar("T")

#: Seconds one API request may take (the client's own default is 120 s); the Test button waits less.
REQUEST_TIMEOUT = 30
PROBE_TIMEOUT = 15
PAGE_SIZE = 500
DEFAULT_REGISTRY = "nvcr.io"
#: Every 4xx: a stop request the job has outlived (it has ended: nothing to stop).
_ANY_CLIENT_ERROR = frozenset(range(400, 500))


def secret_prefix(job_id: str) -> str:
    """Every user secret of one job starts with this (``tao.<job_id>.``)."""
    return f"tao.{job_id}."


def mark_prefix(job_id: str) -> str:
    """The job's ownership marks kept as user secrets start with this (``tao.<job_id>.mark.``)."""
    return f"{secret_prefix(job_id)}mark."


def pull_secret_name(job_id: str) -> str:
    return f"tao-{job_id}-pull"


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of a ``leptonai`` error (``ClientError`` / ``ServerError`` carry the response,
    ``LogAPIError`` its code), None for transport failures (timeouts, refused connections)."""
    code = getattr(exc, "status_code", None)
    if not isinstance(code, int):
        code = getattr(getattr(exc, "response", None), "status_code", None)
    return code if isinstance(code, int) else None


class LeptonAPIHook(TAOPlatformHook):
    """The requests of :class:`~airflow_provider_tao.hooks.lepton.LeptonHook` (its base; not a platform by itself).

    :param conn_id: the ``tao_lepton`` connection, or None for the environment's ``LEPTON_*`` variables.
    """

    def __init__(self, conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(conn_id, **kwargs)
        self._local = threading.local()
        self._clients: list[Any] = []
        self._generation = 0
        self._stale = False

    # ----------------------------------------------------------------- settings and the client

    @property
    def workspace_id(self) -> str:
        self.load_connection()
        return self._required(
            self.setting("workspace_id"),
            "names no Lepton workspace",
            "Set the extra workspace_id (or LEPTON_WORKSPACE_ID)",
        )

    def _token(self) -> str:
        return self._required(
            self.setting("password") or os.environ.get("LEPTON_WORKSPACE_TOKEN"),
            "has no Lepton API token",
            "Put the token into the connection's password (or LEPTON_AUTH_TOKEN)",
        )

    def _required(self, value: Any, problem: str, fix: str) -> str:
        """A setting no request can do without; missing, an error naming the connection."""
        if not value:
            raise JobValidationError("conn_id", f"connection {self.conn_id!r} {problem}", fix)
        return str(value)

    def _client(self) -> Any:
        """This thread's ``APIClient`` (``requests`` sessions are not shared between threads)."""
        client = getattr(self._local, "client", None)
        if client is None or self._local.generation != self._generation:
            from leptonai.api.v2.client import APIClient

            self.load_connection()
            client = APIClient(
                workspace_id=self.workspace_id, auth_token=self._token(), url=self.setting("workspace_url")
            )
            client._timeout = REQUEST_TIMEOUT  # the client's own default is 120 s
            self._local.client, self._local.generation = client, self._generation
            self._clients.append(client)
        return client

    def _api(self, what: str, call: Callable[[Any], T]) -> T:
        """One API call; a refused token (401/403) is ``ERR_AUTH`` in words naming the setting to fix."""
        try:
            return call(self._client())
        except Exception as exc:
            status = status_of(exc)
            if status in (401, 403):
                self._stale = True  # the connection may be fixed meanwhile: read it again next time
                raise self._auth_error(what, status) from exc
            raise

    def _api_unless(self, what: str, call: Callable[[Any], T], statuses: Container[int], default: T) -> T:
        """One API call whose refusal with one of ``statuses`` means ``default`` (a 404: gone already)."""
        try:
            return self._api(what, call)
        except Exception as exc:
            if status_of(exc) in statuses:
                return default
            raise

    def _auth_error(self, what: str, status: int) -> JobValidationError:
        where = f"workspace {self.setting('workspace_id')!r}"
        if status == 401:
            return JobValidationError(
                f"connection {self.conn_id!r} password",
                f"ERR_AUTH: the Lepton API refused the token while {what} (HTTP 401 Unauthorized, {where})",
                "Put a valid API token of this workspace into the connection's password (or LEPTON_AUTH_TOKEN); "
                "tokens are issued in the Lepton dashboard",
            )
        return JobValidationError(
            f"connection {self.conn_id!r} password",
            f"ERR_AUTH: the token may not do this while {what} (HTTP 403 Forbidden, {where})",
            "Use a token of a workspace member allowed to run jobs, or fix workspace_id / workspace_url",
        )

    def _ready(self) -> None:
        self.load_connection()

    async def _aready(self) -> None:
        """Triggerer side: the connection is read asynchronously (never from a thread), and read again after its
        token was refused -- it may have been fixed meanwhile -- without stopping the watch."""
        await self.aload_connection()
        if self._stale and self.conn_id is not None:
            conn = await self.aget_connection(self.conn_id)
            self._set_connection(conn, await conn.aextra_dejson())  # swapped whole: threads never see it half-read
            self._stale, self._generation = False, self._generation + 1

    async def aclose(self) -> None:
        clients, self._clients = self._clients, []
        for client in clients:
            with contextlib.suppress(Exception):
                client._session.close()
        self._generation += 1

    def _raw(self, what: str, method: str, path: str, **kwargs: Any) -> Any:
        """A request through the client's own transport (session, auth and origin headers, error classes) for
        routes its typed API lacks or whose models drop fields; the answer as JSON (None when empty)."""
        return self._api(what, _raw_request(method, path, **kwargs))

    def _url(self) -> str:
        return str(self._client().url)

    def _console_url(self, backend_id: str) -> str:
        """The job's page in the Lepton dashboard (derived from the workspace URL as ``leptonai`` does; no call)."""
        from urllib.parse import quote

        base = self._client().get_dashboard_base_url()
        return f"{base}/compute/jobs/detail/{quote(backend_id, safe='')}/replicas/list" if base else ""

    def probe_connection(self) -> str:
        """The UI's "Test" button: ``GET /workspace`` through the client (``APIClient.info``), one cheap read with
        the connection's token; says which workspace answered and its state."""
        import requests
        from leptonai.api.v2.utils import (
            WorkspaceForbiddenError,
            WorkspaceNotFoundError,
            WorkspaceUnauthorizedError,
        )

        workspace, client = self.workspace_id, self._client()
        url = str(client.url)
        try:
            info = client.info(timeout=PROBE_TIMEOUT)
        except WorkspaceUnauthorizedError as exc:
            raise ConnectionProblem(
                "auth",
                f"the Lepton API at {url} refused the token (401); put a valid API token of workspace "
                f"{workspace!r} into the connection's password (tokens are issued in the Lepton dashboard)",
            ) from exc
        except WorkspaceForbiddenError as exc:
            raise ConnectionProblem(
                "permission", f"the token may not use workspace {workspace!r} (403 at {url}); use a token of a member"
            ) from exc
        except WorkspaceNotFoundError as exc:
            raise ConnectionProblem(
                "not_found",
                f"workspace {workspace!r} was not found at {url} (404); check workspace_id and workspace_url",
            ) from exc
        except requests.RequestException as exc:  # no answer at all: refused, DNS, timeout, TLS
            raise ConnectionProblem(
                "unreachable", f"nothing answers at {url} ({_reason(exc)}); check workspace_url and the network"
            ) from exc
        except Exception as exc:  # an answer that is not the workspace API's (a 5xx, a proxy's HTML page)
            answered = f"answered {status_of(exc)}" if status_of(exc) else "answered"
            raise ConnectionProblem(
                "unreachable", f"{url} {answered}, but not as a Lepton workspace API: {str(exc)[:300]}"
            ) from exc
        state = str(getattr(info.workspace_state, "value", info.workspace_state) or "normal")
        name = info.workspace_name or workspace
        if state == "terminated":
            raise ConnectionProblem("not_found", f"workspace {name} ({workspace}) has been terminated: it runs no jobs")
        note = "" if state == "normal" else f" (state {state}: jobs wait until it is resumed in the Lepton dashboard)"
        return f"Lepton workspace {name} ({workspace}) answers at {url}{note}"

    # ----------------------------------------------------------------- jobs and their replicas

    def _list_jobs(self, selector: str, mode: str = "alive_only", wanted: Collection[str] = ()) -> list[dict[str, Any]]:
        """Every job matching a label selector, as JSON, paged as the client's ``JobAPI.list_all`` pages: pages of
        500 until an EMPTY page (a server may cap a page below what was asked: a short page is not the last). A job
        seen on two pages (the list shifted while paging) is kept once.

        :param wanted: our job ids (``tao-job-id`` labels) the caller looks for: once every one of them was seen,
            the pages after are not asked for (a poll whose jobs are all listed costs one request, not two). A job
            not seen is only ever judged on the whole list.
        """
        jobs: dict[str, dict[str, Any]] = {}
        missing = set(wanted)
        page = 1
        while True:
            params = {"job_query_mode": mode, "query": selector, "page": page, "page_size": PAGE_SIZE}
            data = self._raw("listing jobs", "get", "/jobs", params=params)
            items = list((data.get("jobs") if isinstance(data, dict) else data) or [])
            if not items:
                return list(jobs.values())
            for item in items:
                meta = item.get("metadata") or {}
                jobs.setdefault(f"{meta.get('id')}@{meta.get('created_at')}", item)
                missing.discard(labels_of(item).get(LABEL_JOB_ID, ""))
            if wanted and not missing:
                return list(jobs.values())
            page += 1

    def _get_job(self, backend_id: str) -> dict[str, Any] | None:
        """The job (alive or archived) as JSON; None when it is gone."""
        request = _raw_request("get", f"/jobs/{backend_id}", params={"job_query_mode": "alive_and_archive"})
        job = self._api_unless("reading a job", request, {404}, None)
        return dict(job) if isinstance(job, dict) else None

    def get_job_replicas(self, handle_or_id: JobHandle | str) -> list[dict[str, Any]]:
        """The job's replicas as the API returns them (``status.node``, ``status.readiness_issue``, ...)."""
        job_id = handle_or_id.backend_job_id if isinstance(handle_or_id, JobHandle) else handle_or_id
        replicas = self._raw(
            "reading replicas", "get", f"/jobs/{job_id}/replicas", params={"job_query_mode": "alive_and_archive"}
        )
        return list(replicas or [])

    def _own_job(self, handle: JobHandle) -> dict[str, Any] | None:
        """The handle's job, unless it is gone or its name now belongs to a newer job."""
        job = self._get_job(handle.backend_job_id) if handle.backend_job_id else None
        return job if job is not None and labels_of(job).get(LABEL_JOB_ID) == handle.job_id else None

    def _stop_and_delete(self, backend_id: str) -> None:
        """Stop the job (SIGTERM to its replicas), then delete it. Idempotent: a job that has ended has nothing to
        stop, a job gone (404) or already being deleted (409) nothing to delete."""
        self._api_unless(
            "stopping the job",
            lambda c: c.job.update(backend_id, spec={"spec": {"stopped": True}}),
            _ANY_CLIENT_ERROR,
            None,
        )
        self._api_unless("deleting the job", lambda c: c.job.delete(backend_id), {404, 409}, None)

    # ----------------------------------------------------------------- user secrets and image pull secrets

    def _secret_names(self) -> list[str]:
        return [s.name for s in self._api("listing secrets", lambda c: c.secret.list_all())]

    def _create_secrets(self, values: dict[str, str], *, exists_ok: bool = False) -> None:
        """:param exists_ok: a secret of that name already there is no error (409: made by another process)."""
        from leptonai.api.v2.types.secret import SecretItem

        items = [SecretItem(name=k, value=v) for k, v in values.items()]
        exists = {409} if exists_ok else set()
        self._api_unless("creating the job's secrets", lambda c: c.secret.create(items), exists, None)

    def _delete_secret(self, name: str) -> None:
        self._api_unless(f"deleting secret {name}", lambda c: c.secret.delete(name), {404}, None)

    def _create_pull_secret(self, name: str) -> None:
        """A per-job image pull secret for ``registry`` from the connection's NGC key (the API the TAO SDK uses)."""
        registry = str(self.setting("registry", DEFAULT_REGISTRY))
        body = {
            "metadata": {"name": name},
            "spec": {
                "registry_server": registry,
                "username": "$oauthtoken",
                "password": str(self.setting("ngc_api_key")),
                "email": "",
            },
        }
        self._raw("creating the image pull secret", "post", "/imagepullsecrets", json=body)

    def _delete_secrets(
        self, job_id: str, names: list[str] | None, *, pull_secret: bool = False, marks: bool = False
    ) -> None:
        """Delete a job's user secrets (``names``, else every one it has; marks only with ``marks``) and its image
        pull secret. Best effort: a failure is logged, never raised."""
        try:
            if names is None:
                names = [n for n in self._secret_names() if n.startswith(secret_prefix(job_id))]
            kept = f"{mark_prefix(job_id)}{MARK_CANCELED_BY}."  # its task reads it after the deletion: swept later
            for name in names:
                if not name.startswith(mark_prefix(job_id)) or (marks and not name.startswith(kept)):
                    self._delete_secret(name)
            if pull_secret and self.setting("ngc_api_key"):
                path = f"/imagepullsecrets/{pull_secret_name(job_id)}"
                self._api_unless(
                    "deleting the image pull secret", lambda c: c.job._raise_if_not_ok(c.job._delete(path)), {404}, None
                )
        except Exception as exc:
            self.log.warning("Deleting the secrets of job %s failed: %s", job_id, exc)


def _reason(exc: BaseException) -> str:
    """The root of a transport failure in a few words ("Connection refused", "Name or service not known")."""
    text = str(exc)
    found = re.findall(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    return found[-1].strip() if found else type(exc).__name__


def _raw_request(method: str, path: str, **kwargs: Any) -> Callable[[Any], Any]:
    """A call of ``path`` through the client's transport, answering JSON (None when empty)."""

    def call(client: Any) -> Any:
        response = getattr(client.job, f"_{method}")(path, **kwargs)
        client.job._raise_if_not_ok(response)
        return response.json() if response.content else None

    return call
