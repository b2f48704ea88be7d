"""Turning result rows into ratios, rich tables and the JSON file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

MM2 = "mm2"
MM2_TUNED = "mm2-tuned"
RAW = "raw-python"
REFS = (MM2, MM2_TUNED, RAW)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 2)


def rate(row: dict[str, Any]) -> float | None:
    """The throughput a row is compared by: records/s over the 10 %-90 % window of the destination count
    when the drain was long enough to have one, else the steady figure (data path start -> last record).
    Also the steady figure when the window is coarse (``window_coarse``: a tenth of the records or more became
    visible at once, so the window is a few commits apart and may even fall between two of them)."""
    if row.get("window_coarse"):
        return row.get("records_per_s")
    return row.get("records_per_s_window") or row.get("records_per_s")


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Throughput rows: records/s (see :func:`rate`) as a multiple of MM2's (as shipped and tuned) and
    the raw pipe's for the same size. Latency rows: p50 and p99 as a multiple of theirs (above 1 = slower)."""
    for r in rows:
        if r.get("status") != "ok":
            continue
        peers = {p["contender"]: p for p in rows
                 if p["phase"] == r["phase"] and p.get("size") == r.get("size") and p.get("status") == "ok"
                 and p.get("round") == r.get("round")}
        if r["phase"] == "throughput":
            for ref in REFS:
                r[f"x_{ref}"] = _ratio(rate(r), rate(peers[ref]) if ref in peers else None)
        else:
            for ref in REFS:
                r[f"p50_x_{ref}"] = _ratio(r.get("p50_ms"), peers.get(ref, {}).get("p50_ms"))
                r[f"p99_x_{ref}"] = _ratio(r.get("p99_ms"), peers.get(ref, {}).get("p99_ms"))


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Throughput over rounds (``--rounds``): per value size and contender, the mean records/s (see
    :func:`rate`) of its runs that succeeded, their spread, and the ratio of the means to MM2's (as shipped
    and tuned) and the raw pipe's, with the ratio of each round. A run during which the machine stood still
    (``machine_paused``: a VM paused or snapshotted) is left out of the means and counted in ``paused``. Empty
    when every row is from one round."""
    thr = [r for r in rows if r["phase"] == "throughput"]
    if not any((r.get("round") or 1) > 1 for r in thr):
        return []
    out: list[dict[str, Any]] = []
    for size in dict.fromkeys(r["size"] for r in thr):
        runs: dict[str, list[dict[str, Any]]] = {}
        for r in thr:
            if r["size"] == size:
                runs.setdefault(r["contender"], []).append(r)
        means = {c: _mean([rate(r) for r in _counted(rs)]) for c, rs in runs.items()}
        for c, rs in runs.items():
            mean = means[c]
            ok = _counted(rs)
            rates = [v for v in (rate(r) for r in ok) if v is not None]
            s: dict[str, Any] = {"size": size, "contender": c, "rounds": len(rs), "ok": len(ok),
                                 "paused": sum(1 for r in rs if r.get("status") == "ok" and r.get("machine_paused")),
                                 "mean": None if mean is None else round(mean),
                                 "min": min(rates, default=None), "max": max(rates, default=None),
                                 "positions": [r.get("position") for r in rs]}
            for ref in REFS:
                s[f"x_{ref}"] = _ratio(mean, means.get(ref))
                s[f"x_{ref}_by_round"] = [r.get(f"x_{ref}") for r in rs]
            out.append(s)
    return out


def _counted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs a mean counts: those that succeeded on a machine that did not stand still."""
    return [r for r in rows if r.get("status") == "ok" and not r.get("machine_paused")]


def summarize_latency(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Latency over rounds (``--rounds``): per contender, the mean p50 and p99 of its runs that succeeded,
    each round's p50 / p99 with its position, and the ratio of the mean p50 / p99 to the tuned MM2's. Empty
    when every row is from one round."""
    lat = [r for r in rows if r["phase"] == "latency"]
    if not any((r.get("round") or 1) > 1 for r in lat):
        return []
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in lat:
        runs.setdefault(r["contender"], []).append(r)
    out: list[dict[str, Any]] = []
    for c, rs in runs.items():
        ok = [r for r in rs if r.get("status") == "ok"]
        s: dict[str, Any] = {"contender": c, "rounds": len(rs), "ok": len(ok), "positions": [r.get("position") for r in rs]}
        for q in ("p50", "p99", "p99_settled"):
            mean = _mean([r.get(f"{q}_ms") for r in ok])
            s[f"{q}_mean"] = None if mean is None else round(mean, 1)
            s[f"{q}_by_round"] = [r.get(f"{q}_ms") if r.get("status") == "ok" else None for r in rs]
        out.append(s)
    tuned = next((s for s in out if s["contender"] == MM2_TUNED), None)
    for s in out:
        for q in ("p50", "p99"):
            s[f"{q}_x_{MM2_TUNED}"] = _ratio(s[f"{q}_mean"], tuned[f"{q}_mean"] if tuned else None)
    return out


def latency_summary_table(summary: list[dict[str, Any]]) -> Table:
    t = Table(title="Latency over rounds (mean of each contender's p50 and p99 over the rounds, the order reversed "
                    "every other round; by round = round.position: p50 / p99)")
    for col in ("contender", "rounds ok", "mean p50 ms", "mean p99 ms", "mean p99 after 2 s", "p50 x MM2 tuned",
                "p99 x MM2 tuned", "by round"):
        t.add_column(col, justify="left" if col in ("contender", "by round") else "right",
                     no_wrap=col == "contender", min_width=20 if col == "contender" else None)
    for s in summary:
        by_round = "  ".join(f"{i}.{pos}: {_f(p50, '{:.1f}')} / {_f(p99, '{:.1f}')}" for i, (pos, p50, p99)
                             in enumerate(zip(s["positions"], s["p50_by_round"], s["p99_by_round"], strict=True), 1))
        t.add_row(s["contender"], f"{s['ok']}/{s['rounds']}", _f(s["p50_mean"], "{:.1f}"), _f(s["p99_mean"], "{:.1f}"),
                  _f(s["p99_settled_mean"], "{:.1f}"), _f(s[f"p50_x_{MM2_TUNED}"], "{:.2f}"), _f(s[f"p99_x_{MM2_TUNED}"], "{:.2f}"), by_round)
    return t


def _mean(vals: list[Any]) -> float | None:
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def summary_table(summary: list[dict[str, Any]]) -> Table:
    t = Table(title="Drain throughput over rounds (mean of each contender's 10-90% rec/s over the rounds, each "
                    "round on freshly loaded data, the order reversed every other round; x = ratio of the means, "
                    "by round = the ratio within each round)")
    for col in ("value B", "contender", "rounds ok", "positions", "mean rec/s", "min", "max", "x MM2 tuned",
                "x MM2 tuned by round", "x raw", "x raw by round"):
        t.add_column(col, justify="left" if col in ("contender",) or "by round" in col else "right",
                     no_wrap=col == "contender", min_width=20 if col == "contender" else None)
    for s in summary:
        t.add_row(str(s["size"]), s["contender"],
                  f"{s['ok']}/{s['rounds']}" + (f" ({s['paused']} paused)" if s.get("paused") else ""),
                  ",".join(str(p) for p in s["positions"]), _f(s["mean"]), _f(s["min"]), _f(s["max"]),
                  _f(s[f"x_{MM2_TUNED}"], "{:.2f}"), " ".join(_f(x, "{:.2f}") for x in s[f"x_{MM2_TUNED}_by_round"]),
                  _f(s[f"x_{RAW}"], "{:.2f}"), " ".join(_f(x, "{:.2f}") for x in s[f"x_{RAW}_by_round"]))
    return t


def _f(v: Any, fmt: str = "{:,.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def _load(r: dict[str, Any]) -> str:
    """The 1-minute load average at the start and the end of the measurement ("-" if unknown)."""
    la = r.get("loadavg_1m") or {}
    return f"{_f(la.get('start'), '{:.1f}')}-{_f(la.get('end'), '{:.1f}')}"


def throughput_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="Drain throughput (same pre-loaded data; 10-90% = window between 10 % and 90 % of the records "
                    "visible on the destination, ratios use it; steady = data path start -> last record visible, "
                    "counting what became visible after the start; "
                    "CPU us/rec = CPU time of the contender's processes over the window per record in it, servers = "
                    "of both clusters' brokers and registries; ~ = a coarse window, a tenth of the records or more "
                    "became visible at once: that row's ratios use its steady figure)")
    rounds = any((r.get("round") or 1) > 1 for r in rows)
    for col in ("value B", "contender", *(("round",) if rounds else ()), "records", "rec/s 10-90%", "rec/s steady", "MB/s steady", "CPU us/rec",
                "servers us/rec", "wall s", "startup s", "peak RSS MB", "x MM2", "x MM2 tuned", "x raw", "load 1m",
                "status"):
        t.add_column(col, justify="left" if col in ("contender", "status") else "right",
                     no_wrap=col == "contender", min_width=20 if col == "contender" else None)
    for r in rows:
        if r["phase"] != "throughput":
            continue
        t.add_row(str(r["size"]), r["contender"], *((f"{r.get('round')}.{r.get('position')}",) if rounds else ()),
                  _f(r.get("records")), _f(r.get("records_per_s_window")) + (" ~" if r.get("window_coarse") else ""),
                  _f(r.get("records_per_s")), _f(r.get("mb_per_s"), "{:.2f}"),
                  _f((r.get("cpu_window") or {}).get("mirror_us_per_record"), "{:.1f}"),
                  _f((r.get("cpu_window") or {}).get("servers_us_per_record"), "{:.1f}"),
                  _f(r.get("wall_s"), "{:.1f}"), _f(r.get("startup_s"), "{:.1f}"),
                  _f((r.get("memory") or {}).get("peak_rss_mb")), _f(r.get(f"x_{MM2}"), "{:.2f}"),
                  _f(r.get(f"x_{MM2_TUNED}"), "{:.2f}"), _f(r.get(f"x_{RAW}"), "{:.2f}"), _load(r),
                  r.get("status", "?") if r.get("status") == "ok" else f"[red]{r.get('status')}: {r.get('error', '')[:60]}")
    return t


def _cores(cores: dict[str, Any]) -> str:
    """A latency row's cores while the rate ran: the contender's, the source brokers', the destination's."""
    return "/".join(_f(cores.get(k), "{:.2f}") for k in ("mirror", "src_brokers", "dst_brokers"))


def latency_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="Continuous replication latency (dst consume time - src produce call, fixed rate)")
    rounds = any((r.get("round") or 1) > 1 for r in rows if r["phase"] == "latency")
    for col in ("contender", *(("round",) if rounds else ()), "rate/s", "received", "p50 ms", "p99 ms", "p99 after 2 s", "max ms", "ready s", "peak RSS MB",
                "cores mirror/src/dst", "p50 x MM2", "p99 x MM2", "p99 x MM2 tuned", "p50 x raw", "load 1m", "status"):
        t.add_column(col, justify="left" if col in ("contender", "status") else "right",
                     no_wrap=col == "contender", min_width=20 if col == "contender" else None)
    for r in rows:
        if r["phase"] != "latency":
            continue
        t.add_row(r["contender"], *((f"{r.get('round')}.{r.get('position')}",) if rounds else ()), _f(r.get("rate")),
                  f"{_f(r.get('received'))}/{_f(r.get('sent'))}",
                  _f(r.get("p50_ms"), "{:.1f}"), _f(r.get("p99_ms"), "{:.1f}"), _f(r.get("p99_settled_ms"), "{:.1f}"),
                  _f(r.get("max_ms"), "{:.1f}"), _f(r.get("ready_s"), "{:.1f}"), _f((r.get("memory") or {}).get("peak_rss_mb")),
                  _cores(r.get("cores") or {}), _f(r.get(f"p50_x_{MM2}"), "{:.2f}"), _f(r.get(f"p99_x_{MM2}"), "{:.2f}"),
                  _f(r.get(f"p99_x_{MM2_TUNED}"), "{:.2f}"), _f(r.get(f"p50_x_{RAW}"), "{:.2f}"), _load(r),
                  r.get("status", "?") if r.get("status") == "ok" else f"[red]{r.get('status')}: {r.get('error', '')[:60]}")
    return t


def print_tables(console: Console, rows: list[dict[str, Any]]) -> None:
    if any(r["phase"] == "throughput" for r in rows):
        console.print(throughput_table(rows))
        summary = summarize(rows)
        if summary:
            console.print(summary_table(summary))
    if any(r["phase"] == "latency" for r in rows):
        console.print(latency_table(rows))
        summary = summarize_latency(rows)
        if summary:
            console.print(latency_summary_table(summary))


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    tmp.replace(path)
