"""The Checkpoints page of the Airflow UI: a plugin registered through the ``airflow.plugins`` entry point.

It adds a FastAPI app under ``/checkpoints`` (JSON endpoints behind Airflow's own auth,
and the static page) and two external views: ``Checkpoints`` in the navigation (every
job the user may read) and a ``Checkpoints`` tab on each DAG. Importing it does no
database work, and imports nothing of the API server: every Airflow process loads plugins,
only the API server serves this one, and builds its app on the first request.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

PREFIX = "/checkpoints"


class CheckpointsApp:
    """ASGI app that builds the plugin's FastAPI app (:func:`.app.create_app`) on its first request."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            from airflow_provider_checkpoint.plugin.app import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


class CheckpointsPlugin(AirflowPlugin):
    name = "checkpoints"
    fastapi_apps = [{"app": CheckpointsApp(), "url_prefix": PREFIX, "name": "Checkpoints"}]
    external_views = [
        {
            "name": "Checkpoints",
            "href": f"{PREFIX}/ui/",
            "destination": "nav",
            "category": "browse",
            "url_route": "checkpoints",
        },
        {
            "name": "Checkpoints",
            "href": f"{PREFIX}/ui/?dag_id={{DAG_ID}}",
            "destination": "dag",
            "url_route": "checkpoints-dag",
        },
    ]
