"""The Mirrors page's model and rendering: lag samples in, what a user sees out (no Airflow, no broker)."""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime, timedelta

from mirrorflow_airflow.web.model import build_page, group_of, parse_sample
from mirrorflow_airflow.web.plot import lag_plot_svg
from mirrorflow_airflow.web.render import as_json, render

from mirror_core.lag_samples import totals, with_throughput

T0 = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)


def sample(group: str, at: datetime, parts: list[tuple[str, int, int, float | None, int, int]],
           checkpoint: datetime | None = None, **extra) -> dict:
    """A record_lag sample: parts are (topic, partition, lag records, lag seconds, source end, dst end)."""
    lags = [secs for *_, secs, _, _ in parts if secs is not None]
    return {"group": group, "taken_at": at.isoformat().replace("+00:00", "Z"),
            "partitions": [{"source_topic": t, "destination_topic": f"{t}.mirror", "partition": p,
                            "lag_records": lag, "lag_seconds": secs, "source_end": se, "destination_end": de}
                           for t, p, lag, secs, se, de in parts],
            "lag_records": sum(lag for _, _, lag, *_ in parts), "max_lag_seconds": max(lags) if lags else None,
            "last_checkpoint_at": checkpoint.isoformat() if checkpoint else None, **extra}


def recorded(*samples: dict) -> tuple[list[dict], list[dict]]:
    """What the record_lag task leaves of these samples (oldest first): the newest whole, each one's totals."""
    out, before = [], None
    for s in samples:
        before = with_throughput(s, before)
        out.append(before)
    return out[-1:], [totals(s) for s in out]


def page_of(*samples: dict, states: dict | None = None, now: datetime = T0):  # noqa: ANN201
    newest, history = recorded(*samples)
    return build_page(newest, history, states or {}, now=now)


def test_latest_sample_per_partition_with_throughput_and_checkpoint_age():
    page = page_of(
        sample("prod", T0, [("orders", 0, 400, 12.0, 800, 400), ("orders", 1, 300, 9.0, 900, 600)]),
        sample("prod", T0 + timedelta(seconds=60), [("orders", 0, 50, 2.5, 1050, 1000), ("orders", 1, 0, None, 900, 900)],
               checkpoint=T0 + timedelta(seconds=55)),
        states={"prod": "running"}, now=T0 + timedelta(seconds=90))
    (g,) = page.groups
    assert g.group == "prod" and g.stream_state == "running" and g.stream_dag_id == "mirrorflow__prod__stream"
    assert g.taken_at == T0 + timedelta(seconds=60)
    assert [(r.partition, r.lag_records, r.lag_seconds) for r in g.rows] == [(0, 50, 2.5), (1, 0, None)]
    # (1000 - 400) / 60 s and (900 - 600) / 60 s
    assert [r.throughput for r in g.rows] == [10.0, 5.0]
    assert g.throughput == 15.0
    assert g.total_lag_records == 50 and g.max_lag_seconds == 2.5
    assert g.last_checkpoint_age_seconds == 35.0 and g.sample_age_seconds == 30.0
    assert [(t, r, s) for t, r, s in g.series] == [(T0, 700, 12.0), (T0 + timedelta(seconds=60), 50, 2.5)]


def test_groups_without_samples_and_malformed_samples():
    newest, history = recorded(sample("a", T0, [("x", 0, 1, 0.5, 2, 1)]))
    junk = [{"group": "a", "taken_at": "yesterday"}, "junk",
            {"group": "a", "taken_at": T0.isoformat(), "partitions": [{"partition": 0}], "lag_records": "many"}]
    page = build_page([*newest, *junk], [*history, *junk], {"a": None, "b": "failed"}, now=T0)
    assert [(g.group, g.stream_state, len(g.rows), len(g.series)) for g in page.groups] == \
        [("a", None, 1, 1), ("b", "failed", 0, 0)]
    assert page.groups[0].throughput is None  # one sample: no rate yet
    assert page.groups[1].last_checkpoint_age_seconds is None


def test_dag_id_parsing():
    assert group_of("mirrorflow__prod__stream", "stream") == "prod"
    assert group_of("mirrorflow__a__b__offset_sync", "offset_sync") == "a__b"
    assert group_of("mirrorflow____stream", "stream") is None
    assert group_of("other__prod__stream", "stream") is None


def test_rendered_page_has_the_figures_and_a_self_contained_plot():
    page = page_of(*[sample("prod", T0 + timedelta(minutes=i), [("orders", 0, 100 - 10 * i, 5.0 - i, 1000 + 50 * i,
                                                               900 + 60 * i)], checkpoint=T0) for i in range(5)],
                   states={"prod": "running"}, now=T0 + timedelta(minutes=5))
    html = render(page, hours=6)
    assert "prod" in html and "running" in html and "mirrorflow__prod__stream" in html
    assert ">60<" in html  # the last sample's lag in records
    assert "1.0" in html   # ... its lag in seconds (5.0 - 4)
    assert ">1.0<" in html and "records/s" in html and "5m ago" in html
    uris = re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', html)
    assert len(uris) == 1
    svg = base64.b64decode(uris[0]).decode()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    # nothing is fetched from anywhere: no script, no stylesheet or font link, no http(s) asset
    assert "<script" not in html and "<link" not in html
    assert not re.search(r'(src|href)="https?://', html)
    assert not re.search(r'href="https?://|url\(https?://|@import', svg)  # xmlns names are not fetched


def test_plot_without_samples_says_so():
    svg = lag_plot_svg([], "empty")
    assert "<svg" in svg and "<path" in svg  # text drawn as paths: no font needed


def test_what_record_lag_records_holds_no_secret_of_the_config_so_the_page_shows_none(monkeypatch):
    """The page shows only what the record_lag task recorded (it never reads the config): so what that task
    records (lag_sample, then its throughput and totals) must hold nothing of the clusters' settings. The config
    carries a planted password in both clusters' properties and in the registry URL; the Kafka reads are
    stubbed. The sample's fields are pinned: a new one is a decision to review, not something that slips in."""
    import json
    from types import SimpleNamespace

    import yaml

    from mirror_core import clients, lag_samples, stops
    from mirror_core.config import parse_config
    from mirror_core.health import LagReport, PartitionLag

    planted = "s3cr3t-Pl4nted-pw"
    cfg = parse_config(yaml.safe_load(f"""
clusters:
  src:
    kafka: {{bootstrap.servers: "src:9093", security.protocol: SASL_SSL, sasl.mechanism: PLAIN,
            sasl.username: mirror, sasl.password: "{planted}"}}
    schema_registry: {{url: "https://alice:{planted}@registry.example/apis/ccompat/v7"}}
  dst:
    kafka: {{bootstrap.servers: "dst:9093", security.protocol: SASL_SSL, sasl.mechanism: PLAIN,
            sasl.username: mirror, sasl.password: "{planted}"}}
groups:
  - {{name: prod, source: src, destination: dst, mirrors: [{{source_topic: orders}}]}}
"""), env={})
    group = cfg.group("prod")
    monkeypatch.setattr(lag_samples, "replication_lag", lambda cfg, group, mappings: LagReport(
        [PartitionLag("prod", "prod__orders__orders", "orders", 0, 120, 100, 20, 1.5)]))
    topics = SimpleNamespace(topics={"orders": SimpleNamespace(error=None)})
    monkeypatch.setattr(clients, "admin", lambda cluster, **kw: SimpleNamespace(list_topics=lambda timeout: topics))
    monkeypatch.setattr(clients, "end_offsets", lambda cluster, topic, **kw: {0: (0, 101)})
    monkeypatch.setattr(clients, "read_partition", lambda *args, **kw: iter(()))
    monkeypatch.setattr(stops, "requested", lambda cfg, group, timeout=None: None)

    sample = with_throughput(lag_samples.lag_sample(cfg, group), None)
    assert set(sample) == {"group", "taken_at", "partitions", "lag_records", "max_lag_seconds",
                           "last_checkpoint_at", "stream_stopped", "throughput"}
    assert [set(p) for p in sample["partitions"]] == [{
        "source_topic", "destination_topic", "partition", "lag_records", "lag_seconds", "source_end",
        "destination_end", "throughput"}]
    assert planted not in json.dumps([sample, totals(sample)])
    page = build_page([sample], [totals(sample)], {"prod": "running"}, now=T0)
    assert planted not in render(page, hours=6) and planted not in json.dumps(as_json(page))
    assert "orders" in render(page, hours=6)  # the page was drawn from the sample


def test_values_are_escaped():
    raw = [sample("prod", T0, [("<script>alert(1)</script>", 0, 1, 0.1, 2, 1)])]
    html = render(page_of(*raw), hours=1)
    assert "<script>alert" not in html and "&lt;script&gt;" in html
    assert parse_sample(raw[0]) is not None


def test_a_group_a_failover_stopped_says_so_and_why():
    """After a failover the group's lag grows for good: the page says the stream is stopped and why (escaped:
    the reason is a record's text on the destination)."""
    stopped = "failover of group prod to dst at 2026-11-26T09:00:00Z <b>"
    prod = [sample("prod", T0, [("orders", 0, 40, 2.0, 1040, 1000)], stream_stopped=None),
            sample("prod", T0 + timedelta(seconds=60), [("orders", 0, 50, 2.5, 1050, 1000)], stream_stopped=stopped)]
    dev = sample("dev", T0, [("orders", 0, 0, 0.0, 10, 10)], stream_stopped=None)

    def page(*more: dict, at: int = 90):  # noqa: ANN202
        newest, history = recorded(*prod, *more)
        return build_page([*newest, dev], [*history, totals(dev)], {"prod": "success", "dev": "running"},
                          now=T0 + timedelta(seconds=at))

    by = {g.group: g for g in page().groups}
    assert by["prod"].stream_stopped == stopped and by["dev"].stream_stopped is None
    html = render(page(), hours=6)
    assert "stopped for good: failover of group prod to dst at 2026-11-26T09:00:00Z &lt;b&gt;" in html
    assert html.count("stopped for good") == 1
    assert [g["stream_stopped"] for g in as_json(page())["groups"]] == [None, stopped]
    # a sample whose task could not read the stop leaves the field out: the newest record that has it decides
    unread = sample("prod", T0 + timedelta(seconds=120), [("orders", 0, 60, 3.0, 1060, 1000)])
    assert page(unread, at=130).groups[1].stream_stopped == stopped
    # a resumed group is no longer shown as stopped
    later = sample("prod", T0 + timedelta(seconds=180), [("orders", 0, 0, 0.0, 1050, 1050)], stream_stopped=None)
    assert page(unread, later, at=190).groups[1].stream_stopped is None
    # not a reason: a number, a mapping, blanks (none is shown, and none stands for a reason either)
    for odd in (123, {"reason": "x"}, "   "):
        odd_sample = sample("prod", T0 + timedelta(seconds=240), [("orders", 0, 0, 0.0, 1, 1)], stream_stopped=odd)
        assert page(odd_sample, at=250).groups[1].stream_stopped == (None if odd == "   " else stopped), odd


def test_the_table_is_the_newest_sample_and_the_plot_the_totals():
    """Rows come from the group's newest sample only; the plot from its totals, oldest first, whatever order."""
    samples = [sample("prod", T0 + timedelta(minutes=i), [("orders", 0, 10 * i, float(i), 100 + i, 90)])
               for i in range(4)]
    newest, history = recorded(*samples)
    older = recorded(*samples[:2])[0]  # a sample its task failed to delete: the newest one wins
    page = build_page([*older, *newest], history[::-1], {}, now=T0 + timedelta(minutes=4))
    (g,) = page.groups
    assert [(r.lag_records, r.source_end) for r in g.rows] == [(30, 103)]
    assert [r for _, r, _ in g.series] == [0, 10, 20, 30]
    assert [h["lag_records"] for h in as_json(page)["groups"][0]["history"]] == [0, 10, 20, 30]
    # a stream task waiting for its next try is shown as such, with Airflow's name for it
    html = render(build_page(newest, history, {"prod": "up_for_retry"}, now=T0), hours=6)
    assert '"state up_for_retry">up_for_retry<' in html
