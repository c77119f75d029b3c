"""The benchmark protocol's pure parts: the min–max aggregation, the batch-size list, the usage
summary, the shuffle figure on known permutations and the files a run leaves (no timing)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tokenloom.bench.loader_shuffle import shuffle_figures
from tokenloom.bench.protocol import ProtocolRow, parse_sizes, spread, usage_summary
from tokenloom.bench.protocol_output import markdown_table, slug, write_protocol


def test_spread_is_mean_with_min_and_max():
    s = spread([3.0, 1.0, 8.0])
    assert (s.mean, s.low, s.high, s.n) == (4.0, 1.0, 8.0, 3)
    assert s.cell(1) == "4.0 (1.0–8.0)"
    assert spread([2.5]).cell(2) == "2.50"  # one epoch: no range
    assert spread([]) is None


@pytest.mark.parametrize(
    ("text", "sizes"), [("4,8,16", (4, 8, 16)), (" 16, 4 ,16,", (16, 4)), ("1", (1,))]
)
def test_parse_sizes(text, sizes):
    assert parse_sizes(text) == sizes


@pytest.mark.parametrize(("text", "says"), [("4,x", "'x'"), ("0,8", "must be >= 1"), (",", "no")])
def test_parse_sizes_refuses_bad_entries(text, says):
    with pytest.raises(ValueError, match=says):
        parse_sizes(text)


def test_usage_summary():
    points = [
        {"t": 0.5, "cpu_pct": 100.0, "rss_mb": 200.0, "pss_mb": 150.0},
        {"t": 1.0, "cpu_pct": 50.0, "rss_mb": 300.0, "pss_mb": None},
    ]
    assert usage_summary(points) == {
        "cpu_mean_pct": 75.0,
        "cpu_peak_pct": 100.0,
        "rss_peak_mb": 300.0,
        "pss_peak_mb": 150.0,
    }
    assert usage_summary([])["cpu_mean_pct"] is None


def _epochs(*orders: np.ndarray, per_batch: int) -> list[np.ndarray]:
    return [o[i : i + per_batch] for o in orders for i in range(0, len(o), per_batch)]


def test_shuffle_figure_on_known_permutations():
    n = 4096
    ident = np.arange(n)
    # the same order twice: nothing moves; a batch of 64 consecutive ids is one 1,024-id shard
    same = shuffle_figures(_epochs(ident, ident, per_batch=64), n)
    assert same.movement == 0.0 and same.batch_shards == 1.0 and same.coverage == 1.0
    # reversed: |(n-1-i)/n - i/n| averages to ~1/2
    rev = shuffle_figures(_epochs(ident, ident[::-1], per_batch=64), n)
    assert rev.movement == pytest.approx(0.5, abs=1e-3)
    # shifted by half the epoch (cyclic): every sample moves by exactly 1/2
    half = shuffle_figures(_epochs(ident, np.roll(ident, n // 2), per_batch=64), n)
    assert half.movement == pytest.approx(0.5)
    # two independent uniform permutations: ~1/3, and batches as mixed as a uniform draw
    rng = np.random.default_rng(0)
    uni = shuffle_figures(_epochs(rng.permutation(n), rng.permutation(n), per_batch=64), n)
    assert uni.movement == pytest.approx(1 / 3, abs=0.02)
    assert uni.batch_shards == pytest.approx(uni.batch_shards_uniform, rel=0.05)


def _rows() -> list[ProtocolRow]:
    return [
        ProtocolRow(
            workload="text",
            loader="fast | loader",
            batch_size=4,
            samples_per_s=[10.0, 12.0, 14.0],
            first_batch_s=0.5,
            cpu_mean_pct=150.0,
            peak_rss_mb=512.0,
            peak_pss_mb=300.0,
            stall_pct=[1.0, 3.0],
            model_samples_per_s=[2.0, 2.0],
            movement=0.333,
            batch_shards=3.9,
            batch_shards_uniform=4.0,
        ),
        ProtocolRow(workload="text", loader="broken", batch_size=8, error="boom | bad\nmore"),
    ]


def test_markdown_table_rows_and_cells():
    text = markdown_table(_rows(), header="Measured here.")
    lines = text.splitlines()
    assert lines[0] == "Measured here."
    table = [ln for ln in lines if ln.startswith("| ")]
    assert len(table) == 4  # header, rule, two rows
    assert table[2] == (
        "| fast | loader | 4 | 12.0 (10.0–14.0) | 0.50 | 150 | 512 | 300 | 2.00 (2.00–2.00) "
        "| 2.0 (1.0–3.0) | 0.333 | 3.9 (4.0) |"
    )
    assert table[3].startswith("| broken | 8 | failed: boom \\| bad |")


def test_write_protocol_files(tmp_path):
    pytest.importorskip("matplotlib")
    series = {
        "fast | loader": {
            4: [
                {"t": 0.5, "cpu_pct": 90.0, "rss_mb": 100.0, "pss_mb": 80.0},
                {"t": 1.0, "cpu_pct": 110.0, "rss_mb": 120.0, "pss_mb": 90.0},
            ]
        },
        "broken": {8: []},
    }
    paths = write_protocol(
        _rows(), series, str(tmp_path / "out"), stem="x", header="h", meta={"workload": "text"}
    )
    doc = json.loads(open(paths["protocol json"]).read())
    assert doc["workload"] == "text" and doc["header"] == "h"
    assert doc["rows"][0]["rate"] == {"mean": 12.0, "low": 10.0, "high": 14.0, "n": 3}
    assert doc["rows"][1]["rate"] is None and doc["rows"][1]["error"].startswith("boom")
    assert doc["series"]["fast | loader"]["4"][1]["cpu_pct"] == 110.0
    assert open(paths["protocol markdown"]).read() == markdown_table(_rows(), header="h")
    pngs = sorted(os.listdir(tmp_path / "out"))
    assert pngs == sorted(
        ["x-protocol.json", "x-protocol.md", "x-throughput.png", "x-usage-fast-loader.png"]
    )  # no usage chart for a loader without a series
    for name in ("x-throughput.png", "x-usage-fast-loader.png"):
        with open(tmp_path / "out" / name, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert slug("tokenloom (workers=2)") == "tokenloom-workers-2"


def test_tree_sampler_keeps_a_usage_series():
    """CPU % and memory of the tree over time: points in time order, memory positive."""
    import time

    from tokenloom.bench.loader_rss import TreeSampler

    with TreeSampler(os.getpid(), interval_s=0.02, refresh_s=0.05, series_s=0.05) as sampler:
        end = time.monotonic() + 0.4
        # keep a core busy for 0.4 s, and on a loaded machine until the sampler has had its
        # turns (at most 30 s)
        while time.monotonic() < end or (len(sampler.series) < 2 and time.monotonic() < end + 30):
            sum(range(10_000))
    points = sampler.series
    assert len(points) >= 2
    assert [p.t for p in points] == sorted(p.t for p in points)
    assert all(p.cpu_pct >= 0 and p.rss_mb > 0 for p in points)


def test_tree_sampler_reads_pss_within_its_share_of_a_core():
    """RSS (a counter) at every sample, PSS (a walk of every page of each process, tens of ms
    for a loader with workers) only as often as its share of a core allows: a small share
    leaves most samples without a PSS read, and the peaks are still kept."""
    import time

    from tokenloom.bench.loader_rss import TreeSampler

    if not os.path.exists(f"/proc/{os.getpid()}/smaps_rollup"):
        pytest.skip("no /proc/<pid>/smaps_rollup here: no PSS to read")
    with TreeSampler(os.getpid(), interval_s=0.005, refresh_s=0.05, pss_share=0.001) as sampler:
        deadline = time.monotonic() + 30
        while sampler.samples < 60 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert sampler.samples >= 60
    assert 1 <= sampler.pss_reads < sampler.samples / 4
    assert sampler.pss_cpu_s > 0
    assert sampler.peak_pss is not None and 0 < sampler.peak_pss <= sampler.peak_rss


def test_tree_cpu_total_counts_live_and_ended_children():
    """A child's CPU time counts while it runs (``/proc``) and after it has been waited for
    (``os.times``): the total never drops when a worker ends."""
    import subprocess
    import sys
    import time

    from tokenloom.bench.loader_rss import tree_cpu_total

    before = tree_cpu_total()
    busy = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\n"
    child = subprocess.Popen([sys.executable, "-c", busy + "time.sleep(30)"])
    try:
        deadline = time.monotonic() + 30
        live = before
        while time.monotonic() < deadline:  # until its half second of CPU is seen
            live = tree_cpu_total()
            if live - before >= 0.45:
                break
            time.sleep(0.05)
        assert live - before >= 0.45
    finally:
        child.kill()
    child.wait()  # waited for: its time is the children's now
    assert tree_cpu_total() >= live - 0.02


def test_loader_protocol_sweep_and_files(tmp_path):
    """A loader at two batch sizes x two epochs (in this process, workers=0, tiny corpus): a
    rate per epoch per size, then the protocol's rows and files of the run."""
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    from dataclasses import replace

    from tokenloom.bench.loader import LoaderBenchConfig
    from tokenloom.bench.loader_cases import CaseSpec, measure_case
    from tokenloom.bench.loader_data import CorpusSpec, build_parquet
    from tokenloom.bench.loader_output import protocol_rows, write_outputs
    from tokenloom.bench.loader_report import LoaderBench

    built = build_parquet(str(tmp_path / "c.parquet"), CorpusSpec(docs=300))
    spec = CaseSpec(
        label="Parquet (workers=0)", kind="parquet", path=built.path, workers=0, seq_len=32,
        batch_size=4, steps=2, epochs=2,
    )  # fmt: skip
    config = LoaderBenchConfig(
        docs=300, steps=2, workdir=str(tmp_path), seq_len=32, batch_size=4,
        batch_sizes=(2, 4), epochs=2,
    )  # fmt: skip
    bench = LoaderBench(config=config)
    bench.results = [measure_case(spec), measure_case(replace(spec, batch_size=2))]
    for r in bench.results:
        assert r.ok, r.error
        assert len(r.windows) == 2 and all(w > 0 for w in r.windows)
        assert r.tokens == 2 * 2 * r.batch_size * 32  # two epochs of two batches
    assert [r.batch_size for r in bench.primary] == [4]  # the goals' size
    bench.attach("Parquet (workers=0)", "model", {"window_stall_pct": [1.0, 3.0]}, 2)
    rows, _ = protocol_rows(bench)
    assert [(r.batch_size, r.stall_pct) for r in rows] == [(2, [1.0, 3.0]), (4, [])]
    assert [r.samples_per_s for r in rows] == [
        [w / 32 for w in res.windows] for res in bench.results[::-1]
    ]
    paths = write_outputs(bench, str(tmp_path / "out"))
    doc = json.loads(open(paths["protocol json"]).read())
    assert [(row["loader"], row["rate"]["n"]) for row in doc["rows"]] == [
        ("Parquet (workers=0)", 2),
    ] * 2
    assert os.path.exists(paths["throughput chart"])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["loader", "--batch-sizes", "4,x"], "--batch-sizes"),
        (["loader", "--epochs", "0"], "--epochs"),
        (["rows", "--batch-sizes", "0"], "--batch-sizes"),
        (["rows", "--only", "tokenloom,petastorm"], "unknown loader(s) petastorm"),
        (["rows", "--copies", "1", "--batch-sizes", "64"], "--copies to 2"),
    ],
)
def test_protocol_options_are_usage_errors(tmp_path, args, says):
    """Refused before anything is built: exit 2 naming the option, through a real process."""
    from tests.conftest import run_cli

    extra = ["--workdir", str(tmp_path)] if args[0] == "loader" else ["--out", str(tmp_path)]
    proc = run_cli("bench", *args, *extra)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr
    assert list(tmp_path.iterdir()) == []
