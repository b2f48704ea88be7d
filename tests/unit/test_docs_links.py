"""The README and docs/ send readers to other files of the project (docs/benchmarks.md, bench/README.md, the
screenshots): a link to a file that was moved or renamed is a dead end for a user reading them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: a markdown link or image whose target is not a web address or an anchor in the same page
_LOCAL_LINK = re.compile(r"\]\((?!https?://|#|mailto:)([^)\s#]+)(?:#[^)]*)?\)")


def local_links(text: str) -> list[str]:
    return _LOCAL_LINK.findall(text)


def test_local_links_are_found():
    text = "see [a](docs/a.md), ![b](b.png), [c](https://x.y/z), [d](#anchor), [e](../bench/README.md#rounds)"
    assert local_links(text) == ["docs/a.md", "b.png", "../bench/README.md"]


@pytest.mark.parametrize("doc", ["README.md", "bench/README.md", *sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))])
def test_every_local_link_resolves(doc):
    path = ROOT / doc
    dead = [link for link in local_links(path.read_text()) if not (path.parent / link).exists()]
    assert dead == [], f"{doc}: links to files that do not exist: {dead}"


def test_readme_sends_readers_to_the_benchmark_record():
    """The README summarises the figures; the runs behind them are in docs/benchmarks.md."""
    readme = (ROOT / "README.md").read_text()
    record = (ROOT / "docs" / "benchmarks.md").read_text()
    assert "(docs/benchmarks.md)" in readme
    # every run the summary table names (its last column) is in the record
    section = readme[readme.index("### Where it stands"):readme.index("## docker-compose.yaml")]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| goal ")]
    # a row for each goal of the performance issue
    goals = ["drains at 1.2x the tuned MirrorMaker 2", "drains at 1.0x the raw python pipe",
             "how throughput grows with partitions", "memory per 10,000 partitions in flight",
             "one and two Spark executors", "replication latency p50", "replication latency p99"]
    assert [g for g in goals if not any(row.startswith(f"| {g}") for row in rows)] == []
    for row in rows:
        runs = row.rstrip().rstrip("|").split("|")[-1]
        times = re.findall(r"\d\d:\d\d", runs)
        assert times, f"README's summary row names no run: {row[:80]}"
        for t in times:
            assert t in record, f"README's summary names a run at {t} that docs/benchmarks.md does not hold"
