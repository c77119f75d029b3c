"""Smoke test of ``tokenloom bench loader``: the result's structure on a tiny corpus, not timing.

Benchmarks print ratios measured side by side; they are never timed assertions in the suite.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("torch")

from tests.conftest import run_cli  # noqa: E402
from tokenloom.bench.loader import (  # noqa: E402
    LoaderBenchConfig,
    format_report,
    run_loader_bench,
)
from tokenloom.bench.loader_output import write_outputs  # noqa: E402


def test_loader_bench_smoke(tmp_path):
    """tokenloom (workers 2 and 0), Parquet and pre-packed Lance blocks on 2,000 docs, page
    cache dropped first: every number is positive; then the files a run leaves."""
    config = LoaderBenchConfig(
        docs=2000,
        steps=4,
        workdir=str(tmp_path),
        only=("tokenloom", "parquet", "prepacked"),
        cache=("cold",),
        isolate=False,
    )
    bench = run_loader_bench(config)

    assert [r.label for r in bench.results] == [
        "tokenloom (workers=2)",
        "tokenloom (workers=0)",
        "read bound: Lance take of the same rows, 1,024 per take, no packing (workers=0)",
        "Parquet random row groups (workers=2)",
        "Parquet random row groups (workers=0)",
        "Lance pre-packed blocks, sequential scan (workers=2)",
        "Lance pre-packed blocks, sequential scan (workers=0)",
    ]
    assert [r.workers for r in bench.results] == [2, 0, 0, 2, 0, 2, 0]
    for r in bench.results:
        assert r.error is None, r.error
        assert r.steps == 4
        assert r.tokens == 4 * 8 * 1024
        assert r.tokens_per_s > 0 and r.first_batch_s > 0
        assert r.peak_rss_mb > 0 and r.processes >= 1
        assert r.cache == "cold"
        assert r.resident is None or r.resident < 0.05 or "stayed cached" in r.cache_note
    assert [r.data for r in bench.results] == [
        *("table",) * 3,
        *("parquet",) * 2,
        *("prepacked",) * 2,
    ]
    assert bench.builds["table"].docs == 2000 and bench.builds["parquet"].docs == 2000
    assert bench.builds["table"].tokens == bench.builds["parquet"].tokens > 0
    assert bench.builds["prepacked"].docs == 2000 and bench.builds["prepacked"].tokens > 0

    goals = {g.name: g for g in bench.goals()}
    assert goals["peak RSS <= 1 GB (tokenloom, process + workers)"].value > 0
    ran = {
        ">= 0.8x the read bound, in-process",
        ">= 0.8x the read bound, workers=2",
        ">= 1.0x a pre-packed Lance blocks copy",
        ">= 1.5x random-access Parquet",
        "workers=2 >= in-process (workers=0)",
    }
    assert all(goals[name].value > 0 for name in ran)
    not_run = [g for g in goals.values() if "RSS" not in g.name and g.name not in ran]
    assert all(g.value is None and g.status == "n/a" for g in not_run)

    doc = json.loads(json.dumps(bench.to_json()))
    assert doc["reference"] == "tokenloom (workers=2)"
    assert [r["ratio_vs_reference"] > 0 for r in doc["results"]] == [True] * 7
    report = format_report(bench)
    assert "tokenloom (workers=2) [cold]: " in report and "x of the read bound" in report
    # each baseline's goal is judged on its faster run, with workers or in-process
    parquet = goals[">= 1.5x random-access Parquet"]
    fastest = max(bench.results[3:5], key=lambda r: r.tokens_per_s)
    assert f"{fastest.label} {fastest.tokens_per_s / 1e6:.2f}M" in parquet.detail

    written = write_outputs(bench, str(tmp_path / "out"))
    assert json.loads(open(written["json"]).read())["results"] == doc["results"]
    table = [ln for ln in open(written["markdown"]).read().splitlines() if ln.startswith("| ")]
    assert len(table) == 2 + len(bench.results)  # header, rule, one row per run
    rows = [ln for ln in table if ln.startswith("| Parquet random row groups")]
    assert len(rows) == 2 and all("| parquet | " in ln and "cold" in ln for ln in rows)
    with open(written["png"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"

    # The second run reuses the cached corpus (the same Parquet copy) instead of rebuilding it.
    again = run_loader_bench(dataclasses.replace(config, only=("parquet-order",), cache=("warm",)))
    assert again.builds["parquet"].cached
    assert [r.label for r in again.results] == [
        "Parquet in original order (workers=2)",
        "Parquet in original order (workers=0)",
    ]
    for result in again.results:
        assert result.ok and result.cache == "warm" and result.resident in (None, 1.0)


def test_rounds_measure_every_loader_in_turn_and_merge(tmp_path):
    """``rounds=2``: each loader measured twice, each time in turn with the others; one result
    per loader holding both rounds (their batches summed, each round's rate kept), and every
    goal that compares two of them reads the median of the rounds' ratios."""
    from tokenloom.bench.loader_report import round_ratios

    config = LoaderBenchConfig(
        docs=2000, steps=3, workdir=str(tmp_path), only=("tokenloom",), isolate=False, rounds=2
    )
    said: list[str] = []
    bench = run_loader_bench(config, log=said.append)
    measuring = [line for line in said if line.startswith("measuring ")]
    assert [line.split(" [")[1] for line in measuring] == [
        *("warm, round 1/2] ...",) * 3,
        *("warm, round 2/2] ...",) * 3,
    ]  # round 1 runs every loader, then round 2
    assert measuring[0].startswith("measuring tokenloom (workers=2)")
    assert measuring[3].startswith("measuring tokenloom (workers=2)")
    assert [r.label for r in bench.results] == [
        "tokenloom (workers=2)",
        "tokenloom (workers=0)",
        "read bound: Lance take of the same rows, 1,024 per take, no packing (workers=0)",
    ]
    for r in bench.results:
        assert r.ok and r.steps == 6 and r.tokens == 6 * 8 * 1024
        assert len(r.rounds) == 2 and all(x > 0 for x in r.rounds)
        assert len(r.windows) == 2
        assert r.cpu_seconds is not None and r.cpu_seconds >= 0  # both rounds' summed
    goals = {g.name: g for g in bench.goals()}
    tl0, bound = bench.results[1], bench.results[2]
    ratios = round_ratios(tl0, bound)
    goal = goals[">= 0.8x the read bound, in-process"]
    assert goal.value == round(sum(ratios) / 2, 3)  # the median of two: their mean
    assert "median of 2 rounds' ratios" in goal.detail
    text = format_report(bench)
    assert "2 rounds, every loader once a round" in text
    assert "CPU ns/tok" in text.splitlines()[text.splitlines().index("") + 1]  # the table's head


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--only", "tokenloom,petastorm"], "unknown loader(s) petastorm"),
        (["--cache", "warm,hot"], "warm,cold"),
        (["--gpu-sim", "124M,7B"], "--gpu-sim"),
        (["--store", "s3", "--latency-ms", "0,fast"], "is not a list of numbers"),
        (["--store", "s3", "--latency-ms", "-5"], "give latencies >= 0"),
        (["--store", "s3", "--latency-ms", ","], "give latencies >= 0"),
        (["--store", "s3", "--only", "lancedb,webdataset"], "--store s3 measures"),
        (["--store", "gcs"], "--store"),
        (["--store", "s3", "--docs", "1000", "--scale-docs", "1000"], "--scale-docs 100"),
        (["--scale-docs", "100"], "applies to --store s3 only"),
        (["--store", "s3", "--rounds", "3"], "applies to --store local only"),
        (["--rounds", "0"], "--rounds"),
    ],
)
def test_cli_refuses_bad_options_before_building_anything(tmp_path, args, says):
    """Every refusal of ``bench loader`` is a usage error (exit 2, through a real process) that
    names the option, and nothing is built or started first."""
    result = run_cli("bench", "loader", *args, "--workdir", str(tmp_path))
    assert result.returncode == 2, result.stderr
    assert says in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_lancedb_streaming_dataset_reads_the_tokenloom_table(tmp_path):
    """The LanceDB case reads the table itself (no metadata-free copy) and packs full blocks."""
    pytest.importorskip("lancedb")
    from tokenloom.bench.loader_cases import CaseSpec, measure_case
    from tokenloom.bench.loader_data import CorpusSpec, build_table

    uri = build_table(str(tmp_path / "t.lance"), CorpusSpec(docs=400)).path
    spec = CaseSpec(
        label="lancedb",
        kind="lancedb",
        path=uri,
        workers=0,
        seq_len=256,
        batch_size=4,
        steps=3,
        options=(("loader", "plain"), ("num_splits", 1)),
    )
    result = measure_case(spec)
    assert result.error is None and result.steps == 3 and result.tokens == 3 * 4 * 256


def _bound_case(tmp_path, *, workers: int, take_rows: int):  # noqa: ANN202
    """A read-bound case over a 300-document table filtered to two rows of three: the case, the
    selected rows' token lists, and their tokens sorted (what an epoch must deliver)."""
    import lance
    import numpy as np

    from tokenloom.bench.loader_cases import CaseSpec
    from tokenloom.bench.loader_data import CorpusSpec, build_table

    uri = build_table(str(tmp_path / "t.lance"), CorpusSpec(docs=300)).path
    keep = "id % 3 != 0"
    rows = lance.dataset(uri).to_table(columns=["input_ids"], filter=keep).column(0)
    want = np.sort(np.concatenate([np.asarray(r, dtype=np.int64) for r in rows.to_pylist()]))
    spec = CaseSpec(
        label="bound",
        kind="read-bound",
        path=uri,
        workers=workers,
        seq_len=64,
        batch_size=2,
        options=(("filter", keep), ("take_rows", take_rows)),
    )
    return spec, rows, want


def test_read_bound_takes_each_selected_row_once_per_epoch(tmp_path):
    """The read bound reads the rows tokenloom's filter selects, every one once per epoch, its
    tokens flattened as stored (no EOS, no packing), in (B, L) batches."""
    import numpy as np

    from tokenloom.bench.loader_cases import _Notes, read_bound_batches

    spec, rows, want = _bound_case(tmp_path, workers=0, take_rows=50)
    notes = _Notes()
    it = read_bound_batches(spec, notes)
    got = []
    while sum(b.numel() for b in got) < len(want):
        batch = next(it)
        assert tuple(batch.shape) == (2, 64) and str(batch.dtype) == "torch.int64"
        got.append(batch.reshape(-1))
    it.close()
    flat = np.concatenate([b.numpy() for b in got])[: len(want)]
    assert np.array_equal(np.sort(flat), want)
    assert notes.figures["rows_read"] >= len(rows)  # the whole selection was taken


def test_read_bound_in_workers_takes_each_selected_row_once_per_epoch(tmp_path):
    """With DataLoader workers the read bound takes the same rows as in-process: every selected
    row once per epoch across the workers (each takes every other take), its tokens as stored;
    and the report sets tokenloom with workers against it, like for like, beside the best."""
    import numpy as np

    from tokenloom.bench.loader import LoaderBenchConfig, plan_cases
    from tokenloom.bench.loader_cases import CaseResult, _Notes, read_bound_batches
    from tokenloom.bench.loader_report import LoaderBench

    spec, rows, want = _bound_case(tmp_path, workers=2, take_rows=30)
    notes = _Notes()
    it = read_bound_batches(spec, notes)
    got = []
    while sum(b.numel() for b in got) < len(want):
        got.append(next(it).reshape(-1))
    it.close()
    assert "2 DataLoader workers" in notes.text
    # the takes of the two workers interleave: the first epoch's tokens are the selection's
    flat = np.concatenate([b.numpy() for b in got])
    assert np.array_equal(np.sort(flat[: len(want)]), want)

    config = LoaderBenchConfig(docs=300, steps=1, only=("tokenloom", "bound-workers"))
    cases = plan_cases(config, {"table": spec.path})
    assert [(c.kind, c.workers) for c in cases] == [
        ("tokenloom", 2),
        ("tokenloom", 0),
        ("read-bound", 0),
        ("read-bound", 2),
    ]
    speeds = {
        ("tokenloom", 2): 8,
        ("tokenloom", 0): 6,
        ("read-bound", 0): 20,
        ("read-bound", 2): 10,
    }
    bench = LoaderBench(
        config=config,
        results=[
            CaseResult(
                label=c.label,
                kind=c.kind,
                workers=c.workers,
                seconds=1.0,
                tokens=speeds[c.kind, c.workers] << 20,
            )  # fmt: skip
            for c in cases
        ],
    )
    tl2, tl0 = bench.results[:2]
    assert bench.of_bound(tl2) == 8 / 20 and bench.of_bound(tl0) == 6 / 20  # the best bound
    assert bench.of_bound(tl2, like=True) == 8 / 10 and bench.of_bound(tl0, like=True) == 6 / 20
    goals = {g.name: g.value for g in bench.goals()}
    assert goals[">= 0.8x the read bound with two workers, workers=2"] == 0.8
    assert goals[">= 0.8x the read bound, workers=2"] == 0.4
    assert goals[">= 0.8x the read bound, in-process"] == 0.3


def _children() -> set[int]:
    """This process's live descendants."""
    import os

    from tokenloom.bench.loader_rss import tree_pids

    return set(tree_pids(os.getpid())) - {os.getpid()}


def test_the_tokenloom_case_keeps_its_workers_across_epochs_and_the_stream(tmp_path):
    """tokenloom's case with workers runs epoch after epoch on the same worker processes (as the
    read bound's takes run on; starting them again each epoch was most of an epoch's time on a
    small table), and delivers what the in-process case does, epoch boundaries included."""
    import torch

    from tokenloom.bench.loader_cases import CaseSpec, _Notes, tokenloom_batches
    from tokenloom.bench.loader_data import CorpusSpec, build_table
    from tokenloom.loader import PackedDataset

    uri = build_table(str(tmp_path / "t.lance"), CorpusSpec(docs=300)).path
    kw = dict(label="tl", kind="tokenloom", path=uri, seq_len=64, batch_size=2, eos_id=0, pad_id=0)
    per_epoch = len(
        PackedDataset(uri, seq_len=64, global_batch=2, block_order="sequential", eos_id=0, pad_id=0)
    )
    streams, kept = [], []
    for workers in (0, 2):
        it = tokenloom_batches(CaseSpec(workers=workers, **kw), _Notes())
        got = []
        for i in range(3 * per_epoch + 1):
            got.append(next(it))
            if workers and i % per_epoch == 1:  # early in each epoch: the workers running it
                kept.append(_children())
        it.close()
        streams.append(torch.stack(got))
    assert kept[0] and kept[0] == kept[1] == kept[2]
    assert torch.equal(streams[0], streams[1])
