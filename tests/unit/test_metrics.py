"""The end-of-run line of the driver's counters (mirror_core.metrics.counter_samples)."""

from __future__ import annotations

from mirror_core import metrics


def test_a_runs_counter_samples_are_its_groups_as_metrics_prints_them() -> None:
    metrics.DEAD.labels("cs-g", "cs-g__a__a").inc(2)
    metrics.EXPIRED.labels("cs-g", "cs-g__a__a").inc(5)
    metrics.REWOUND.labels("cs-g", "cs-g__b__b").inc(25)
    metrics.RECORDS.labels("cs-other", "cs-other__a__a").inc(7)  # another group's: not this run's line
    metrics.PHASE_SECONDS.labels("cs-g", "produce").inc(0.5)
    metrics.MISSES.labels("cs-g", "cs-g__a__a")  # nothing counted: not in the line
    metrics.BATCH_SECONDS.labels("cs-g").observe(1.0)  # a histogram: not a counter sample
    assert metrics.counter_samples("cs-g") == [
        'mirrorflow_records_dead_lettered_total{mirror="cs-g__a__a"} 2.0',
        'mirrorflow_source_offsets_rewound_total{mirror="cs-g__b__b"} 25.0',
        'mirrorflow_records_expired_total{mirror="cs-g__a__a"} 5.0',
        'mirrorflow_writer_seconds_total{phase="produce"} 0.5',
    ]
    assert metrics.counter_samples("cs-none") == []
