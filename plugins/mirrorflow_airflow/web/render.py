"""The Mirrors page's HTML from its model: tables, figures and one server-drawn plot per group.

No script, no stylesheet or font from elsewhere: the page works without internet access.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from jinja2 import Environment, select_autoescape

from mirrorflow_airflow.web.model import PageModel
from mirrorflow_airflow.web.plot import as_data_uri, lag_plot_svg


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(max(0, seconds))
    if s < 120:
        return f"{s}s ago"
    if s < 7200:
        return f"{s // 60}m ago"
    return f"{s // 3600}h ago"


def _num(v: float | None, fmt: str = "{:,.0f}") -> str:
    return "-" if v is None else fmt.format(v)


_env = Environment(autoescape=select_autoescape(default=True, default_for_string=True))
_env.filters["age"] = _age
_env.filters["num"] = _num

PAGE = _env.from_string("""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{{ refresh }}">
<title>Mirrors - mirrorflow</title>
<style>
 body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px; color: #1f2328; }
 h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 0; }
 .muted { color: #656d76; font-size: 12px; }
 .group { border: 1px solid #d0d7de; border-radius: 6px; padding: 12px 16px; margin: 14px 0; }
 .head { display: flex; gap: 14px; align-items: baseline; flex-wrap: wrap; }
 .kpis { display: flex; gap: 22px; margin: 10px 0; flex-wrap: wrap; }
 .kpi b { display: block; font-size: 18px; } .kpi span { font-size: 12px; color: #656d76; }
 table { border-collapse: collapse; font-size: 13px; margin-top: 8px; }
 th, td { padding: 4px 10px; border-bottom: 1px solid #eaeef2; text-align: right; }
 th { background: #f6f8fa; } td.l, th.l { text-align: left; }
 .state { padding: 1px 8px; border-radius: 10px; font-size: 12px; color: white; background: #8c959f; }
 .state.running { background: #1a7f37; } .state.success { background: #2da44e; }
 .state.failed { background: #cf222e; } .state.queued { background: #9a6700; }
 .state.stopped { background: #57606a; } .state.up_for_retry, .state.up_for_reschedule { background: #bc4c00; }
 .state.upstream_failed { background: #cf222e; } .state.scheduled, .state.deferred { background: #8250df; }
 a { color: #0969da; text-decoration: none; }
 img.plot { max-width: 100%; margin-top: 8px; }
 .alert { border: 1px solid #cf222e; border-radius: 6px; padding: 8px 12px; background: #ffebe9; }
</style></head><body>
<h1>Mirrors</h1>
<div class="muted">Lag samples recorded by each group's <code>offset_sync</code> DAG (task <code>record_lag</code>),
last {{ hours|num("{:g}") }} h; stream: the <code>mirror_stream</code> task's state
in the latest run of the group's <code>stream</code> DAG.
Generated {{ page.generated_at.strftime("%Y-%m-%d %H:%M:%S") }} UTC; refreshes every {{ refresh }}s.</div>
{% if page.config_errors %}<p class="alert">The mirrors config has problems: {{ page.config_errors }} of its DAG
files fail to import, and the groups they name are left out (Airflow's <a target="_top" href="{{ base }}dags">DAG
import errors</a> name each group and its problems).</p>{% endif %}
{% if page.unmanaged %}<p class="alert">No longer in the config, or left out of it, while their stream was active:
{% for g, state in page.unmanaged %}<b>{{ g }}</b> (mirror_stream {{ state }}){{ ", " if not loop.last }}{% endfor %}.
A Spark job of theirs may still run, and nothing relaunches or stops it any more: fix the group (its DAGs come
back) or stop the job.</p>{% endif %}
{% if not page.groups %}<p>No mirrorflow DAGs or lag samples yet: unpause a group's
<code>offset_sync</code> DAG (it records a sample every run).</p>{% endif %}
{% for g in page.groups %}
<div class="group" id="group-{{ g.group }}">
 <div class="head"><h2>{{ g.group }}</h2>
  <span>mirror_stream: <a target="_top" href="{{ base }}dags/{{ g.stream_dag_id }}"><span class="state {{ g.stream_state or 'none' }}">{{ g.stream_state or "never ran" }}</span></a>{% if g.stream_stopped %}
   <span class="state stopped">stopped for good: {{ g.stream_stopped }}</span>{% endif %}</span>
  <span class="muted">sample {{ g.sample_age_seconds|age }} · <a target="_top" href="{{ base }}dags/{{ g.offset_sync_dag_id }}">offset_sync DAG</a></span>
 </div>
 <div class="kpis">
  <div class="kpi"><b>{{ g.total_lag_records|num }}</b><span>lag (records)</span></div>
  <div class="kpi"><b>{{ g.max_lag_seconds|num("{:,.1f}") }}</b><span>max lag (seconds)</span></div>
  <div class="kpi"><b>{{ g.throughput|num("{:,.1f}") }}</b><span>throughput (records/s)</span></div>
  <div class="kpi"><b>{{ g.last_checkpoint_age_seconds|age }}</b><span>last checkpoint</span></div>
 </div>
 {% if g.rows %}
 <table><tr><th class="l">source topic</th><th class="l">destination topic</th><th>partition</th>
  <th>source end</th><th>destination end</th><th>lag (records)</th><th>lag (s)</th><th>records/s</th></tr>
 {% for r in g.rows %}<tr><td class="l">{{ r.source_topic }}</td><td class="l">{{ r.destination_topic }}</td>
  <td>{{ r.partition }}</td><td>{{ r.source_end|num }}</td><td>{{ r.destination_end|num }}</td>
  <td>{{ r.lag_records|num }}</td><td>{{ r.lag_seconds|num("{:,.1f}") }}</td><td>{{ r.throughput|num("{:,.1f}") }}</td></tr>
 {% endfor %}</table>
 {% endif %}
 <img class="plot" alt="lag over time, group {{ g.group }}" src="{{ plots[g.group] }}">
</div>
{% endfor %}
</body></html>
""")


def render(page: PageModel, hours: float, refresh: int = 30, base: str = "/") -> str:
    """The page's HTML: tables, figures and one server-drawn plot per group (no script, no external asset)."""
    plots = {g.group: as_data_uri(lag_plot_svg(g.series, f"{g.group}: lag over time")) for g in page.groups}
    return PAGE.render(page=page, hours=hours, refresh=refresh, plots=plots, base=base)


def as_json(page: PageModel) -> dict[str, Any]:
    def iso(t: datetime | None) -> str | None:
        return t.isoformat() if t else None

    return {"generated_at": iso(page.generated_at), "config_import_errors": page.config_errors,
            "unmanaged_streams": [{"group": g, "stream_state": s} for g, s in page.unmanaged], "groups": [
        {"group": g.group, "stream_state": g.stream_state, "stream_stopped": g.stream_stopped,
         "taken_at": iso(g.taken_at),
         "last_checkpoint_age_seconds": g.last_checkpoint_age_seconds, "total_lag_records": g.total_lag_records,
         "max_lag_seconds": g.max_lag_seconds, "throughput": g.throughput,
         "partitions": [asdict(r) for r in g.rows],
         "history": [{"taken_at": iso(t), "lag_records": r, "max_lag_seconds": s} for t, r, s in g.series]}
        for g in page.groups]}
