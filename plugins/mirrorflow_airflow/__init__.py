"""mirrorflow's Airflow adapters: hooks, operators, sensors and triggers that call ``mirror_core``.

Installed as a package (see pyproject.toml) so that workers and the triggerer import it by its dotted
path, ``mirrorflow_airflow``; it never lives in the dags folder.
"""
