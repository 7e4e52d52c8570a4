"""``TAOPlugin``: mounts the FastAPI app at ``/tao`` and adds "TAO jobs" to the UI's navigation (an external view the
UI shows in place, in an iframe).

Registered twice on purpose, so the view appears whatever ``[core] lazy_discover_providers`` says: the provider
info's ``plugins`` entry (read by Airflow only when providers are discovered eagerly) and the ``airflow.plugins``
entry point :data:`entry_point_plugin` (read always; it is None -- skipped -- when the provider info's entry is
read, so the plugin is never loaded twice).
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_tao.links import PLUGIN_URL_PREFIX


def _app() -> Any:
    from airflow_provider_tao.plugins.app import create_app

    return create_app()


class TAOPlugin(AirflowPlugin):
    """The TAO jobs view (``/tao/jobs``) and job pages (``/tao/jobs/<dag>/<run>/<task>``)."""

    name = "tao"
    fastapi_apps = [{"app": _app(), "url_prefix": PLUGIN_URL_PREFIX, "name": "TAO jobs"}]
    external_views = [
        {
            "name": "TAO jobs",
            "href": f"{PLUGIN_URL_PREFIX}/jobs",
            "destination": "nav",
            "url_route": "tao-jobs",
            "icon": f"{PLUGIN_URL_PREFIX}/static/icon.svg",
        }
    ]


def _entry_point_plugin() -> type[TAOPlugin] | None:
    from airflow import settings

    return None if not settings.LAZY_LOAD_PROVIDERS else TAOPlugin


#: What the ``airflow.plugins`` entry point names: the plugin, unless Airflow loads it from the provider info.
entry_point_plugin = _entry_point_plugin()
