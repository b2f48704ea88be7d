"""mirror_core is pure: it never imports airflow or pyspark (adapters import the core, not the reverse)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "mirror_core"
FORBIDDEN = ("airflow", "pyspark")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_no_forbidden_import_statement_in_core():
    offenders = {
        str(p.relative_to(CORE.parent)): sorted(_imports(p) & set(FORBIDDEN))
        for p in CORE.rglob("*.py")
        if _imports(p) & set(FORBIDDEN)
    }
    assert offenders == {}


def test_importing_every_core_module_loads_neither_airflow_nor_pyspark():
    modules = sorted(f"mirror_core.{p.stem}" for p in CORE.glob("*.py") if p.stem != "__init__")
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=CORE.parent, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
