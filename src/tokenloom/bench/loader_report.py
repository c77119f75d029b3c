"""What one ``tokenloom bench loader`` run measured: the results, the goals judged on them, and
the printed report. The table's ratio column is tokenloom with two workers over each loader; the
goals compare each loader at its best (with workers or in-process) with tokenloom at its best,
and tokenloom with the **read bound** (plain takes of the same rows, no packing), all measured in
one run."""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from tokenloom.bench.loader_cases import CaseResult
from tokenloom.bench.loader_data import Built

if TYPE_CHECKING:
    from tokenloom.bench.loader import LoaderBenchConfig

__all__ = [
    "Goal",
    "LoaderBench",
    "format_report",
    "cache_cell",
    "fmt_ns",
    "in_process",
    "ratio_of",
    "round_ratios",
]


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

    @property
    def primary(self) -> list[CaseResult]:
        """The results at the goals' batch size (``config.batch_size``): the main table's rows;
        the protocol's sweep (:mod:`tokenloom.bench.protocol`) reads all of :attr:`results`."""
        return [r for r in self.results if r.batch_size == self.config.batch_size]

    def attach(self, label: str, key: str, figures: dict, batch_size: int | None = None) -> None:
        """Add a later pass's figures (``model``, ``shuffle``) to the results of loader ``label``
        (at ``batch_size``; ``None``: at every batch size), as ``figures[key]``."""
        for result in self.results:
            if result.label == label and batch_size in (None, result.batch_size):
                result.figures[key] = figures

    @property
    def cache(self) -> str:
        """The page-cache state the goals are judged in: ``warm`` when it was measured."""
        modes = tuple(self.config.cache)
        return "warm" if "warm" in modes else modes[0]

    def find(
        self, label: str, cache: str | None = None, batch_size: int | None = None
    ) -> CaseResult | None:
        """The successful run of ``label`` in ``cache`` (default: :attr:`cache`) at
        ``batch_size`` (default: the goals' ``config.batch_size``)."""
        cache = cache or self.cache
        size = batch_size or self.config.batch_size
        return next(
            (
                r
                for r in self.results
                if r.label == label and r.cache == cache and r.batch_size == size and r.ok
            ),
            None,
        )

    @property
    def reference(self) -> CaseResult | None:
        """tokenloom with two workers on the normal table: the denominator of every ratio."""
        return self.find(_TL2)

    @property
    def best_lancedb(self) -> CaseResult | None:
        """LanceDB's fastest setting, with workers or in-process."""
        runs = [r for r in self.primary if r.kind == "lancedb" and r.cache == self.cache and r.ok]
        return max(runs, key=lambda r: r.tokens_per_s) if runs else None

    def best(self, label: str) -> CaseResult | None:
        """The faster of ``label`` (a loader with two workers) and its in-process run."""
        runs = [r for r in (self.find(label), self.find(in_process(label))) if r is not None]
        return max(runs, key=lambda r: r.tokens_per_s) if runs else None

    @property
    def bound(self) -> CaseResult | None:
        """The read bound: plain takes of the same rows, no packing (``read-bound``), the
        faster of its in-process run and its run with two workers (when measured)."""
        return self.best_bound()

    def best_bound(
        self, cache: str | None = None, batch_size: int | None = None
    ) -> CaseResult | None:
        """The faster read bound (in-process or with two workers) in ``cache`` at ``batch_size``."""
        runs = [r for r in (self.find(b, cache, batch_size) for b in (_BOUND, _BOUND2)) if r]
        return max(runs, key=lambda r: r.tokens_per_s) if runs else None

    def bound_like(self, result: CaseResult) -> CaseResult | None:
        """The read bound with as many DataLoader workers as ``result`` (like for like)."""
        label = _BOUND2 if result.workers > 0 else _BOUND
        return self.find(label, result.cache, result.batch_size)

    def of_bound(self, result: CaseResult, like: bool = False) -> float | None:
        """``result``'s tokens/s as a share of the best read bound measured in the same cache
        state (``like``: of the read bound with the same number of workers)."""
        bound = (
            self.bound_like(result) if like else self.best_bound(result.cache, result.batch_size)
        )
        if bound is None or not result.ok:
            return None
        return ratio_of(result, bound)

    def ratio(self, result: CaseResult) -> float | None:
        """tokenloom (workers=2) tokens/s, in the same page-cache state and at the same batch
        size, over this result's."""
        ref = self.find(_TL2, result.cache, result.batch_size)
        if ref is None or not result.ok:
            return None
        return ratio_of(ref, result)

    def build_of(self, result: CaseResult) -> Built | None:
        """The input (table or derived copy) a result read."""
        return self.builds.get(result.data)

    def goals(self) -> list[Goal]:
        ref, lancedb, find, best = self.reference, self.best_lancedb, self.find, self.best
        top = best(_TL2)  # tokenloom at its best against every other loader at its best
        # (goal, numerator, denominator, target): one measured throughput over another
        ratios = [
            (">= 0.8x the read bound, in-process", find(_TL0), find(_BOUND), 0.8),
            (">= 0.8x the read bound, workers=2", ref, self.bound, 0.8),
            (">= 0.8x the read bound with two workers, workers=2", ref, find(_BOUND2), 0.8),
            (">= 15x LanceDB StreamingDataset (best of sweep)", top, lancedb, 15.0),
            (">= 1.2x pre-packed MDS (MosaicML Streaming)", top, best(_MDS), 1.2),
            (">= 1.0x a pre-packed Lance blocks copy", top, best(_PREPACKED), 1.0),
            (">= 1.5x random-access Parquet", top, best(_PARQUET), 1.5),
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
        tl = [
            r
            for r in self.primary
            if r.kind == "tokenloom" and r.ok and not r.options and r.cache == self.cache
        ]
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
                    f"{worst.baseline_rss_mb:,.0f} MB of it the training process's imports)"
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
                {**r.to_json(), "ratio_vs_reference": _significant(self.ratio(r), 4)}
                for r in self.results
            ],
            "best_lancedb": self.best_lancedb.label if self.best_lancedb else None,
            "goals": [g.to_json() for g in self.goals()],
        }


_TL0 = "tokenloom (workers=0)"
_TL2 = "tokenloom (workers=2)"
_BOUND = "read bound: Lance take of the same rows, 1,024 per take, no packing (workers=0)"
_BOUND2 = "read bound: Lance take of the same rows, 1,024 per take, no packing (workers=2)"
_LONG = "tokenloom long docs (workers=2)"
_BESTFIT = "tokenloom best-fit (workers=2)"
_MIXTURE = "tokenloom 70/30 mixture (workers=2)"
_MDS = "MDS pre-packed (workers=2)"
_MDS_SHUFFLE = "MDS pre-packed in order, its py1e shuffle (workers=2)"
_WEBDATASET = "WebDataset pre-packed shards (workers=2)"
_PARQUET = "Parquet random row groups (workers=2)"
_PARQUET_ORDER = "Parquet in original order (workers=2)"
_PARQUET_PRESHUFFLED = "Parquet pre-shuffled, row groups in order (workers=2)"
_PARQUET_ROWS = "Parquet random single rows (workers=2)"
_PREPACKED = "Lance pre-packed blocks, sequential scan (workers=2)"


def in_process(label: str) -> str:
    """The label of a loader's in-process run, from its label with two workers."""
    return label.replace("(workers=2)", "(workers=0)")


def round_ratios(a: CaseResult, b: CaseResult) -> list[float]:
    """``a``'s tokens/s over ``b``'s, round by round (``--rounds``: the two measured in the same
    round, minutes apart at most); empty unless both ran the same rounds, more than one."""
    if len(a.rounds) < 2 or len(a.rounds) != len(b.rounds) or not all(b.rounds):
        return []
    return [x / y for x, y in zip(a.rounds, b.rounds, strict=True)]


def ratio_of(a: CaseResult, b: CaseResult) -> float | None:
    """``a``'s rate as a multiple of ``b``'s: over several rounds the median of the rounds'
    ratios (:func:`round_ratios`: a slow spell of a shared machine moves one round, not the
    figure), else the ratio of the two runs."""
    ratios = round_ratios(a, b)
    if ratios:
        return float(statistics.median(ratios))
    return a.tokens_per_s / b.tokens_per_s if b.tokens_per_s > 0 else None


def _div(a: CaseResult | None, b: CaseResult | None) -> float | None:
    if a is None or b is None:
        return None
    value = ratio_of(a, b)
    return None if value is None else round(value, 3)


def _pair(a: CaseResult | None, b: CaseResult | None) -> str:
    def one(r: CaseResult | None) -> str:
        return f"{r.label} {r.tokens_per_s / 1e6:.2f}M tok/s" if r is not None else "not measured"

    text = f"{one(a)} / {one(b)}"
    ratios = round_ratios(a, b) if a is not None and b is not None else []
    if ratios:
        each = ", ".join(f"{x:.2f}" for x in ratios)
        text += f"; median of {len(ratios)} rounds' ratios ({each})"
    return text


def _mb(value: float | None) -> str:
    return f"{value:,.0f} MB" if value is not None else "n/a"


def _significant(value: float | None, digits: int) -> float | None:
    """``value`` to ``digits`` significant digits (a tiny ratio must not round to 0)."""
    return None if value is None else float(f"{value:.{digits}g}")


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
        + (
            f"; {cfg.rounds} rounds, every loader once a round: a rate is the rounds' pooled "
            "one, a ratio the median of the rounds' ratios"
            if cfg.rounds > 1
            else ""
        )
    )
    for name, b in bench.builds.items():
        if name != "table":
            lines.append(
                f"{name} copy: {b.mbytes:,.0f} MB, built in {b.seconds:.1f}s"
                f"{' (earlier run, reused)' if b.cached else ''}"
            )
    head = (
        f"{'loader':<62} {'cache':>9} {'tok/s':>9} {'ratio':>7} {'CPU ns/tok':>10} "
        f"{'1st batch':>9} {'RSS MB':>8} {'PSS MB':>8} {'data MB':>8} {'build':>7}"
    )
    lines += ["", head, "-" * len(head)]
    best = bench.best_lancedb
    for r in bench.primary:
        cache = cache_cell(r)
        if not r.ok:
            lines.append(
                f"{r.label:<62} {cache:>9} FAILED: {(r.error or 'no batches').splitlines()[0]}"
            )
            continue
        ratio = bench.ratio(r)
        mark = " *" if r is best else ""
        built = bench.build_of(r)
        lines.append(
            f"{(r.label + mark):<62} {cache:>9} {r.tokens_per_s / 1e6:>8.2f}M "
            f"{_fmt_ratio(ratio):>7} {fmt_ns(r.cpu_ns_per_token):>10} "
            f"{r.first_batch_s:>8.2f}s {r.peak_rss_mb:>8,.0f} "
            f"{(f'{r.peak_pss_mb:,.0f}' if r.peak_pss_mb is not None else 'n/a'):>8} "
            f"{(f'{built.mbytes:,.0f}' if built else 'n/a'):>8} "
            f"{(f'{built.seconds:.1f}s' if built else 'n/a'):>7}"
        )
    lines.append(
        "ratio = tokenloom (workers=2) tok/s / this loader's, same cache state; * = best LanceDB "
        "setting (with workers or in-process); cache = page-cache state (share of the input "
        "resident) at the start; CPU ns/tok = CPU time (user + system) of the loader's whole "
        "process tree per token delivered; data MB / build = the input read (table or derived "
        "copy): bytes on disk and build time"
    )
    for r in bench.primary:
        share = bench.of_bound(r) if r.kind == "tokenloom" else None
        if share is not None:
            like = bench.of_bound(r, like=True)
            same = (
                f"; like for like: {like:.2f}x of the read bound (workers={r.workers})"
                if like is not None
                else ""
            )
            lines.append(
                f"  {r.label} [{r.cache}]: {share:.2f}x of the read bound (its best run){same}"
                f"{_cpu_beside(r, bench.bound_like(r))}"
            )
    lines += [f"  [{r.label}, {r.cache}] {r.cache_note}" for r in bench.primary if r.cache_note]
    lines += ["", "goals:"]
    for g in bench.goals():
        rss = "RSS" in g.name
        unit = " MB" if rss else "x"
        value = "n/a" if g.value is None else f"{g.value:,.0f}{unit}" if rss else f"{g.value:.2f}x"
        target = f"{'>=' if g.higher_is_better else '<='} {g.target:,g}{unit}"
        lines.append(f"  {g.status:<4} {g.name}: {value} (target {target}); {g.detail}")
    for r in bench.primary:
        if r.ok and r.notes:
            lines.append(f"  [{r.label}] {r.notes}")
    return "\n".join(lines)


def cache_cell(result: CaseResult) -> str:
    """``warm 100%`` / ``cold 0%``: the state asked for and the share of the input resident."""
    if result.resident is None:
        return result.cache
    return f"{result.cache} {result.resident:.0%}"


def _fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def fmt_ns(value: float | None) -> str:
    """A CPU-nanoseconds-a-token figure for the tables (``n/a``: not measured)."""
    return "n/a" if value is None else f"{value:.1f}"


def _cpu_beside(result: CaseResult, bound: CaseResult | None) -> str:
    """``result``'s CPU a token beside the like-for-like read bound's: where a gap in speed is
    work the loader adds and where it is the machine's (processes contending for its cores)."""
    ours = result.cpu_ns_per_token
    theirs = bound.cpu_ns_per_token if bound is not None else None
    if ours is None or theirs is None:
        return ""
    assert bound is not None
    return (
        f"; CPU {ours:.1f} ns a token against the read bound's {theirs:.1f} "
        f"(workers={bound.workers})"
    )
