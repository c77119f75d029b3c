"""The files of one protocol run (:mod:`~tokenloom.bench.protocol`), per workload, under one
folder: ``<stem>-protocol.json`` (every row, every usage series), ``<stem>-protocol.md`` (the
table), ``<stem>-throughput.png`` (samples/s per loader per batch size, bars from min to max) and
``<stem>-usage-<loader>.png`` (CPU % and RSS/PSS over time, one line per batch size).

Charts use matplotlib on the Agg canvas without ``pyplot`` (as :mod:`tokenloom.stats.plot`),
imported only here; without it the JSON and Markdown are still written and each missing chart is
said, not raised: the measuring took minutes and must not be lost to a plotting extra.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence

from tokenloom.bench.protocol import ProtocolRow

__all__ = ["markdown_table", "plot_throughput", "plot_usage", "write_protocol", "slug"]


def slug(label: str) -> str:
    """A file name part from a label: ``tokenloom (workers=2)`` -> ``tokenloom-workers-2``; a
    long label keeps its start and its end (where ``workers=N`` is), 60 characters at most."""
    name = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
    if len(name) > 60:
        tail = name[-19:]
        name = f"{name[:40].strip('-')}-{tail[tail.find('-') + 1 :]}"  # the tail's whole words
    return name or "loader"


def _num(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def markdown_table(rows: Sequence[ProtocolRow], *, header: str = "") -> str:
    """The protocol's table: one line per loader and batch size.

    Columns: samples/s mean (min–max over the epochs), first batch, CPU % (mean, 100 = one
    core), peak RSS/PSS, with the model in the loop its samples/s and data stall %, and the
    shuffle figures (movement between epochs; source shards per batch vs a uniform draw).
    """
    lines = [header, ""] if header else []
    lines += [
        "| loader | B | samples/s mean (min–max) | 1st batch s | CPU % | peak RSS MB "
        "| peak PSS MB | model samples/s | data stall % | movement | shards/batch (uniform) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if r.error and not r.samples_per_s:
            error = r.error.splitlines()[0].replace("|", "\\|")
            lines.append(f"| {r.loader} | {r.batch_size} | failed: {error} | | | | | | | | |")
            continue
        rate, stall, model = r.rate, r.stall, r.model_rate
        shards = (
            "n/a"
            if r.batch_shards is None
            else f"{r.batch_shards:.1f} ({_num(r.batch_shards_uniform, '{:.1f}')})"
        )
        lines.append(
            f"| {r.loader} | {r.batch_size} | {rate.cell(1) if rate else 'n/a'} | "
            f"{_num(r.first_batch_s, '{:.2f}')} | {_num(r.cpu_mean_pct)} | "
            f"{_num(r.peak_rss_mb)} | {_num(r.peak_pss_mb)} | "
            f"{model.cell(2) if model else 'n/a'} | {stall.cell(1) if stall else 'n/a'} | "
            f"{_num(r.movement, '{:.3f}')} | {shards} |"
        )
    return "\n".join(lines) + "\n"


def _figure(width: float, height: float):  # noqa: ANN202 - a matplotlib Figure
    from tokenloom.errors import require

    require("matplotlib", extra="plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=80)
    FigureCanvasAgg(fig)
    return fig


def plot_throughput(rows: Sequence[ProtocolRow], path: str, *, title: str) -> str:
    """Grouped horizontal bars: samples/s per loader, one bar per batch size, a line from the
    slowest to the fastest epoch on each bar.

    Raises:
        MissingDependencyError: matplotlib is not installed; names the install line.
    """
    loaders = list(dict.fromkeys(r.loader for r in rows))
    sizes = sorted({r.batch_size for r in rows})
    fig = _figure(10, 0.5 * len(loaders) * max(len(sizes), 1) ** 0.5 + 1.6)
    ax = fig.subplots()
    height = 0.8 / len(sizes)
    by_key = {(r.loader, r.batch_size): r for r in rows}
    for k, size in enumerate(sizes):
        ys, means, errs = [], [], [[], []]
        for i, loader in enumerate(loaders):
            r = by_key.get((loader, size))
            rate = r.rate if r is not None else None
            ys.append(i + (k - (len(sizes) - 1) / 2) * height)
            means.append(rate.mean if rate else 0.0)
            errs[0].append(rate.mean - rate.low if rate else 0.0)
            errs[1].append(rate.high - rate.mean if rate else 0.0)
        ax.barh(ys, means, height=height, xerr=errs, capsize=2, label=f"B={size}")
    ax.set_yticks(range(len(loaders)), loaders, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("samples/s (mean over epochs; bars: min–max)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def plot_usage(series: dict[int, list[dict]], path: str, *, title: str) -> str:
    """CPU % (left axis) and RSS/PSS MB (right axis) over time, one colour per batch size.

    Args:
        series: Batch size -> usage points (dicts of
            :class:`~tokenloom.bench.loader_rss.UsagePoint`).
    """
    fig = _figure(8, 3.6)
    cpu = fig.subplots()
    mem = cpu.twinx()
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]
    for k, (size, points) in enumerate(sorted(series.items())):
        colour = colours[k % len(colours)]
        ts = [p["t"] for p in points]
        cpu.plot(ts, [p["cpu_pct"] for p in points], color=colour, lw=1, label=f"CPU B={size}")
        mem.plot(ts, [p["rss_mb"] for p in points], color=colour, lw=1, ls="--")
        pss = [(p["t"], p["pss_mb"]) for p in points if p.get("pss_mb") is not None]
        if pss:
            mem.plot(*zip(*pss, strict=True), color=colour, lw=1, ls=":")
    cpu.set_xlabel("seconds since the loader's process started")
    cpu.set_ylabel("CPU % (100 = one core), solid")
    mem.set_ylabel("MB: RSS dashed, PSS dotted")
    cpu.set_title(title, fontsize=9)
    cpu.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def write_protocol(
    rows: Sequence[ProtocolRow],
    series: dict[str, dict[int, list[dict]]],
    out: str,
    *,
    stem: str,
    header: str,
    title: str = "",
    meta: dict | None = None,
) -> dict[str, str]:
    """Write the protocol's JSON, Markdown and charts under ``out`` (created if missing).

    Args:
        series: Loader -> batch size -> usage points.
        header: The line above the Markdown table (what was measured, load average).
        title: The throughput chart's title (default: ``stem``).
        meta: What the JSON also records (configuration, load average, model).

    Returns:
        File kind -> path (a chart that could not be drawn: the reason instead of a path).
    """
    from tokenloom.errors import MissingDependencyError

    folder = os.path.abspath(os.path.expanduser(out))
    os.makedirs(folder, exist_ok=True)
    paths = {
        "protocol json": os.path.join(folder, f"{stem}-protocol.json"),
        "protocol markdown": os.path.join(folder, f"{stem}-protocol.md"),
    }
    doc = {**(meta or {}), "header": header, "rows": [r.to_json() for r in rows], "series": series}
    with open(paths["protocol json"], "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    with open(paths["protocol markdown"], "w", encoding="utf-8") as f:
        f.write(markdown_table(rows, header=header))
    try:
        paths["throughput chart"] = plot_throughput(
            rows, os.path.join(folder, f"{stem}-throughput.png"), title=title or stem
        )
        for loader, per_size in series.items():
            if any(per_size.values()):
                paths[f"usage chart {loader}"] = plot_usage(
                    per_size,
                    os.path.join(folder, f"{stem}-usage-{slug(loader)}.png"),
                    title=f"{loader}: CPU and memory of its process tree",
                )
    except MissingDependencyError as exc:
        paths["charts"] = f"not written: {exc}"
    return paths
