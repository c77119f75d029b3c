"""``bench loader --rounds``: a case's rounds merged into one result, and a ratio of two loaders
read as the median of their rounds' ratios (each pair measured in the same round), on results
made by hand: no measurement, no timing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tokenloom.bench.loader_cases import CaseResult, merge_rounds
from tokenloom.bench.loader_report import LoaderBench, format_report, ratio_of, round_ratios


def _run(rate: float, *, seconds: float = 2.0, label: str = "a", **kw: object) -> CaseResult:
    tokens = int(rate * seconds)
    return CaseResult(
        label=label, kind="tokenloom", workers=0, tokens=tokens, steps=tokens // 8192,
        seconds=seconds, windows=[rate], **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_merge_sums_the_rounds_and_keeps_each_rate():
    rounds = [
        _run(10e6, first_batch_s=1.0, peak_rss_mb=500.0, peak_pss_mb=400.0, processes=1),
        _run(30e6, seconds=1.0, first_batch_s=3.0, peak_rss_mb=700.0, peak_pss_mb=300.0),
    ]
    merged = merge_rounds(rounds)
    assert merged.tokens == rounds[0].tokens + rounds[1].tokens
    assert merged.seconds == 3.0
    assert merged.tokens_per_s == pytest.approx(50e6 / 3)  # pooled, not the mean of rates
    assert merged.rounds == [pytest.approx(10e6), pytest.approx(30e6)]
    assert merged.windows == [10e6, 30e6]
    assert merged.first_batch_s == 2.0
    assert merged.peak_rss_mb == 700.0 and merged.peak_pss_mb == 400.0
    assert merged.processes == 1 and merged.ok
    assert merge_rounds([rounds[0]]) is rounds[0]  # one round: as measured, no rates list


def test_a_failed_round_fails_the_case():
    ok, failed = _run(10e6), _run(0.0, error="boom")
    merged = merge_rounds([ok, failed, ok])
    assert not merged.ok and merged.error == "round 2 of 3: boom"
    unknown = merge_rounds([ok, _run(20e6, peak_pss_mb=None)])
    assert unknown.ok and unknown.peak_pss_mb is None  # a round without PSS: unknown


def test_merge_refuses_rounds_of_different_cases():
    with pytest.raises(ValueError, match="one case"):
        merge_rounds([_run(1e6), _run(1e6, label="b")])
    with pytest.raises(ValueError, match="no results"):
        merge_rounds([])


def test_ratio_is_the_median_of_paired_rounds():
    """Round 3's slow spell hit b alone: the pooled ratio follows it, the paired median does
    not."""
    a = merge_rounds([_run(20e6), _run(21e6), _run(19e6)])
    b = merge_rounds([_run(25e6, label="a"), _run(26e6, label="a"), _run(9e6, label="a")])
    ratios = round_ratios(a, b)
    assert ratios == pytest.approx([0.8, 21 / 26, 19 / 9])
    assert ratio_of(a, b) == pytest.approx(21 / 26)
    assert a.tokens_per_s / b.tokens_per_s == pytest.approx(1.0)  # what one pooled ratio says


def test_ratio_of_single_runs_or_unequal_rounds_is_the_rates_ratio():
    a, b = _run(20e6), _run(25e6)
    assert round_ratios(a, b) == [] and ratio_of(a, b) == pytest.approx(0.8)
    three = merge_rounds([_run(20e6), _run(20e6), _run(20e6)])
    two = merge_rounds([_run(10e6), _run(30e6)])
    assert round_ratios(three, two) == [] and ratio_of(three, two) == pytest.approx(1.0)
    assert ratio_of(a, _run(0.0)) is None


def test_cpu_a_token_sums_the_rounds_and_sits_beside_the_bound():
    """The tree's CPU time over the measured windows: summed over rounds, per token delivered,
    shown in the table and beside the like-for-like read bound's on tokenloom's line."""
    from tokenloom.bench.loader import LoaderBenchConfig
    from tokenloom.bench.loader_report import _BOUND, _TL0

    tl = merge_rounds(
        [_run(20e6, label=_TL0, cpu_seconds=2.0), _run(20e6, label=_TL0, cpu_seconds=1.0)]
    )
    assert tl.cpu_seconds == 3.0
    assert tl.cpu_ns_per_token == pytest.approx(3.0 / 80e6 * 1e9)  # 37.5 ns
    assert merge_rounds([_run(1e6, cpu_seconds=1.0), _run(1e6)]).cpu_seconds is None
    assert (
        _run(1e6).cpu_ns_per_token is None and _run(0.0, cpu_seconds=1.0).cpu_ns_per_token is None
    )
    bound = replace(
        merge_rounds([_run(25e6, label=_BOUND, cpu_seconds=1.5)] * 2), kind="read-bound"
    )
    bench = LoaderBench(config=LoaderBenchConfig(docs=10, steps=1), results=[tl, bound])
    text = format_report(bench)
    assert "CPU 37.5 ns a token against the read bound's 30.0 (workers=0)" in text
    row = next(line for line in text.splitlines() if line.startswith(_TL0))
    assert " 37.5 " in row
    assert _run(1e6).to_json()["cpu_ns_per_token"] is None
    assert tl.to_json()["cpu_ns_per_token"] == 37.5
