"""The report of a run: ``report.json`` (metrics) and ``report.html`` (plots a person opens).

Contract
--------
* A workload returns a :class:`Report`: headline figures, tables of results, and plots
  described as data (:class:`Plot`: named series of x/y points), never images.
* ``report.json`` holds exactly that data, cleaned (sorted keys, floats rounded; see
  simulations/metrics.py): the same scenario and seed give byte-identical files. Nothing that
  depends on the host (wall time, paths) goes in it.
* ``report.html`` is one self-contained page: the headline table, each plot rendered with
  matplotlib (Agg) to a PNG embedded as base64, the result tables, and the run's wall time.
  Without matplotlib the page carries the tables and says plots need ``pip install
  matplotlib`` (the ``sim`` extra).
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from simulations.metrics import clean


@dataclass
class Series:
    label: str
    x: list[float]
    y: list[float]
    #: optional band (e.g. p10..p90) drawn around y
    lo: list[float] | None = None
    hi: list[float] | None = None


@dataclass
class Plot:
    name: str
    title: str
    xlabel: str
    ylabel: str
    series: list[Series] = field(default_factory=list)
    logx: bool = False
    logy: bool = False
    #: horizontal/vertical reference lines: (label, value)
    hlines: list[tuple[str, float]] = field(default_factory=list)
    kind: str = "line"  # or "bar"

    def as_dict(self) -> dict[str, Any]:
        """Every field; a series without a band (``lo`` and ``hi``) leaves them out."""
        out = asdict(self)
        for series in out["series"]:
            if series["lo"] is None or series["hi"] is None:
                del series["lo"], series["hi"]
        return out


@dataclass
class Report:
    scenario: dict[str, Any]
    #: the research question this run answers, in one sentence
    question: str
    headline: dict[str, Any]
    results: dict[str, Any] = field(default_factory=dict)
    plots: list[Plot] = field(default_factory=list)
    invariants: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "plots": [p.as_dict() for p in self.plots]}

    def to_json(self) -> str:
        cleaned = clean(self.as_dict())
        return json.dumps(cleaned, indent=1, sort_keys=True, allow_nan=False) + "\n"


def report_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def render_png(plot: Plot) -> bytes | None:
    """The plot as PNG bytes, or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7.0, 4.2), dpi=110)
    try:
        for i, s in enumerate(plot.series):
            if plot.logx or plot.logy:  # a log axis cannot show values <= 0 (e.g. "never")
                s = _positive_points(plot, s)
                if not s.x:
                    continue
            _draw_series(ax, plot, i, s)
        _draw_axes(ax, plot)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)


def _positive_points(plot: Plot, s: Series) -> Series:
    """``s`` without the points a log axis of ``plot`` cannot show."""
    keep = [
        j
        for j in range(len(s.x))
        if (not plot.logx or s.x[j] > 0) and (not plot.logy or s.y[j] > 0)
    ]
    return Series(
        s.label,
        [s.x[j] for j in keep],
        [s.y[j] for j in keep],
        None if s.lo is None else [s.lo[j] for j in keep],
        None if s.hi is None else [s.hi[j] for j in keep],
    )


def _draw_series(ax: Any, plot: Plot, i: int, s: Series) -> None:
    """The ``i``-th series of ``plot``: bars side by side, or a line with its band."""
    if plot.kind == "bar":
        width = 0.8 / max(1, len(plot.series))
        xs = [j + i * width for j in range(len(s.x))]
        ax.bar(xs, s.y, width=width, label=s.label)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(s.x))])
        ax.set_xticklabels([str(v) for v in s.x])
        return
    ax.plot(s.x, s.y, marker="o" if len(s.x) <= 12 else None, markersize=4, label=s.label)
    if s.lo is not None and s.hi is not None:
        ax.fill_between(s.x, s.lo, s.hi, alpha=0.15)


def _draw_axes(ax: Any, plot: Plot) -> None:
    """Reference lines, scales, titles, grid and legend."""
    for label, value in plot.hlines:
        ax.axhline(value, linestyle="--", color="grey", linewidth=1)
        ax.annotate(
            label,
            (0.01, value),
            xycoords=("axes fraction", "data"),
            fontsize=8,
            color="grey",
            va="bottom",
        )
    if plot.logx and ax.has_data():
        ax.set_xscale("log")
    if plot.logy and ax.has_data():
        ax.set_yscale("log")
    ax.set_title(plot.title)
    ax.set_xlabel(plot.xlabel)
    ax.set_ylabel(plot.ylabel)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def _table(data: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_fmt(v))}</td></tr>"
        for k, v in data.items()
    )
    return f"<table>{rows}</table>"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(clean(value), sort_keys=True)[:2000]
    return str(value)


def render_html(report: Report, *, wall_s: float | None = None) -> str:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>symphony simulate: {html.escape(str(report.scenario.get('name')))}</title>",
        "<style>body{font-family:sans-serif;max-width:980px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
        "padding:3px 8px;text-align:left;font-size:14px}th{background:#f4f4f4}"
        "img{max-width:100%;border:1px solid #eee;margin:0.5em 0}"
        "code{background:#f4f4f4;padding:1px 4px}</style></head><body>",
        f"<h1>Scenario <code>{html.escape(str(report.scenario.get('name')))}</code></h1>",
        f"<p><b>Question.</b> {html.escape(report.question)}</p>",
        f"<p>{html.escape(str(report.scenario.get('description', '')))}</p>",
        "<h2>Headline</h2>",
        _table(report.headline),
    ]
    missing = False
    for plot in report.plots:
        png = render_png(plot)
        parts.append(f"<h2>{html.escape(plot.title)}</h2>")
        if png is None:
            missing = True
            continue
        b64 = base64.b64encode(png).decode()
        parts.append(f"<img alt='{html.escape(plot.name)}' src='data:image/png;base64,{b64}'>")
    if missing:
        parts.append(
            "<p>Plots need matplotlib: <code>pip install matplotlib</code> "
            "(the <code>sim</code> extra).</p>"
        )
    if report.invariants:
        parts += ["<h2>Invariants</h2>", _table(report.invariants)]
    for name, value in report.results.items():
        parts.append(f"<h2>Results: {html.escape(name)}</h2>")
        if isinstance(value, list) and value and isinstance(value[0], dict):
            keys = list(value[0])
            head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
            body = "".join(
                "<tr>"
                + "".join(f"<td>{html.escape(_fmt(row.get(k)))}</td>" for k in keys)
                + "</tr>"
                for row in value
            )
            parts.append(f"<table><tr>{head}</tr>{body}</table>")
        elif isinstance(value, dict):
            parts.append(_table(value))
        else:
            parts.append(f"<p>{html.escape(_fmt(value))}</p>")
    if report.notes:
        parts.append(
            "<h2>Notes</h2><ul>"
            + "".join(f"<li>{html.escape(n)}</li>" for n in report.notes)
            + "</ul>"
        )
    parts += ["<h2>Scenario</h2>", _table(report.scenario)]
    if wall_s is not None:
        parts.append(f"<p><small>Simulated in {wall_s:.1f} s of wall time.</small></p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write(report: Report, out_dir: Path, *, wall_s: float | None = None) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "report.json"
    html_path = out_dir / "report.html"
    json_path.write_text(report.to_json())
    html_path.write_text(render_html(report, wall_s=wall_s))
    return json_path, html_path
