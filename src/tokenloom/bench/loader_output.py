"""The files one ``tokenloom bench loader`` run leaves: its JSON, a Markdown table and a PNG
chart, written to one folder (the work dir unless ``--out`` names another), never the cwd; and
the protocol's files for the text workload (:func:`protocol_rows`, written by
:func:`tokenloom.bench.protocol_output.write_protocol`): ``loader-bench-protocol.json``/``.md``,
``loader-bench-throughput.png`` and a ``loader-bench-usage-<loader>.png`` per loader.

The chart follows :mod:`tokenloom.stats.plot`: matplotlib (``pip install 'tokenloom[plot]'``)
imported only on call and drawn on the Agg canvas without ``pyplot``. Without matplotlib the
JSON and Markdown are still written and the missing chart is said, not raised: the measuring
took minutes and must not be lost to a plotting extra.
"""

from __future__ import annotations

import json
import os

from tokenloom.bench.loader_cases import CaseResult
from tokenloom.bench.loader_report import LoaderBench, cache_cell, fmt_ns
from tokenloom.bench.protocol import ProtocolRow, usage_summary

__all__ = ["STEM", "markdown_report", "plot_bench", "protocol_rows", "write_outputs"]

STEM = "loader-bench"
"""File names: ``loader-bench.json``, ``.md``, ``.png``."""


def _mb(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def markdown_report(bench: LoaderBench) -> str:
    """One Markdown table of every run, then the goals: what ``docs/bench-loader.md`` shows."""
    cfg = bench.config
    built = bench.builds.get("table")
    budget = f"{cfg.steps} batches" if cfg.steps else f"{cfg.seconds:g} s"
    corpus = f"Corpus: {built.docs:,} documents, {built.tokens:,} tokens; " if built else ""
    lines = [
        f"{corpus}batches of ({cfg.batch_size}, {cfg.seq_len}), {budget} per loader after its "
        f"first batch, {os.cpu_count()} CPUs, page cache: {', '.join(cfg.cache)}.",
        "",
        "| loader | cache | tok/s | tokenloom w=2 ÷ this | CPU ns/token | 1st batch | peak RSS MB "
        "| peak PSS MB | input | input MB | input build |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    best = bench.best_lancedb
    for r in bench.primary:
        b = bench.build_of(r)
        source = (
            f"{r.data} | {b.mbytes:,.0f} | {b.seconds:.1f} s" if b else f"{r.data or 'n/a'} | | "
        )
        if not r.ok:
            error = (r.error or "no batches").splitlines()[0].replace("|", "\\|")
            lines.append(f"| {r.label} | {cache_cell(r)} | failed: {error} | | | | | | {source} |")
            continue
        ratio = bench.ratio(r)
        label = f"{r.label} (best LanceDB)" if r is best else r.label
        lines.append(
            f"| {label} | {cache_cell(r)} | {r.tokens_per_s / 1e6:.2f}M | "
            f"{'n/a' if ratio is None else f'{ratio:.2f}x'} | {fmt_ns(r.cpu_ns_per_token)} | "
            f"{r.first_batch_s:.2f} s | "
            f"{_mb(r.peak_rss_mb)} | {_mb(r.peak_pss_mb)} | {source} |"
        )
    notes = [f"- {r.label} ({r.cache}): {r.cache_note}" for r in bench.primary if r.cache_note]
    if notes:
        lines += ["", *notes]
    lines += ["", "Goals:", ""]
    for g in bench.goals():
        unit = " MB" if "RSS" in g.name else "x"
        value = "n/a" if g.value is None else f"{g.value:,.{0 if unit == ' MB' else 2}f}{unit}"
        lines.append(f"- {g.status} {g.name}: {value}; {g.detail}")
    return "\n".join(lines) + "\n"


def plot_bench(bench: LoaderBench, path: str) -> str:
    """Horizontal bars of tokens/s per loader (one bar per page-cache state) beside peak RSS.

    Raises:
        MissingDependencyError: matplotlib is not installed; names the install line.
    """
    from tokenloom.errors import require

    require("matplotlib", extra="plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    labels = list(dict.fromkeys(r.label for r in bench.primary))
    modes = list(bench.config.cache)
    by_key: dict[tuple[str, str], CaseResult] = {(r.label, r.cache): r for r in bench.primary}
    height = 0.8 / len(modes)
    fig = Figure(figsize=(11, 0.45 * len(labels) + 1.6), dpi=100)
    FigureCanvasAgg(fig)
    rate, mem = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 1]})
    colours = {"warm": "tab:orange", "cold": "tab:blue"}
    for k, mode in enumerate(modes):
        ys = [i + (k - (len(modes) - 1) / 2) * height for i in range(len(labels))]
        runs = [by_key.get((label, mode)) for label in labels]
        toks = [r.tokens_per_s / 1e6 if r is not None and r.ok else 0.0 for r in runs]
        rss = [r.peak_rss_mb if r is not None and r.ok else 0.0 for r in runs]
        rate.barh(ys, toks, height=height, color=colours.get(mode), label=f"{mode} page cache")
        mem.barh(ys, rss, height=height, color=colours.get(mode))
        for y, value, r in zip(ys, toks, runs, strict=True):
            text = f" {value:.2f}M" if r is not None and r.ok else " failed"
            rate.text(value, y, text, va="center", fontsize=7)
    rate.set_yticks(range(len(labels)), labels, fontsize=8)
    rate.invert_yaxis()
    rate.set_xlabel("tokens/s (millions), (8, 1024) batches")
    mem.set_xlabel("peak RSS MB (all processes)")
    rate.legend(fontsize=8, loc="lower right")
    built = bench.builds.get("table")
    rate.set_title(
        f"{built.docs:,} docs, {built.tokens:,} tokens" if built else "loader benchmark",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def protocol_rows(
    bench: LoaderBench,
) -> tuple[list[ProtocolRow], dict[str, dict[int, list[dict]]]]:
    """The protocol's rows of a run (each loader at each batch size, in the goals' page-cache
    state; a sample is one block of ``L`` tokens) and each loader's usage series by batch size."""
    rows, series = [], {}
    seq_len = bench.config.seq_len
    order = {label: i for i, label in enumerate(dict.fromkeys(r.label for r in bench.results))}
    for r in sorted(bench.results, key=lambda r: (order[r.label], r.batch_size)):
        if r.cache != bench.cache:
            continue
        usage = usage_summary(r.series)
        model = r.figures.get("model") or {}
        shuffle = r.figures.get("shuffle") or {}
        rows.append(
            ProtocolRow(
                workload="text",
                loader=r.label,
                batch_size=r.batch_size,
                samples_per_s=[w / seq_len for w in r.windows] if r.ok else [],
                first_batch_s=r.first_batch_s if r.ok else None,
                cpu_mean_pct=usage["cpu_mean_pct"],
                peak_rss_mb=r.peak_rss_mb or None,
                peak_pss_mb=r.peak_pss_mb,
                stall_pct=list(model.get("window_stall_pct") or ()),
                model_samples_per_s=list(model.get("window_samples_per_s") or ()),
                movement=shuffle.get("movement"),
                batch_shards=shuffle.get("batch_shards"),
                batch_shards_uniform=shuffle.get("batch_shards_uniform"),
                error=r.error or model.get("error"),
            )
        )
        series.setdefault(r.label, {})[r.batch_size] = r.series
    return rows, series


def _protocol_header(bench: LoaderBench) -> str:
    cfg = bench.config
    built = bench.builds.get("table")
    corpus = f"{built.docs:,} documents, {built.tokens:,} tokens; " if built else ""
    budget = f"{cfg.steps} batches" if cfg.steps else f"{cfg.seconds:g} s"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    rounds = f", in each of {cfg.rounds} rounds" if cfg.rounds > 1 else ""
    return (
        f"Text workload: {corpus}blocks of {cfg.seq_len} tokens (a sample = one block), "
        f"batch sizes {', '.join(map(str, cfg.sizes))}, {cfg.epochs} epoch(s) of {budget} per "
        f"loader and size{rounds}, {os.cpu_count()} CPUs, load average at the end {load}."
    )


def write_outputs(bench: LoaderBench, out: str) -> dict[str, str]:
    """Write ``loader-bench.{json,md,png}`` and the protocol's files under ``out`` (created if
    missing).

    Returns:
        ``{"json": path, "markdown": path, "png": path or the reason it is missing, ...}`` and
        the protocol's files (see :func:`tokenloom.bench.protocol_output.write_protocol`).
    """
    from tokenloom.bench.protocol_output import write_protocol
    from tokenloom.errors import MissingDependencyError

    folder = os.path.abspath(os.path.expanduser(out))
    os.makedirs(folder, exist_ok=True)
    paths = {
        "json": os.path.join(folder, f"{STEM}.json"),
        "markdown": os.path.join(folder, f"{STEM}.md"),
    }
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(bench.to_json(), f, indent=2)
        f.write("\n")
    with open(paths["markdown"], "w", encoding="utf-8") as f:
        f.write(markdown_report(bench))
    try:
        paths["png"] = plot_bench(bench, os.path.join(folder, f"{STEM}.png"))
    except MissingDependencyError as exc:
        paths["png"] = f"not written: {exc}"
    rows, series = protocol_rows(bench)
    meta = {"workload": "text", "config": {"batch_sizes": list(bench.config.sizes)}}
    meta["config"].update(
        epochs=bench.config.epochs, rounds=bench.config.rounds, seq_len=bench.config.seq_len
    )
    paths.update(
        write_protocol(
            rows,
            series,
            folder,
            stem=STEM,
            header=_protocol_header(bench),
            title=f"text: samples/s ({bench.config.seq_len}-token blocks) per loader and B",
            meta=meta,
        )
    )
    return paths
