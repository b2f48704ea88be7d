"""The Mirrors page of the Airflow UI: a pure page model (``model``), a server-side plot (``plot``) and the
FastAPI app the plugin mounts (``app``)."""
