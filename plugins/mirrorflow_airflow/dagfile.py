"""What the DAG files in ``dags/`` share: where the mirrors config is, and how it loads for them.

``mirrorflow_dags.py`` builds the DAGs of every valid group; ``mirrorflow_config_check.py`` is an import error
naming each group left out, with its problems. One group's mistake (say a ``${VAR}`` unset where the DAG
processor runs) leaves the other groups' DAGs in place; a mistake no group owns removes them all, and is the
import error of ``mirrorflow_dags.py``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from mirror_core.config import InvalidGroup, MirrorsConfig, load_groups
from mirror_core.errors import ConfigError


class MirrorflowConfigError(Exception):
    """The mirrors config is invalid (the message names the file and every problem's path)."""


def config_path(root: Path, env: Mapping[str, str] | None = None) -> Path:
    """``$MIRRORFLOW_CONFIG``, else ``root``/config/mirrors.yaml, else ``root``/config/local.yaml."""
    env = os.environ if env is None else env
    if env.get("MIRRORFLOW_CONFIG"):
        # absolute, symlinks kept: a relative checkpoint_dir is relative to the directory of the path as given
        # (config.resolve_state_dirs), the same for the CLI and the Spark job; resolving links would give a
        # Kubernetes ConfigMap mount's timestamped directory, which changes with every update
        return Path(os.path.abspath(env["MIRRORFLOW_CONFIG"]))
    mirrors = root / "config" / "mirrors.yaml"
    return mirrors if mirrors.exists() else root / "config" / "local.yaml"


def load(path: Path) -> tuple[MirrorsConfig, list[InvalidGroup]]:
    """The valid groups' config and the groups left out (:func:`mirror_core.config.load_groups`); raises
    :class:`MirrorflowConfigError` when nothing can be built."""
    try:
        return load_groups(path)
    except ConfigError as exc:
        raise MirrorflowConfigError(f"{exc.source or path}: invalid mirrors config: "
                                    + "; ".join(str(i) for i in exc.issues)) from None


def invalid_groups_message(path: Path, invalid: list[InvalidGroup]) -> str:
    """One line: the file, and each group left out with its problems."""
    return (f"{path}: {len(invalid)} group(s) left out (their DAGs are not built; the other groups' are): "
            + " | ".join(str(g) for g in invalid))
