"""Everything the suite runs on a local Ray, in one file sharing one Ray runtime.

Starting Ray (its GCS, raylet and agents, then a worker process per CPU) costs 10-30 s of wall
time on two busy cores, and ``make test`` hands out whole files: one file, one start. Each test
is its subject's own (a backfill, the banded near-dedup, ``doc-loss``, the Ray Data baseline of
``bench loader``), run on the runtime ``RayExecutor`` starts for a local Ray, which each of them
uses as it finds it. A multi-node cluster is tests/s3/test_ray_cluster_s3.py's.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.backfill.udfs import n_words
from tests.conftest import invoke, real_paragraphs, write_jsonl

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow  # a file of its own on one worker, scheduled first


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """The local Ray of ``RayExecutor(2)``, started once for the file and shut down after.

    Ray Data reads a Parquet file's footer through a pool of 32 actors by default: 32 worker
    processes to start, which on two cores take minutes, for one file of a few hundred rows.
    One does (set before Ray starts, so its workers see it too).
    """
    from tokenloom.backfill.executors import RayExecutor

    assert not ray.is_initialized()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "1")
        RayExecutor(2)._init()
        try:
            yield
        finally:
            ray.shutdown()


def _column(uri: str, name: str) -> dict[int, object]:
    import lance

    t = lance.dataset(uri).to_table(columns=["id", name])
    return dict(zip(t.column("id").to_pylist(), t.column(name).to_pylist(), strict=True))


def test_backfill_on_a_local_ray(tmp_path, paragraphs):
    from tokenloom.backfill import add_column
    from tokenloom.ingest import ingest
    from tokenloom.table import Table

    write_jsonl(tmp_path / "a.jsonl", [{"text": p} for p in paragraphs[:150]])
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    result = add_column(uri, "n_words", n_words, workers=2, executor="ray", unit_rows=40)
    assert result.units == 8 and result.rows == 150
    t = Table.open(uri).dataset.to_table(columns=["id", "text"])
    expected = dict(zip(t["id"].to_pylist(), n_words(t).column(0).to_pylist(), strict=True))
    assert _column(uri, "n_words") == expected


def test_band_partitions_as_ray_tasks(tmp_path):
    from tokenloom.backfill.executors import RayExecutor
    from tokenloom.bench.near_dedup import plant_groups, synthetic_rows
    from tokenloom.curate import lsh_clusters
    from tokenloom.curate.bands import NpySignatures, banded_clusters

    source, level = plant_groups(1200, dup_fraction=0.3, max_group=20)
    path = str(tmp_path / "sig.npy")
    np.save(path, synthetic_rows(0, source, level, 128, 0))
    ids = np.arange(1200, dtype=np.int64)
    cluster, _, stats = banded_clusters(
        ids,
        NpySignatures(path),
        workdir=str(tmp_path / "work"),
        executor=RayExecutor(2),
        part_rows=500,
    )
    np.testing.assert_array_equal(cluster, lsh_clusters(ids, np.load(path))[0])
    assert stats.passed > 0


def test_doc_loss_on_ray_computes_the_batched_column(tmp_path):
    """``doc-loss --executor ray`` of a two-step tiny run equals the batched computation (the
    direct one-document-at-a-time check of that is tests/train/test_docloss.py's)."""
    pytest.importorskip("torch")
    from tests.verify.tables import gpt2_table
    from tokenloom.train.checkpoint import load_run_model
    from tokenloom.train.docloss import document_losses

    texts = ["Hello there.", "A short one, well under the context."] + real_paragraphs(28)
    uri = gpt2_table(tmp_path, texts)
    out = str(tmp_path / "run")
    invoke(
        "train", "--table", uri, "--out", out, "--model", "tiny", "--seq-len", "32",
        "--global-batch-size", "2", "--steps", "2", "--device", "cpu",
    )  # fmt: skip
    summary = json.loads(invoke(
        "doc-loss", "--table", uri, "--checkpoint", out, "--column", "loss_ray",
        "--executor", "ray", "--workers", "2", "--unit-rows", "10", "--json",
    ))  # fmt: skip
    assert summary["units"] >= 2
    model, record = load_run_model(out)
    tokens = _column(uri, "input_ids")
    docs = [np.array(tokens[i]) for i in range(30)]
    batched = document_losses(model, docs, eos_id=int(record.tokenizer["eos_id"]))
    got = _column(uri, "loss_ray")
    assert [got[i] for i in range(30)] == pytest.approx(batched.tolist(), rel=1e-5)


def _ray_case(path: str, **options):
    from tokenloom.bench.loader_cases import CaseSpec

    return CaseSpec(
        label="ray", kind="ray", path=path, workers=1, seq_len=256, batch_size=4, steps=1,
        options=tuple(sorted(options.items())),
    )  # fmt: skip


def test_ray_data_read_lance_two_epochs(tmp_path):
    """read_lance -> randomize_block_order -> map_batches packing -> iter_torch_batches with a
    local shuffle buffer (a few read blocks: Ray's ~200 default are slow on 600 documents)."""
    pytest.importorskip("torch")
    from tokenloom.bench.loader_data import CorpusSpec, build_table
    from tokenloom.bench.loader_shuffle import measure_shuffle

    spec = CorpusSpec(docs=600, seed=0)
    table = build_table(str(tmp_path / "t.lance"), spec)
    q = measure_shuffle(_ray_case(table.path, read_blocks=4), spec, shard_docs=64)
    assert q["error"] is None
    # each map_batches call drops its tail (< one block): few documents are lost
    assert q["coverage"] > 0.9
    assert q["movement"] > 0.01
    assert ray.is_initialized()  # the source left the Ray it found running


def test_ray_data_read_parquet_random_shuffle(tmp_path):
    pytest.importorskip("torch")
    from tokenloom.bench.loader_data import CorpusSpec, build_parquet
    from tokenloom.bench.loader_shuffle import measure_shuffle

    spec = CorpusSpec(docs=600, seed=0)
    copy = build_parquet(str(tmp_path / "c.parquet"), spec)
    case = _ray_case(copy.path, read="parquet", shuffle="global", read_blocks=4)
    q = measure_shuffle(case, spec, shard_docs=64)
    assert q["error"] is None and q["coverage"] > 0.9
    # a global shuffle: about a third, as independent uniform permutations
    assert q["movement"] > 0.25
