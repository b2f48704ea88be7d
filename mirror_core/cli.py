"""``mirrorflow`` command line: a thin adapter over the core.

Exit codes: 0 success, 1 runtime failure, 2 bad input (config, usage, missing
prerequisite). A user mistake prints one line per problem and no traceback.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from mirror_core.errors import ConfigError, ConfigIssue, MirrorError, UnreachableError

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
        except Exception as exc:
            from confluent_kafka import KafkaException

            if not isinstance(exc, KafkaException):
                raise
            # a Kafka failure the core did not attribute (e.g. a cluster lost mid-command): one line
            err.print(f"error: kafka: {exc.args[0].str() if exc.args else exc}", markup=False, highlight=False)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


@app.callback()
def _main(
    ctx: typer.Context,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging (the Spark job's too).")] = False,
    connect_timeout: Annotated[float | None, typer.Option(
        "--connect-timeout", envvar="MIRRORFLOW_CONNECT_TIMEOUT", min=0.1,
        help="Seconds to wait for a cluster or registry before giving up (default 10).")] = None,
) -> None:
    import os

    from mirror_core.logs import setup_logging

    setup_logging(verbose, stream=sys.stderr)
    ctx.obj = {"verbose": verbose}
    if connect_timeout is not None:
        os.environ["MIRRORFLOW_CONNECT_TIMEOUT"] = str(connect_timeout)  # the Spark job reads it too


def _job_command(ctx: typer.Context, config: Path, group: str, *args: str) -> list[str]:
    """The Spark job's command line for ``group`` (``--verbose`` when ``mirrorflow -v`` asked for debug logging)."""
    verbose = bool((ctx.obj or {}).get("verbose"))
    return [sys.executable, "-m", "spark_jobs.mirror_stream", str(config), "--group", group, *args,
            *(["--verbose"] if verbose else [])]


def _reachable(cfg: Any, groups: list[Any], registries: bool = False) -> list[Any]:
    """``groups``, once every cluster (and, with ``registries``, registry) they use has answered;
    else one line naming what did not (exit 1)."""
    from mirror_core.reach import require_reachable

    require_reachable(cfg, groups, registries=registries)
    return groups


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


@app.command("import")
@handle_errors
def import_(
    fmt: Annotated[str, typer.Argument(metavar="FORMAT", help="viooh | mm2 | strimzi | mm1", show_default=False)],
    sources: Annotated[list[Path], typer.Argument(
        metavar="INPUT...", show_default=False,
        help="The config to import (mm1: consumer.properties; mm2 run as Kafka Connect connectors: each connector's config).")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")] = None,
    producer: Annotated[Path | None, typer.Option(help="mm1: the producer.properties.")] = None,
    include: Annotated[str | None, typer.Option(
        "--include", "--whitelist", envvar="MIRROR_MAKER_TOPIC_WHITELIST",
        help="mm1: the topic regex MirrorMaker 1 ran with (--whitelist is MirrorMaker 1's older name for it).")] = None,
    env: Annotated[str, typer.Option("--env", help="viooh: the ENV its consumer group names were made with.")] = "local",
) -> None:
    """Translate a viooh-mirror, MirrorMaker 2 (dedicated, or its Kafka Connect connectors), Strimzi or
    MirrorMaker 1 config into a mirrors YAML.

    What has no equivalent is a comment in the YAML and one line here (stderr) each."""
    from mirror_core.importers import import_config

    def read(p: Path) -> str:
        try:
            return p.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(ConfigIssue("", f"cannot read: {getattr(exc, 'strerror', None) or exc}"), str(p)) from None

    source = sources[0]
    res = import_config(fmt, read(source), str(source), producer_text=read(producer) if producer else None,
                        producer_source=str(producer) if producer else None, include=include, viooh_env=env,
                        more=[(read(p), str(p)) for p in sources[1:]])
    for f in res.findings:
        err.print(f"{f.file or source}: {f}", markup=False, highlight=False)
    for var, what in res.env_vars:
        err.print(f"note: set {var} before running ({what})", markup=False, highlight=False)
    if output is None:
        sys.stdout.write(res.yaml_text)
    else:
        output.write_text(res.yaml_text)
        err.print(f"wrote {output}: check it with `mirrorflow validate {output}` and `mirrorflow plan {output}`",
                  markup=False, highlight=False)


# --------------------------------------------------------------------------- provisioning


@app.command()
@handle_errors
def plan(config: ConfigArg, group: GroupOpt = None, as_json: JsonOpt = False) -> None:
    """Show what `provision` would create or change, without changing anything."""
    from mirror_core.config import load_config
    from mirror_core.provision import plan_group

    cfg = load_config(config)
    plans = [plan_group(cfg, g) for g in _reachable(cfg, cfg.enabled_groups(group), registries=True)]
    outages = list(dict.fromkeys(o for p in plans for o in p.registry_outages))
    if outages:
        # a registry that went away (or fails) after the up-front check: as if that check had found it so
        raise UnreachableError("; ".join(outages))
    if as_json:
        print(json.dumps([p.as_dict() for p in plans], indent=2, default=str))
    else:
        for p in plans:
            _print_plan(p)
    if any(p.has_errors for p in plans):
        raise typer.Exit(2)


@app.command()
@handle_errors
def provision(config: ConfigArg, group: GroupOpt = None) -> None:
    """Create / grow / configure destination topics and mirror schema subjects; print what was done."""
    from mirror_core.config import load_config
    from mirror_core.provision import plan_group, provision_group

    cfg = load_config(config)
    failed = False
    for g in _reachable(cfg, cfg.enabled_groups(group), registries=True):
        p = plan_group(cfg, g)
        if p.topics.blocking:
            _print_plan(p)
            err.print(f"{g.name}: not provisioned: the plan has errors (see above)")
            failed = True
            continue
        res = provision_group(cfg, g, p)
        if not res.done and not res.errors:
            out.print(f"{g.name}: nothing to do")
        for line in res.done:
            out.print(f"{g.name}: {line}", markup=False, highlight=False)
        for line in res.errors:
            err.print(f"{g.name}: error: {line}", markup=False, highlight=False)
        failed |= bool(res.errors)
    if failed:
        raise typer.Exit(1)


def _print_plan(p: Any) -> None:
    from rich.table import Table

    table = Table(title=f"plan for group {p.group}")
    for col in ("action", "destination topic", "source topic", "partitions", "RF", "configs", "reason"):
        table.add_column(col, overflow="fold")
    styles = {"create": "green", "grow": "yellow", "alter_configs": "yellow", "create_acls": "yellow",
              "error": "bold red", "unchanged": "dim"}
    for a in p.topics.actions:
        cfgs = ", ".join([f"{k}={v}" for k, v in sorted(a.configs.items())] + [f"{k} (delete)" for k in a.deletes])
        table.add_row(f"[{styles.get(a.kind, '')}]{a.kind}[/]", a.topic, a.source_topic or "-",
                      str(a.partitions or "-"), str(a.replication_factor or "-"), cfgs, a.reason)
    if p.schemas is not None:
        for s in p.schemas.steps:
            kind = f"schema {s.action}"
            style = "bold red" if s.action == "conflict" else ("dim" if s.action == "unchanged" else "green")
            table.add_row(f"[{style}]{kind}[/]", s.subject, "-", "-", "-", "", s.detail)
    out.print(table)
    for t, reason in p.topics.skipped:
        out.print(f"  skipped {t}: {reason}", markup=False, highlight=False)
    for n in p.topics.notes:
        out.print(f"  note: {n}", markup=False, highlight=False)
    for w in p.topics.warnings:
        out.print(f"  [yellow]warning[/]: {w}", highlight=False)
    if p.schemas is not None:
        for e in p.schemas.errors:
            msg = ": ".join(e) if isinstance(e, tuple) else str(e)
            err.print(f"  schema error: {msg}", markup=False, highlight=False)


# --------------------------------------------------------------------------- offsets and health


@app.command()
@handle_errors
def checkpoint(
    config: ConfigArg,
    group: GroupOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Allow moving destination group offsets backwards.")] = False,
    loop: Annotated[bool, typer.Option(
        "--loop", help="Keep going: checkpoints every offsets.interval, heartbeats every heartbeats.interval.")] = False,
) -> None:
    """One round of checkpoints + consumer-group offset sync + heartbeats, with a per-group report."""
    from mirror_core.checkpoint import run_forever, run_round
    from mirror_core.config import load_config

    cfg = load_config(config)
    groups = _reachable(cfg, cfg.enabled_groups(group))
    if loop:
        run_forever(cfg, groups, force=force, on_report=_print_round)
        return
    for g in groups:
        _print_round(run_round(cfg, g, force=force))


def _print_round(rep: Any) -> None:
    from rich.table import Table

    table = Table(title=f"checkpoint round for group {rep.mirror_group}")
    for col in ("consumer group", "checkpoints", "offsets written", "skipped (why)"):
        table.add_column(col, overflow="fold")
    for g in rep.groups:
        written = ", ".join(f"{t}[{p}]={o}" for t, p, o in g.written) or "-"
        skipped = "; ".join(f"{t}[{p if p is not None else '*'}]: {why}" for t, p, why in g.skipped) or "-"
        table.add_row(g.group, str(g.checkpoints), written, skipped)
    out.print(table)
    out.print(f"heartbeat: {'sent' if rep.heartbeat else 'off'}")
    if rep.syncs_refreshed:
        out.print(f"offset syncs of {rep.syncs_refreshed} idle partitions written again (kept past the sync topic's "
                  "retention)")


@app.command()
@handle_errors
def lag(config: ConfigArg, group: GroupOpt = None, as_json: JsonOpt = False) -> None:
    """Replication lag per mirrored partition (records and seconds), totals, and consumer-group lag."""
    from dataclasses import asdict

    from mirror_core import stops
    from mirror_core.checkpoint import load_sync_store, topic_mappings
    from mirror_core.config import load_config
    from mirror_core.health import consumer_group_lag, replication_lag

    cfg = load_config(config)
    result = []
    for g in _reachable(cfg, cfg.enabled_groups(group)):
        store, maps = load_sync_store(cfg, g), topic_mappings(cfg, g)
        rep = replication_lag(cfg, g, store, maps)
        glag = consumer_group_lag(cfg, g, store, maps)
        stopped: str | None = None
        unread: str | None = None
        try:  # after a failover the lag grows for good: say why
            stopped = stops.requested(cfg, g, timeout=stops.WATCH_TIMEOUT_S)
        except stops.StopSignalError as exc:
            unread = str(exc)
        result.append({"group": g.name, **rep.as_dict(), "consumer_groups": [asdict(x) for x in glag],
                       "stream_stopped": stopped, "stream_stop_error": unread})
        if not as_json:
            _print_lag(g.name, rep, glag)
            if stopped:
                out.print(f"{g.name}: the stream is stopped for good: {stopped} (`mirrorflow failover {config} "
                          f"--group {g.name} --step resume` lets it start again)", markup=False, highlight=False)
            elif unread:
                err.print(f"{g.name}: whether a failover stopped the stream is not known: {unread}", markup=False,
                          highlight=False)
    if as_json:
        print(json.dumps(result, indent=2))


def _print_lag(name: str, rep: Any, glag: list[Any]) -> None:
    from rich.table import Table

    table = Table(title=f"replication lag, group {name}")
    for col in ("mirror", "topic", "partition", "source end", "mirrored to", "lag records", "lag s"):
        table.add_column(col, overflow="fold")
    for p in rep.partitions:
        table.add_row(p.mirror, p.source_topic, str(p.partition), str(p.source_end),
                      "-" if p.mirrored_to is None else str(p.mirrored_to), str(p.lag_records),
                      "-" if p.lag_seconds is None else f"{p.lag_seconds:.1f}")
    for key, t in rep.totals().items():
        table.add_row(f"[bold]total {key}[/]", "", "", "", "", str(t["lag_records"]), f"{t['max_lag_seconds']:.1f}")
    out.print(table)
    if glag:
        gt = Table(title="consumer groups on the destination (after translation)")
        for col in ("group", "destination topic", "partition", "source committed", "translated", "dst end", "lag"):
            gt.add_column(col, overflow="fold")
        for x in glag:
            gt.add_row(x.consumer_group, x.destination_topic, str(x.partition), str(x.source_committed),
                       "-" if x.translated is None else str(x.translated), str(x.destination_end),
                       "-" if x.lag_records is None else str(x.lag_records))
        out.print(gt)


@app.command()
@handle_errors
def verify(config: ConfigArg, group: GroupOpt = None, as_json: JsonOpt = False) -> None:
    """Parity per mirrored partition (counts + order-sensitive checksums); exit 1 on any mismatch."""
    from dataclasses import asdict

    from rich.table import Table

    from mirror_core.config import load_config
    from mirror_core.health import verify_parity

    cfg = load_config(config)
    bad = False
    rows = []
    for g in _reachable(cfg, cfg.enabled_groups(group)):
        res = verify_parity(cfg, g)
        rows += [asdict(r) | {"group": g.name} for r in res]
        bad |= any(not r.ok for r in res)
        if as_json:
            continue
        table = Table(title=f"parity, group {g.name}")
        for col in ("topic", "partition", "source range", "records src/dst", "checksum src/dst", "result"):
            table.add_column(col, overflow="fold")
        for r in res:
            verdict = "[green]ok[/]" if r.ok else f"[bold red]MISMATCH at source offset {r.first_mismatch_offset}[/]"
            table.add_row(r.source_topic, str(r.partition), f"{r.source_range[0]}..{r.source_range[1]}",
                          f"{r.source_count}/{r.destination_count}",
                          f"{r.source_checksum}/{r.destination_checksum}", r.note or verdict)
        out.print(table)
    if as_json:
        print(json.dumps(rows, indent=2))
    if bad:
        raise typer.Exit(1)


@app.command()
@handle_errors
def acls(config: ConfigArg, group: GroupOpt = None, as_json: JsonOpt = False) -> None:
    """The least-privilege ACLs each group's source and destination principals need (kafka-acls commands)."""
    from dataclasses import asdict

    from mirror_core.acls import required_acls
    from mirror_core.config import load_config

    cfg = load_config(config)
    rows = []
    for g in cfg.enabled_groups(group):
        grants = required_acls(cfg, g)
        rows += [asdict(x) | {"group": g.name} for x in grants]
        if as_json:
            continue
        for x in grants:
            out.print(f"# {g.name} ({x.side} {x.cluster}): {x.why}", markup=False, highlight=False)
            bootstrap = cfg.cluster(x.cluster).bootstrap_servers
            out.print(x.kafka_acls_command(bootstrap), markup=False, highlight=False)
    if as_json:
        print(json.dumps(rows, indent=2))


# --------------------------------------------------------------------------- streaming


@app.command()
@handle_errors
def run(
    ctx: typer.Context,
    config: ConfigArg,
    group: Annotated[str, typer.Option("--group", "-g", help="The group to mirror.")],
    once: Annotated[bool, typer.Option("--once", help="Drain what is there now, then stop.")] = False,
    stop_timeout: Annotated[float | None, typer.Option(
        "--stop-timeout", help="Seconds a stop (SIGTERM, Ctrl-C) may take before every process of the job is "
                               "killed. Default: the group's spark.stop_timeout (30s).", min=1)] = None,
) -> None:
    """Run a group's streaming mirror (Spark, local master from the config)."""
    import signal
    import subprocess

    from mirror_core.config import load_config
    from mirror_core.process import stop_tree

    cfg = load_config(config)
    g = cfg.group(group)
    # reject a bad config or group, or an unreachable cluster or registry, before Spark starts
    _reachable(cfg, [g], registries=True)
    timeout = stop_timeout or g.spark.stop_timeout
    cmd = _job_command(ctx, config, group, "--stop-timeout", str(timeout), *(["--once"] if once else []))
    # its own session: a terminal's Ctrl-C reaches only this process, which stops the job's whole tree
    job = subprocess.Popen(cmd, start_new_session=True)
    stopping: list[int] = []

    def stop(signum: int, _frame: Any) -> None:
        if stopping:
            return
        stopping.append(signum)
        err.print(f"stopping the mirror (up to {timeout:.0f}s)...", highlight=False)
        rep = stop_tree(job.pid, timeout * 0.85)  # the rest of the timeout: killing and reaping
        if not rep.graceful:
            err.print(f"the mirror did not stop within {timeout:.0f}s; killed {len(rep.killed)} processes",
                      highlight=False)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    rc = job.wait()
    raise typer.Exit(1 if rc < 0 else rc)


@app.command()
@handle_errors
def failover(
    ctx: typer.Context,
    config: ConfigArg,
    group: Annotated[str, typer.Option("--group", "-g", help="The group whose consumers move to its destination.")],
    step: Annotated[str, typer.Option("--step", help="preflight | lag | quiet | drain | sync | verify | finalize | "
                                      "resume (remove the group's stop).")],
    consumer_groups: Annotated[list[str] | None, typer.Option(
        "--consumer-group", "-c", help="A source consumer group to move (repeat for several).")] = None,
    max_lag_records: Annotated[int, typer.Option(help="lag: records under which producers may stop.")] = 1000,
    max_lag_seconds: Annotated[float, typer.Option(help="lag: seconds under which producers may stop.")] = 60.0,
    quiet_seconds: Annotated[float, typer.Option(help="quiet: how long the source must stay without new records.")] = 30.0,
    wait: Annotated[float, typer.Option(help="lag / quiet / finalize: keep checking for up to this many seconds "
                                              "(finalize: for the stream job to end).")] = 600.0,
    no_stream: Annotated[bool, typer.Option(
        "--no-stream", help="quiet: no stream runs now (a `drain` comes next), so do not wait for lag 0.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """One step of moving a group's consumers to its destination, by hand: the same steps the Airflow
    failover DAG runs. In order: preflight, lag, (stop the producers), quiet, drain (unless a stream runs),
    sync, verify, (switch the consumers), finalize. Exit 0 when the step passed, 1 when not."""
    import subprocess
    import time
    from dataclasses import replace

    from mirror_core import failover as fo
    from mirror_core.config import load_config
    from mirror_core.errors import ConfigError, ConfigIssue

    if step not in fo.STEPS[:-1] + ("resume",):
        raise ConfigError(ConfigIssue("--step", f"unknown step {step!r} (use {', '.join(fo.STEPS[:-1])} or resume)"))
    cfg = load_config(config)
    g = cfg.group(group)
    needs_groups = step in ("preflight", "sync")
    params = fo.FailoverParams.from_mapping({
        "consumer_groups": list(consumer_groups or []) or (["-"] if not needs_groups else []),
        "max_lag_records": max_lag_records, "max_lag_seconds": max_lag_seconds, "quiet_seconds": quiet_seconds})
    if step == "resume":
        cleared = fo.clear_stream_stop(cfg, g)
        out.print(f"{g.name}: stop {'removed' if cleared else 'was not there'} ({fo.stops.where(cfg, g)})",
                  markup=False, highlight=False)
        return
    if step == "drain":
        _reachable(cfg, [g], registries=True)
        code = subprocess.call(_job_command(ctx, config, g.name, "--once"))
        if code:
            raise typer.Exit(code)
        rep = fo.lag_check(cfg, g, fo.FailoverParams(params.consumer_groups, 0, float("inf")))
    else:
        _reachable(cfg, [g], registries=step == "preflight")
        if step == "preflight":
            rep = fo.preflight(cfg, g, params)
        elif step == "lag":
            deadline = time.monotonic() + wait
            rep = fo.lag_check(cfg, g, params)
            while not rep.ok and time.monotonic() < deadline:
                err.print(f"{g.name}: {rep.summary}", markup=False, highlight=False)
                time.sleep(5)
                rep = fo.lag_check(cfg, g, params)
        elif step == "quiet":
            rep = fo.wait_quiet(cfg, g, params, wait, require_lag_zero=not no_stream)
        elif step == "sync":
            rep = fo.final_sync(cfg, g, params)
        elif step == "verify":
            rep = fo.verify(cfg, g)
        else:
            # with consumer groups (stopped on the source by now): their offsets follow them first
            resynced = fo.resync(cfg, g, params) if consumer_groups else None
            blocked = fo.stop_blocked(resynced)
            if resynced is not None and blocked is not None:  # (the first test narrows the type)
                rep = replace(resynced, summary=blocked)  # nothing stopped: run the step again once fixed
            else:
                if resynced is None:
                    err.print(f"{g.name}: finalize without --consumer-group: no group's offsets are synced again "
                              "(what their consumers read on the source after `sync` is read again on the "
                              "destination)", markup=False, highlight=False)
                where = fo.request_stream_stop(cfg, g, f"failover of group {g.name} to {g.destination}")
                stopped = fo.wait_stream_ended(g, wait, say=lambda line: err.print(f"{g.name}: {line}", markup=False,
                                                                                   highlight=False))
                rep = fo.finalize(cfg, g, stream_stopped=stopped, resynced=resynced, stop=where)
    if as_json:
        print(json.dumps(rep.as_dict(), indent=2, default=str))
    else:
        out.print(f"{g.name}: {rep.step}: {'ok' if rep.ok else 'NOT OK'}: {rep.summary}", markup=False,
                  highlight=False)
    if not rep.ok:
        raise typer.Exit(1)


@app.command()
@handle_errors
def demo(records: Annotated[int, typer.Option(help="Sample records to produce.")] = 30000) -> None:
    """Local clusters, sample Avro data mirrored by Spark, then checkpoints, lag and parity."""
    from mirror_core import demo as demo_mod

    raise typer.Exit(demo_mod.run(records, say=lambda m: err.print(m, markup=False, highlight=False)))


# --------------------------------------------------------------------------- local clusters


@local_app.command("up")
@handle_errors
def local_up(
    brokers: Annotated[int, typer.Option(help="Brokers per cluster side (src).", min=1, max=5)] = 1,
    dst_brokers: Annotated[int, typer.Option(help="Brokers on the dst side.", min=1, max=5)] = 1,
    registry: Annotated[bool, typer.Option(help="Start the schema registries too.")] = True,
    free_ports: Annotated[bool, typer.Option("--free-ports", help="Pick free ports instead of the defaults.")] = False,
    secure: Annotated[bool, typer.Option(
        "--secure", help="SASL_SSL (SCRAM-SHA-512) + TLS, ACLs enforced, registries over HTTPS; grants the "
                         "least-privilege ACLs of config/local-secure.yaml.")] = False,
    state_dir: Annotated[Path | None, typer.Option(help="Where data, logs and pids go.")] = None,
) -> None:
    """Start two real Kafka clusters (KRaft) and a schema registry per side."""
    from mirror_core import local

    env = local.LocalEnv.from_environment(state_dir)
    make_spec = local.free_spec if free_ports else local.default_spec
    spec = make_spec(src_brokers=brokers, dst_brokers=dst_brokers, registries=registry, secure=secure)
    say = lambda msg: err.print(msg, markup=False, highlight=False)  # noqa: E731
    status = local.up(env, spec, progress=say)
    if secure:
        local.grant_example_acls(env, spec, say)
    _print_status(status, as_json=False)
    out.print(f"local clusters up in {status.get('took_s', 0):.1f}s", markup=False)
    if secure:
        sec = local.load_security(env)
        assert sec is not None
        out.print(f"secured: `source {sec.credentials_file}` to use config/local-secure.yaml", markup=False)


@local_app.command("spark-up")
@handle_errors
def local_spark_up(
    workers: Annotated[int, typer.Option(help="Workers (each runs its own executor JVMs).", min=1, max=4)] = 2,
    cores: Annotated[int, typer.Option(help="Cores per worker.", min=1, max=8)] = 1,
    memory: Annotated[str, typer.Option(help="Memory per worker (Spark size, e.g. 1g).")] = "1g",
    state_dir: Annotated[Path | None, typer.Option(help="Where logs and pids go.")] = None,
) -> None:
    """Start a Spark standalone master and workers from pyspark's distribution (spark://127.0.0.1:...)."""
    from mirror_core import local, local_spark

    cluster = local_spark.up(local.LocalEnv.from_environment(state_dir), workers, cores, memory)
    out.print(f"spark master {cluster.master_url} (UI {cluster.master_ui}), {len(cluster.worker_pids)} workers; "
              f"set spark.master: \"{cluster.master_url}\" in a group to run its mirror there", markup=False)


@local_app.command("spark-down")
@handle_errors
def local_spark_down(state_dir: Annotated[Path | None, typer.Option(help="State dir used by spark-up.")] = None
                     ) -> None:
    """Stop the Spark master and workers `spark-up` started."""
    from mirror_core import local, local_spark

    stopped = local_spark.down(local.LocalEnv.from_environment(state_dir))
    out.print(f"stopped {len(stopped)} processes" + (f": {', '.join(stopped)}" if stopped else ""), markup=False)


@local_app.command("fetch")
@handle_errors
def local_fetch() -> None:
    """Fetch the Kafka, schema registry and Spark connector artifacts into the cache (once)."""
    from mirror_core import artifacts

    cache = artifacts.cache_dir()
    say = lambda m: err.print(m, markup=False, highlight=False)  # noqa: E731
    paths = {
        "kafka": artifacts.fetch_kafka(cache, say),
        "schema registry": artifacts.fetch_apicurio(cache, say),
        "spark kafka connector": artifacts.fetch_spark_kafka(cache, say),
    }
    for what, path in paths.items():
        out.print(f"{what}: {path}", markup=False, highlight=False)
    # the Spark driver's class-data sharing archive (spark_jobs/jvm_archive.py): it only saves start
    # time, so a failure to make it is reported and fetch goes on
    import subprocess

    subprocess.call([sys.executable, "-m", "spark_jobs.jvm_archive"])


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
