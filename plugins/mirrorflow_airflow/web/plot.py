"""The lag-over-time plot, drawn on the server by matplotlib (Agg, no display, no network) as SVG."""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Sequence
from datetime import datetime

_LOCK = threading.Lock()  # pyplot's figure registry is process-global; the page's requests are not


def lag_plot_svg(series: Sequence[tuple[datetime, int, float | None]], title: str) -> str:
    """An SVG document: total lag in records (left axis) and the largest lag in seconds (right axis) over
    time. Fonts are drawn as paths, so the image needs nothing from outside."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.dates as mdates
    from matplotlib.figure import Figure

    with _LOCK, matplotlib.rc_context({"svg.fonttype": "path", "font.size": 9}):
        fig = Figure(figsize=(7.5, 2.4), dpi=100)
        ax = fig.add_subplot()
        if series:
            times = [t for t, _, _ in series]
            ax.plot(times, [r for _, r, _ in series], color="#1f6feb", marker="o", markersize=3,
                    linewidth=1.5, label="lag (records)")
            secs = [(t, s) for t, _, s in series if s is not None]
            if secs:
                ax2 = ax.twinx()
                ax2.plot([t for t, _ in secs], [s for _, s in secs], color="#d1242f", linestyle="--",
                         linewidth=1.2, label="lag (seconds)")
                ax2.set_ylabel("seconds", color="#d1242f")
                ax2.set_ylim(bottom=0)
            ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))
        else:
            ax.text(0.5, 0.5, "no lag samples yet", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
        peak = max((r for _, r, _ in series), default=0)
        ax.set_ylim(0, max(10, peak * 1.15))  # a caught-up mirror sits on the floor, not mid-axis
        ax.set_ylabel("records", color="#1f6feb")
        ax.set_title(title, loc="left")
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def as_data_uri(svg: str) -> str:
    """The SVG as an ``<img src>`` value: self-contained, and its ids cannot clash with the page's."""
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()
