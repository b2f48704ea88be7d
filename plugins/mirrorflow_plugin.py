"""Registers mirrorflow with Airflow: the Mirrors page (a FastAPI app behind Airflow's authentication),
listed in the UI's navigation.

The hooks, operators, sensors and triggers live in the installed package ``mirrorflow_airflow`` (workers and
the triggerer import them by dotted path); this file only wires the UI.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from mirrorflow_airflow.web.app import create_app

URL_PREFIX = "/mirrorflow"


class MirrorflowPlugin(AirflowPlugin):
    name = "mirrorflow"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "Mirrors"}]
    external_views = [{
        "name": "Mirrors",
        "href": f"{URL_PREFIX}/",
        "destination": "nav",
        "url_route": "mirrors",
    }]
