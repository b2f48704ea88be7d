"""``mirrorflow`` command line: a thin adapter over the core.

Exit codes: 0 success, 1 runtime failure, 2 bad input (config, usage, missing
prerequisite). A user mistake prints one line per problem and no traceback.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from mirror_core.errors import ConfigError, MirrorError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Mirror Kafka topics and their schemas.")
local_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Embedded local clusters (demo, tests).")
app.add_typer(local_app, name="local")

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])

ConfigArg = Annotated[Path, typer.Argument(help="Path to the mirrors YAML.", show_default=False)]
GroupOpt = Annotated[str | None, typer.Option("--group", "-g", help="Only this group.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def handle_errors(fn: F) -> F:
    """Turn MirrorError into one line per problem and its exit code; no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigError as exc:
            prefix = f"{exc.source}: " if exc.source else ""
            for issue in exc.issues:
                err.print(f"{prefix}{issue}", markup=False, highlight=False)
            raise typer.Exit(exc.exit_code) from None
        except MirrorError as exc:
            err.print(f"error: {exc}", markup=False, highlight=False)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


@app.callback()
def _main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )


@app.command()
@handle_errors
def validate(config: ConfigArg) -> None:
    """Check a config file; print a one-line summary, or one line per error (exit 2)."""
    from mirror_core.config import load_config, resolve_mirrors

    cfg = load_config(config)
    mirrors = [m for g in cfg.groups for m in resolve_mirrors(g)]
    flows = sum(1 for m in mirrors if m.is_flow)
    enabled = sum(1 for g in cfg.groups if g.enabled)
    out.print(
        f"{config}: OK — {len(cfg.clusters)} clusters, {len(cfg.groups)} groups ({enabled} enabled), "
        f"{len(mirrors) - flows} topic pairs, {flows} regex flows",
        markup=False, highlight=False,
    )


# --------------------------------------------------------------------------- local clusters


@local_app.command("up")
@handle_errors
def local_up(
    brokers: Annotated[int, typer.Option(help="Brokers per cluster side (src).", min=1, max=5)] = 1,
    dst_brokers: Annotated[int, typer.Option(help="Brokers on the dst side.", min=1, max=5)] = 1,
    registry: Annotated[bool, typer.Option(help="Start the schema registries too.")] = True,
    free_ports: Annotated[bool, typer.Option("--free-ports", help="Pick free ports instead of the defaults.")] = False,
    state_dir: Annotated[Path | None, typer.Option(help="Where data, logs and pids go.")] = None,
) -> None:
    """Start two real Kafka clusters (KRaft) and a schema registry per side."""
    from mirror_core import local

    env = local.LocalEnv.from_environment(state_dir)
    make_spec = local.free_spec if free_ports else local.default_spec
    spec = make_spec(src_brokers=brokers, dst_brokers=dst_brokers, registries=registry)
    status = local.up(env, spec, progress=lambda msg: err.print(msg, markup=False, highlight=False))
    _print_status(status, as_json=False)
    out.print(f"local clusters up in {status.get('took_s', 0):.1f}s", markup=False)


@local_app.command("down")
@handle_errors
def local_down(state_dir: Annotated[Path | None, typer.Option(help="State dir used by `up`.")] = None) -> None:
    """Stop every process `up` started (by pid) and remove their data."""
    from mirror_core import local

    stopped = local.down(local.LocalEnv.from_environment(state_dir))
    out.print(f"stopped {len(stopped)} processes" + (f": {', '.join(stopped)}" if stopped else ""))


@local_app.command("status")
@handle_errors
def local_status(
    as_json: JsonOpt = False,
    state_dir: Annotated[Path | None, typer.Option(help="State dir used by `up`.")] = None,
) -> None:
    """What runs where."""
    from mirror_core import local

    status = local.status(local.LocalEnv.from_environment(state_dir))
    _print_status(status, as_json)


def _print_status(status: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(status, indent=2))
        return
    from rich.table import Table

    table = Table(title="mirrorflow local clusters")
    for col in ("side", "service", "address", "pid", "state"):
        table.add_column(col, overflow="fold")
    for side, info in status.get("sides", {}).items():
        for b in info.get("brokers", []):
            table.add_row(side, f"kafka broker {b['node_id']}", b["address"], str(b["pid"]), b["state"])
        reg = info.get("registry")
        if reg:
            table.add_row(side, "schema registry", reg["url"], str(reg["pid"]), reg["state"])
    out.print(table)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
