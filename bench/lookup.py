"""Position lookups with and without the pool of lookup consumers, in one invocation, on local clusters.

A Spark task of ``read_path: executors`` reads its partitions' committed positions (the newest offset sync of
each, :func:`mirror_core.positions.last_committed_syncs`, then the destination's high watermarks of those it
found) at every micro-batch with ``transactions: per_writer``, and whenever a partition moved to its Python
worker with a transaction per partition. This times that pair of calls four ways, taking turns call by call so
that all meet the same brokers: on a process's kept lookup consumers (the default) or new ones each time
(``MIRRORFLOW_LOOKUP_POOL=0``), each with the scan's consume() waiting 5 ms a call (the default) or 50 ms
(``MIRRORFLOW_SCAN_WAIT_MS=50``, as before 7 December); it prints the medians and their ratios.

    python bench/lookup.py [--partitions 24] [--syncs 2000] [--lookups 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mirror_core import clients, local, positions  # noqa: E402
from mirror_core.offsets import OffsetSync  # noqa: E402
from mirror_core.topics import create_topics  # noqa: E402


def lookup(cfg: dict[str, str], syncs: str, topic: str, parts: list[int]) -> float:
    """One lookup as a task's writer does it; its seconds."""
    t0 = time.perf_counter()
    found = positions.last_committed_syncs(cfg, syncs, topic, parts, destination=f"{topic}.m")
    assert all(found[p] is not None for p in parts), "a partition's sync was not found"
    positions.high_watermarks(cfg, f"{topic}.m", parts)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=24, help="partitions a lookup asks about (default 24)")
    ap.add_argument("--syncs", type=int, default=2000, help="offset syncs on the sync topic (default 2000)")
    ap.add_argument("--lookups", type=int, default=40, help="lookups of each kind (default 40)")
    args = ap.parse_args(argv)
    console = Console()
    state = Path(tempfile.mkdtemp(prefix="mirrorflow-lookup-bench-"))
    env = local.LocalEnv.from_environment(state)
    spec = local.free_spec(registries=False)
    console.log(f"starting local clusters (state in {state})")
    local.up(env, spec, progress=lambda m: console.log(f"[dim]{m}"))
    try:
        dst = spec.sides[1].bootstrap
        cfg = {"bootstrap.servers": dst}
        topic, syncs = "orders", "bench.syncs.internal"
        create_topics(AdminClient(cfg), [NewTopic(syncs, 1, 1), NewTopic(f"{topic}.m", args.partitions, 1)],
                      timeout=30)
        p = Producer(cfg)
        for i in range(args.syncs):
            part = i % args.partitions
            sync = OffsetSync(topic, part, i, i)
            p.produce(syncs, key=sync.key_bytes(), value=sync.value_bytes(), partition=0,
                      headers=positions.sync_headers(f"{topic}.m"))
        assert p.flush(30) == 0
        del p  # closed now, not when the brokers go down
        parts = list(range(args.partitions))
        #: (pool on, the scan's wait in ms): today's, the pool alone, the shorter wait alone, as before 7 December
        kinds = {"kept consumers, 5 ms waits": ("1", "5"), "kept consumers, 50 ms waits": ("1", "50"),
                 "new consumers, 5 ms waits": ("0", "5"), "new consumers, 50 ms waits": ("0", "50")}
        times: dict[str, list[float]] = {kind: [] for kind in kinds}
        lookup(cfg, syncs, topic, parts)  # connections and the brokers' first reads, for neither kind
        console.log(f"timing {args.lookups} lookups of each kind, taking turns")
        for _ in range(args.lookups):
            for kind, (pool, wait) in kinds.items():
                os.environ[positions.LOOKUP_POOL_ENV] = pool
                os.environ[clients.SCAN_WAIT_ENV] = wait
                times[kind].append(lookup(cfg, syncs, topic, parts))
        os.environ.pop(positions.LOOKUP_POOL_ENV, None)
        os.environ.pop(clients.SCAN_WAIT_ENV, None)
        table = Table(title=f"position lookups of {args.partitions} partitions over {args.syncs} syncs "
                            f"(median of {args.lookups})")
        for col in ("lookup", "median ms", "p90 ms", "vs before 7 December"):
            table.add_column(col, justify="right" if col != "lookup" else "left")
        base = statistics.median(times["new consumers, 50 ms waits"])
        for kind, ts in times.items():
            med = statistics.median(ts)
            p90 = sorted(ts)[int(0.9 * (len(ts) - 1))]
            table.add_row(kind, f"{med * 1000:.1f}", f"{p90 * 1000:.1f}", f"{base / med:.2f}x faster")
        console.print(table)
    finally:
        positions.close_idle_lookups()
        local.down(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
