"""What one ``tokenloom bench loader`` run measured: the results, the goals judged on them, and
the printed report. Every ratio is tokenloom with two workers over another loader, in one run."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from tokenloom.bench.loader_cases import CaseResult
from tokenloom.bench.loader_data import Built

if TYPE_CHECKING:
    from tokenloom.bench.loader import LoaderBenchConfig

__all__ = ["Goal", "LoaderBench", "format_report"]


@dataclass(frozen=True, kw_only=True)
class Goal:
    """One goal of the issue, evaluated on this run's numbers."""

    name: str
    value: float | None
    """The measured ratio (or MB); ``None`` when a loader it needs did not run."""
    target: float
    higher_is_better: bool
    detail: str

    @property
    def passed(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.target if self.higher_is_better else self.value <= self.target

    @property
    def status(self) -> str:
        return {True: "PASS", False: "MISS", None: "n/a"}[self.passed]

    def to_json(self) -> dict:
        return {**asdict(self), "passed": self.passed, "status": self.status}


@dataclass(kw_only=True)
class LoaderBench:
    """Everything one run measured."""

    config: LoaderBenchConfig
    builds: dict[str, Built] = field(default_factory=dict)
    results: list[CaseResult] = field(default_factory=list)

    def find(self, label: str) -> CaseResult | None:
        return next((r for r in self.results if r.label == label and r.ok), None)

    @property
    def reference(self) -> CaseResult | None:
        """tokenloom with two workers on the normal table: the denominator of every ratio."""
        return self.find(_TL2)

    @property
    def best_lancedb(self) -> CaseResult | None:
        runs = [r for r in self.results if r.kind == "lancedb" and r.ok]
        return max(runs, key=lambda r: r.tokens_per_s) if runs else None

    def ratio(self, result: CaseResult) -> float | None:
        """tokenloom (workers=2) tokens/s over this result's."""
        ref = self.reference
        if ref is None or not result.ok:
            return None
        return ref.tokens_per_s / result.tokens_per_s

    def goals(self) -> list[Goal]:
        ref, lancedb = self.reference, self.best_lancedb
        find = self.find
        # (goal, numerator, denominator, target): one measured throughput over another
        ratios = [
            (">= 15x LanceDB StreamingDataset (best of sweep)", ref, lancedb, 15.0),
            (">= 1.2x pre-packed MDS (MosaicML Streaming)", ref, find(_MDS), 1.2),
            (">= 1.0x a pre-packed Lance blocks copy", ref, find(_PREPACKED), 1.0),
            (">= 1.5x random-access Parquet", ref, find(_PARQUET), 1.5),
            ("workers=2 >= in-process (workers=0)", ref, find(_TL0), 1.0),
            ("best-fit packing >= 0.8x concat", find(_BESTFIT), ref, 0.8),
            ("70/30 token-quota mixture >= 0.8x concat", find(_MIXTURE), ref, 0.8),
            ("long documents >= 0.8x normal", find(_LONG), ref, 0.8),
        ]
        out = [
            Goal(
                name=name,
                value=_div(a, b),
                target=target,
                higher_is_better=True,
                detail=_pair(a, b),
            )
            for name, a, b, target in ratios
        ]
        tl = [r for r in self.results if r.kind == "tokenloom" and r.ok and not r.options]
        worst = max(tl, key=lambda r: r.peak_rss_mb) if tl else None
        out.append(
            Goal(
                name="peak RSS <= 1 GB (tokenloom, process + workers)",
                value=round(worst.peak_rss_mb, 1) if worst else None,
                target=1024.0,
                higher_is_better=False,
                detail=(
                    f"max over tokenloom runs: {worst.label}, RSS {worst.peak_rss_mb:,.0f} MB "
                    f"(PSS {_mb(worst.peak_pss_mb)}, {worst.processes} processes, "
                    f"{worst.baseline_rss_mb:,.0f} MB of it per process is imports)"
                    if worst
                    else "no tokenloom run"
                ),
            )
        )
        return out

    def to_json(self) -> dict:
        ref = self.reference
        return {
            "config": asdict(self.config),
            "builds": {k: asdict(v) for k, v in self.builds.items()},
            "reference": ref.label if ref else None,
            "results": [
                {**r.to_json(), "ratio_vs_reference": _round(self.ratio(r), 3)}
                for r in self.results
            ],
            "best_lancedb": self.best_lancedb.label if self.best_lancedb else None,
            "goals": [g.to_json() for g in self.goals()],
        }


_TL0 = "tokenloom (workers=0)"
_TL2 = "tokenloom (workers=2)"
_LONG = "tokenloom long docs (workers=2)"
_BESTFIT = "tokenloom best-fit (workers=2)"
_MIXTURE = "tokenloom 70/30 mixture (workers=2)"
_TRANSPORT = "tokenloom, numpy transport prototype (workers=2)"
_MDS = "MDS pre-packed (workers=2)"
_PARQUET = "Parquet random row groups (workers=2)"
_PREPACKED = "Lance pre-packed blocks, sequential scan (workers=2)"


def _div(a: CaseResult | None, b: CaseResult | None) -> float | None:
    if a is None or b is None or b.tokens_per_s <= 0:
        return None
    return round(a.tokens_per_s / b.tokens_per_s, 3)


def _pair(a: CaseResult | None, b: CaseResult | None) -> str:
    def one(r: CaseResult | None) -> str:
        return f"{r.label} {r.tokens_per_s / 1e6:.2f}M tok/s" if r is not None else "not measured"

    return f"{one(a)} / {one(b)}"


def _mb(value: float | None) -> str:
    return f"{value:,.0f} MB" if value is not None else "n/a"


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def format_report(bench: LoaderBench) -> str:
    """The table of loaders and the goals, as printed by ``tokenloom bench loader``."""
    cfg = bench.config
    lines = []
    built = bench.builds.get("table")
    if built is not None:
        lines.append(
            f"corpus: {built.docs:,} docs, {built.tokens:,} tokens "
            f"(lognormal, median 450 / mean 800), {built.path}"
        )
    budget = f"{cfg.steps} batches" if cfg.steps else f"{cfg.seconds:g}s"
    lines.append(
        f"batches of ({cfg.batch_size}, {cfg.seq_len}) int64, {budget} per loader after its "
        f"first batch, {os.cpu_count()} CPUs, each loader in a fresh process"
    )
    for name in ("mds", "parquet", "prepacked", "long"):
        b = bench.builds.get(name)
        if b is not None:
            lines.append(
                f"{name} copy: {b.mbytes:,.0f} MB, built in {b.seconds:.1f}s"
                f"{' (earlier run, reused)' if b.cached else ''}"
            )
    head = f"{'loader':<62} {'tok/s':>9} {'ratio':>7} {'1st batch':>9} {'RSS MB':>8} {'PSS MB':>8}"
    lines += ["", head, "-" * len(head)]
    best = bench.best_lancedb
    for r in bench.results:
        if not r.ok:
            lines.append(f"{r.label:<62} FAILED: {(r.error or 'no batches').splitlines()[0]}")
            continue
        ratio = bench.ratio(r)
        mark = " *" if r is best else ""
        lines.append(
            f"{(r.label + mark):<62} {r.tokens_per_s / 1e6:>8.2f}M {_fmt_ratio(ratio):>7} "
            f"{r.first_batch_s:>8.2f}s {r.peak_rss_mb:>8,.0f} "
            f"{(f'{r.peak_pss_mb:,.0f}' if r.peak_pss_mb is not None else 'n/a'):>8}"
        )
    lines.append("ratio = tokenloom (workers=2) tok/s / this loader's; * = best LanceDB setting")
    lines += ["", "goals:"]
    for g in bench.goals():
        rss = "RSS" in g.name
        unit = " MB" if rss else "x"
        value = "n/a" if g.value is None else f"{g.value:,.0f}{unit}" if rss else f"{g.value:.2f}x"
        target = f"{'>=' if g.higher_is_better else '<='} {g.target:,g}{unit}"
        lines.append(f"  {g.status:<4} {g.name}: {value} (target {target}); {g.detail}")
    for r in bench.results:
        if r.ok and r.notes:
            lines.append(f"  [{r.label}] {r.notes}")
    return "\n".join(lines)


def _fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"
