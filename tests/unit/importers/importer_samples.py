"""Helpers for the importer tests (unit and integration): the committed sample inputs and a loader for
the output. The samples under fixtures/ were written for these tests, after the documented formats."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from mirror_core.config import MirrorsConfig, parse_config
from mirror_core.importers import Imported, import_config

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


def run_import(fmt: str, name: str, **kw: Any) -> Imported:
    return import_config(fmt, fixture_text(name), str(FIXTURES / name), **kw)


def load(res: Imported) -> MirrorsConfig:
    """The output validated the way `mirrorflow validate` does, with its placeholders set."""
    env = {var: f"value-of-{var}" for var, _ in res.env_vars}
    return parse_config(yaml.safe_load(res.yaml_text), env=env)


def mm1_import(**over: Any) -> Imported:
    kw: dict[str, Any] = {"producer_text": fixture_text("mm1-producer.properties"),
                          "producer_source": str(FIXTURES / "mm1-producer.properties"),
                          "include": "orders.*, payments\\..*"}
    kw.update(over)
    return run_import("mm1", "mm1-consumer.properties", **kw)
