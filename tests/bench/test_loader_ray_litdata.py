"""The Ray Data and litdata baselines of ``bench loader`` on a tiny table: every batch is
``(B, L)`` packed documents, two epochs deliver (nearly) every document twice, and the
shuffle moves them (Ray Data's runs on a local Ray: tests/test_local_ray.py, one Ray start for
every such test). Skipped when the library is not installed (CI installs
requirements/bench.txt)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pyarrow as pa
import pytest

from tokenloom.bench.loader_data import EOS_ID, CorpusSpec, packed_stream

pytest.importorskip("torch")

_L, _B = 256, 4


def _case(kind: str, path: str, workers: int = 1, **options):
    from tokenloom.bench.loader_cases import CaseSpec

    return CaseSpec(
        label=kind, kind=kind, path=path, workers=workers, seq_len=_L, batch_size=_B, steps=1,
        options=tuple(sorted(options.items())),
    )  # fmt: skip


def test_pack_arrow_joins_documents_with_eos_and_drops_the_tail():
    from tokenloom.bench.loader_ray import pack_arrow

    docs = [np.arange(1, 1 + n, dtype=np.uint16) for n in (5, 3, 9, 1)]
    table = pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.uint16()))})
    out = pack_arrow(table, seq_len=4, eos_id=EOS_ID)["input_ids"]
    stream = packed_stream(
        np.concatenate(docs).astype(np.int64), np.array([5, 3, 9, 1]), eos_id=EOS_ID
    )
    assert out.dtype == np.int64 and out.shape == (len(stream) // 4, 4)
    assert (out.reshape(-1) == stream[: out.size]).all()


def test_ray_options_are_checked(tmp_path):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed: pip install -r requirements/bench.txt")
    from tokenloom.bench.loader_cases import _Notes
    from tokenloom.bench.loader_ray import ray_batches

    with pytest.raises(ValueError, match="shuffle block\\|global"):
        next(ray_batches(_case("ray", str(tmp_path), shuffle="none"), _Notes()))


def test_litdata_copy_and_shuffled_stream(tmp_path):
    if importlib.util.find_spec("litdata") is None:
        pytest.skip("litdata is not installed: pip install --no-deps -r requirements/bench.txt")
    from tokenloom.bench.loader_litdata import build_litdata
    from tokenloom.bench.loader_shuffle import measure_shuffle

    spec = CorpusSpec(docs=600, seed=0)
    built = build_litdata(str(tmp_path / "c.litdata"), spec, seq_len=_L)
    assert built.docs == 600 and built.tokens > 0 and built.mbytes > 0
    again = build_litdata(str(tmp_path / "c.litdata"), spec, seq_len=_L)
    assert again.cached
    q = measure_shuffle(_case("litdata", built.path, workers=0), spec, shard_docs=64)
    assert q["error"] is None
    assert q["coverage"] > 0.9
    assert q["movement"] > 0.01
