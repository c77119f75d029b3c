"""The files one ``tokenloom bench loader`` run leaves: its JSON, a Markdown table and a PNG
chart, written to one folder (the work dir unless ``--out`` names another), never the cwd.

The chart follows :mod:`tokenloom.stats.plot`: matplotlib (``pip install 'tokenloom[plot]'``)
imported only on call and drawn on the Agg canvas without ``pyplot``. Without matplotlib the
JSON and Markdown are still written and the missing chart is said, not raised: the measuring
took minutes and must not be lost to a plotting extra.
"""

from __future__ import annotations

import json
import os

from tokenloom.bench.loader_cases import CaseResult
from tokenloom.bench.loader_report import LoaderBench, cache_cell

__all__ = ["STEM", "markdown_report", "plot_bench", "write_outputs"]

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
        "| loader | cache | tok/s | tokenloom w=2 ÷ this | 1st batch | peak RSS MB "
        "| peak PSS MB | input | input MB | input build |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    best = bench.best_lancedb
    for r in bench.results:
        b = bench.build_of(r)
        source = (
            f"{r.data} | {b.mbytes:,.0f} | {b.seconds:.1f} s" if b else f"{r.data or 'n/a'} | | "
        )
        if not r.ok:
            error = (r.error or "no batches").splitlines()[0].replace("|", "\\|")
            lines.append(f"| {r.label} | {cache_cell(r)} | failed: {error} | | | | | {source} |")
            continue
        ratio = bench.ratio(r)
        label = f"{r.label} (best LanceDB)" if r is best else r.label
        lines.append(
            f"| {label} | {cache_cell(r)} | {r.tokens_per_s / 1e6:.2f}M | "
            f"{'n/a' if ratio is None else f'{ratio:.2f}x'} | {r.first_batch_s:.2f} s | "
            f"{_mb(r.peak_rss_mb)} | {_mb(r.peak_pss_mb)} | {source} |"
        )
    notes = [f"- {r.label} ({r.cache}): {r.cache_note}" for r in bench.results if r.cache_note]
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

    labels = list(dict.fromkeys(r.label for r in bench.results))
    modes = list(bench.config.cache)
    by_key: dict[tuple[str, str], CaseResult] = {(r.label, r.cache): r for r in bench.results}
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


def write_outputs(bench: LoaderBench, out: str) -> dict[str, str]:
    """Write ``loader-bench.{json,md,png}`` under ``out`` (created if missing).

    Returns:
        ``{"json": path, "markdown": path, "png": path or the reason it is missing}``.
    """
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
    return paths
