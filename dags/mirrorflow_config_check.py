"""The import error of the mirrors config's invalid groups (an Airflow DAG file that builds no DAG).

``mirrorflow_dags.py`` builds the DAGs of the valid groups and leaves the others out; this file fails to import
with one line naming each group left out and its problems, so that Airflow's import errors show them. It
imports cleanly when every group is valid, and also when no group is (``mirrorflow_dags.py``'s import error
then says it all).
"""

from __future__ import annotations

from pathlib import Path

from mirrorflow_airflow.dagfile import MirrorflowConfigError, config_path, invalid_groups_message, load

_PATH = config_path(Path(__file__).resolve().parent.parent)
try:
    _INVALID = load(_PATH)[1]
except MirrorflowConfigError:
    _INVALID = []
if _INVALID:
    raise MirrorflowConfigError(invalid_groups_message(_PATH, _INVALID))
