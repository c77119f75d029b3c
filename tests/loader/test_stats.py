"""LoaderStats merging, the queue gauges driven by hand, and the bottleneck verdict on
constructed numbers (no clocks: every time below is given, not measured)."""

from __future__ import annotations

import pickle
from concurrent.futures import Executor, Future

import pytest

from tokenloom.loader.observe.bottleneck import bottleneck
from tokenloom.loader.observe.gauge import PipelineGauge, TransitGauge
from tokenloom.loader.observe.stats import LoaderStats


class _Inline(Executor):
    """An executor that runs each call at once, in the caller's thread."""

    def submit(self, fn, /, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201
        fut: Future = Future()
        fut.set_result(fn(*args, **kwargs))
        return fut


def test_increments_from_workers_add_up_and_maxima_merge_by_max():
    a, b = LoaderStats(rows_planned=10), LoaderStats(rows_planned=10)
    start = a.copy()
    a.steps, a.tokens, a.pipeline_seconds, a.packed_max, a.capacity = 3, 300, 2.0, 5, 8
    b.steps, b.tokens, b.pipeline_seconds, b.packed_max, b.capacity = 2, 200, 1.5, 7, 8
    total = LoaderStats(rows_planned=10)
    total.add(a.delta(start))
    total.add(b.delta(start))
    total.add(b.delta(b))  # a batch carrying no new work changes nothing
    assert (total.steps, total.tokens, total.pipeline_seconds) == (5, 500, 3.5)
    assert (total.packed_max, total.capacity, total.rows_planned) == (7, 8, 10)


def test_pipeline_gauge_moves_steps_through_the_queues():
    gauge, stats, pool = PipelineGauge(), LoaderStats(), _Inline()
    gauge.start(capacity=4)

    def group(n):  # noqa: ANN001, ANN202 - a read group: rows fetched, then packed
        gauge.fetched()
        return list(range(n))

    first = gauge.submit(pool, group, 2, steps=2)
    second = gauge.submit(pool, lambda: [0, 1], steps=2)  # never says fetched: still counted
    assert gauge.take(first) == [0, 1] and gauge.take(second) == [0, 1]
    for _ in range(4):
        gauge.handed_out(stats)
    assert (stats.pipelines, stats.capacity) == (1, 4)
    assert (stats.planned_max, stats.read_max, stats.packed_max) == (2, 2, 4)
    assert stats.pipeline_seconds >= stats.full_seconds >= 0
    assert min(stats.planned_area, stats.read_area, stats.packed_area) >= 0
    gauge.fetched()  # outside a group: ignored

    again = pickle.loads(pickle.dumps(gauge))  # what a DataLoader worker receives
    again.start(capacity=4)
    again.take(again.submit(pool, group, 2, steps=2))
    again.handed_out(stats)
    assert stats.pipelines == 2 and stats.packed_max == 4


def test_transit_gauge_splits_the_stall_and_keeps_the_peak():
    stats, transit = LoaderStats(), TransitGauge(window=8)
    transit.arrive(sent=0.5, asked=0.0, received=1.0, first=True, stats=stats)  # start-up
    transit.arrive(sent=0.8, asked=1.1, received=1.2, first=False, stats=stats)
    transit.arrive(sent=1.5, asked=1.3, received=1.6, first=False, stats=stats)
    # batch 2 waited 0.1 after asking (it was sent before); batch 3 waited 0.2, 0.1 of it in
    # transit; transit time counts from the first arrival: 0.2 + 0.1
    assert stats.transfer_seconds == pytest.approx(0.2)
    assert stats.transit_area == pytest.approx(0.3)
    assert stats.transit_max == 2  # batch 2 was in transit when batch 1 arrived


def _stats(**kw) -> LoaderStats:  # noqa: ANN003
    base = {"steps": 100, "wall_seconds": 10.0, "pipelines": 1, "pipeline_seconds": 10.0}
    return LoaderStats(**{**base, **kw})


def test_verdict_names_the_consumer_when_it_barely_waits():
    v = bottleneck(_stats(wait_seconds=0.2, full_seconds=9.5, starved_seconds=0.1))
    assert v.stage == "consumer"
    assert v.text.startswith(
        "the consumer is the bottleneck: the packed queue was full 95% of the time"
    )
    assert v.stall == pytest.approx(0.02)


def test_verdict_names_reading_or_packing_when_the_pipelines_starve():
    v = bottleneck(_stats(wait_seconds=8, starved_seconds=8.3, read_seconds=5, pack_seconds=1))
    assert v.stage == "read"
    assert v.text.startswith(
        "reading is the bottleneck: the packed queue was empty 83% of the time while reads "
        "were in flight (fetch 50.00 ms vs pack 10.00 ms per step)"
    )
    v = bottleneck(_stats(wait_seconds=8, starved_seconds=8.3, read_seconds=1, pack_seconds=5))
    assert v.stage == "pack" and v.text.startswith("packing is the bottleneck")


def test_verdict_names_the_transfer_or_the_handover_when_batches_were_ready():
    v = bottleneck(_stats(wait_seconds=5, transfer_seconds=4, starved_seconds=0.5, full_seconds=8))
    assert v.stage == "transfer"
    assert "waited for data 50% of the time (50.00 ms per step), 80% of it after" in v.text
    v = bottleneck(_stats(wait_seconds=5, starved_seconds=0.5, full_seconds=3))
    assert v.stage == "handover"
    assert "empty only 5% and full 30% of the time" in v.text


def test_verdict_without_one_clock_or_the_other():
    assert bottleneck(_stats(steps=0)).stage == "unknown"
    assert bottleneck(LoaderStats(steps=5)).stage == "unknown"
    no_gauge = _stats(wait_seconds=5, pipelines=0, pipeline_seconds=0)
    assert bottleneck(no_gauge).stage == "loader"
    # a PackedDataset iterated directly has no consumer clock: the pipeline's fractions decide
    direct = {"wall_seconds": 0.0, "pipeline_seconds": 10.0}
    assert bottleneck(_stats(**direct, starved_seconds=7, read_seconds=1)).stage == "read"
    assert bottleneck(_stats(**direct, full_seconds=7)).stage == "consumer"
    assert bottleneck(_stats(**direct, full_seconds=2, starved_seconds=2)).stage == "none"
    # elapsed stands in for a missing wall clock
    assert bottleneck(_stats(wall_seconds=0, wait_seconds=1), elapsed=100).stage == "consumer"


def test_merged_workers_give_time_weighted_fractions():
    merged = LoaderStats(steps=10, wall_seconds=10, wait_seconds=8, read_seconds=2)
    for starved in (9.0, 7.0):  # two workers, 10 s each
        merged.add({"pipelines": 1, "pipeline_seconds": 10.0, "starved_seconds": starved})
    v = bottleneck(merged)
    assert v.starved == pytest.approx(0.8) and v.stage == "read"
    assert v.text in merged.summary() and merged.to_json()["bottleneck"] == "read"
    assert "queue mean/max per pipeline" in merged.summary()
