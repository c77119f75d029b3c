"""``tokenloom bench loader --store s3`` end to end on a tiny corpus (cases in this process):
both Parquet baselines are measured beside tokenloom, the per-row one with tokenloom's measured
concurrency, the goal is checked against the per-row one, and the store side of every S3 case
(the proxy's requests, bytes, requests in flight; CPU) is reported."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")


def test_s3_bench_reports_both_parquet_baselines_and_the_store_side(tmp_path):
    from tokenloom.bench.loader import LoaderBenchConfig
    from tokenloom.bench.loader_s3 import S3BenchConfig, format_s3_report, run_s3_bench
    from tokenloom.dev.s3 import S3ServerError, weed_binary

    try:
        weed_binary()
    except S3ServerError as exc:
        pytest.skip(str(exc))
    run = LoaderBenchConfig(
        docs=300, steps=2, workdir=str(tmp_path), only=("tokenloom",), seq_len=128, isolate=False
    )
    config = S3BenchConfig(
        run=run,
        latencies_ms=(5.0,),
        only=("parquet", "tokenloom", "parquet-rows"),
        scale_docs=100,
    )
    assert config.only == ("tokenloom", "parquet-rows", "parquet")  # tokenloom measured first
    bench = run_s3_bench(config)

    store = "S3 5 ms"
    for where in ("local", store):
        assert all(bench.results[where][k].ok for k in config.only), bench.results[where]
    sizing = bench.results[store]["tokenloom"].figures
    assert sizing["span_rows"] > 0 and sizing["rows_read"] > 0
    assert bench.threads[store] == max(round(sizing["io_threads"]), 1)
    goals = {(name, s): goal for name, s, _, goal in bench.ratios()}
    assert goals[("tokenloom / Parquet rows, both S3", store)] == ">= 10"
    assert goals[("tokenloom / Parquet row groups", store)] == ""
    # the goals of a table beyond memory, checked on tokenloom's own run
    values = {(name, s): value for name, s, value, _ in bench.ratios()}
    assert goals[("tokenloom fetched / used bytes", store)] == "<= 1.5"
    assert values[("tokenloom fetched / used bytes", store)] == pytest.approx(
        io_bytes(bench, store) / sizing["bytes_read"]
    )
    assert 0 < values[("tokenloom peak RSS (GB)", store)] < 64
    assert bench.scaled[store].ok and bench.scaled_io[store].requests
    grew = values[("tokenloom RSS, this table / scale", store)]
    assert grew == pytest.approx(
        bench.results[store]["tokenloom"].peak_rss_mb / bench.scaled[store].peak_rss_mb
    )
    io = bench.io[store]["tokenloom"]
    assert io.requests and io.body_bytes and io.in_flight_peak and io.in_flight_peak >= 1
    assert io.server_cpu_s is not None and io.seconds > 0
    report = format_s3_report(bench)
    assert "a much weaker shuffle" in report and "Parquet single rows" in report
    assert "rows/GET" in report and "fetch spans" in report
    assert "tokenloom, 100 docs, S3 5 ms" in report
    assert "tokenloom fetched / used bytes" in report and "<= 1.5" in report
    assert not any(p.name.startswith("s3-") for p in tmp_path.iterdir())  # server data removed


def io_bytes(bench, store: str) -> int:
    return bench.io[store]["tokenloom"].body_bytes


def test_s3_bench_on_the_bytes_layout_reports_the_bare_per_row_takes(tmp_path):
    """``--token-layout bytes`` builds the table in that layout (a copy of its own), tokenloom
    reads it, and ``lance-rows`` (bare per-row takes: the store's bound) is measured beside it;
    the token reads' own fetched/used figures come from Lance's counters."""
    import lance

    from tokenloom.bench.loader import LoaderBenchConfig
    from tokenloom.bench.loader_s3 import S3BenchConfig, format_s3_report, run_s3_bench
    from tokenloom.dev.s3 import S3ServerError, weed_binary
    from tokenloom.table.tokens import layout_name

    try:
        weed_binary()
    except S3ServerError as exc:
        pytest.skip(str(exc))
    run = LoaderBenchConfig(
        docs=300, steps=2, workdir=str(tmp_path), only=("tokenloom",), seq_len=128, isolate=False
    )
    config = S3BenchConfig(
        run=run, latencies_ms=(0.0,), only=("lance-rows", "tokenloom"), layout="bytes"
    )
    bench = run_s3_bench(config)
    table = bench.builds["table"].path
    assert table.endswith("-bytes.lance")
    assert layout_name(lance.dataset(table).schema.field("input_ids")) == "bytes"
    store = "S3 0 ms"
    for where in ("local", store):
        for loader in ("tokenloom", "lance-rows"):
            result = bench.results[where][loader]
            assert result.ok and result.figures["rows_read"] > 0, result
    values = {(name, s): value for name, s, value, _ in bench.ratios()}
    assert values[("Lance per-row takes S3 / local", store)] > 0
    for loader in ("tokenloom", "lance-rows"):
        # a tiny table may be fetched whole before the first batch: nothing read after it
        reads = bench.results[store][loader].figures
        taken = reads["reads_taken"]
        want = pytest.approx(reads["reads_fetched"] / taken) if taken else None
        assert values[(f"  {loader} reads from batch 1", store)] == want
    assert "Lance per-row takes, no packing (store bound)" in format_s3_report(bench)


def test_token_layout_applies_to_the_s3_bench_only(tmp_path):
    from tests.conftest import run_cli

    out = run_cli("bench", "loader", "--token-layout", "bytes", "--workdir", str(tmp_path))
    assert out.returncode == 2 and "--token-layout" in out.stderr and "s3 only" in out.stderr
