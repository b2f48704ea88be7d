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


def readme_section(heading: str) -> str:
    """README.md from the heading ``heading`` on."""
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    return readme[readme.index(heading):]


def printed_lines(res: Imported, name: str) -> list[str]:
    """What ``mirrorflow import`` prints for ``res`` read from a file ``name``: each finding, then each
    placeholder's note (mirror_core/cli.py)."""
    return [f"{f.file or name}: {f}" for f in res.findings] + [
        f"note: set {var} before running ({what})" for var, what in res.env_vars]


def assert_excerpt(excerpt: str, lines: list[str]) -> None:
    """``excerpt``, as a README shows an output, is ``lines`` with runs left out: a line ``...`` stands for
    lines left out, a line ending in ``...)`` for a line cut short there; every other line is one of
    ``lines``, whole, and in their order."""
    at = 0
    for shown in excerpt.splitlines():
        if shown.strip() == "...":
            continue
        cut = shown.endswith("...)")
        for i in range(at, len(lines)):
            if lines[i] == shown or (cut and lines[i].startswith(shown[:-len("...)")])):
                at = i + 1
                break
        else:
            raise AssertionError(f"not in the output (in order, after line {at}): {shown!r}")


def mm1_import(**over: Any) -> Imported:
    kw: dict[str, Any] = {"producer_text": fixture_text("mm1-producer.properties"),
                          "producer_source": str(FIXTURES / "mm1-producer.properties"),
                          "include": "orders.*, payments\\..*"}
    kw.update(over)
    return run_import("mm1", "mm1-consumer.properties", **kw)
