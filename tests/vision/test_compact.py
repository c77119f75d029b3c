"""The image+text plan holds compact inputs: a synthetic table of 200k samples (sizes and empty
token lists only) is scanned reading nothing but the id, size and count columns, and the sizes
plus an epoch's plan hold at most 12 bytes per sample."""

from __future__ import annotations

import json
import tracemalloc

import lance
import numpy as np
import pyarrow as pa

from tokenloom.tokenize.column import TOKENIZER_META_KEY
from tokenloom.vision.dataset import scan_sizes
from tokenloom.vision.packing import pack_compact
from tokenloom.vision.spec import ImageTextSpec

N = 200_000


def _token_field(name: str) -> pa.Field:
    ident = {"name": "gpt2", "vocab_hash": "h", "vocab_size": 50257, "eos_id": 50256}
    meta = {TOKENIZER_META_KEY: json.dumps(ident).encode(),
            b"tokenloom.count_column": f"{name}_n_tokens".encode()}  # fmt: skip
    return pa.field(name, pa.list_(pa.uint16()), metadata=meta)


class _Spy:
    """A Lance dataset that records the columns each scan asks for."""

    def __init__(self, ds) -> None:  # noqa: ANN001
        self.ds, self.scanned = ds, []

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.ds, name)

    def scanner(self, *, columns, **kw):  # noqa: ANN001, ANN003, ANN201
        self.scanned.append(list(columns))
        return self.ds.scanner(columns=columns, **kw)


def test_sizes_scan_only_count_columns_and_stay_compact(tmp_path):
    rng = np.random.default_rng(0)
    empty = pa.array([[]] * N, pa.list_(pa.uint16()))
    schema = pa.schema([
        pa.field("id", pa.int64()), pa.field("image", pa.large_binary()),
        pa.field("width", pa.int32()), pa.field("height", pa.int32()),
        _token_field("prompt_ids"), pa.field("prompt_ids_n_tokens", pa.int64()),
        _token_field("response_ids"), pa.field("response_ids_n_tokens", pa.int64()),
    ])  # fmt: skip
    table = pa.table(
        [
            pa.array(np.arange(N)), pa.nulls(N, pa.large_binary()),
            pa.array(rng.integers(16, 512, N).astype(np.int32)),
            pa.array(rng.integers(16, 512, N).astype(np.int32)),
            empty, pa.array(rng.integers(2, 30, N)), empty, pa.array(rng.integers(5, 80, N)),
        ],
        schema=schema,
    )  # fmt: skip
    uri = str(tmp_path / "sizes.lance")
    lance.write_dataset(table, uri)
    del table, empty
    spy = _Spy(lance.dataset(uri))
    spec = ImageTextSpec(table=uri, budget=256, policy="greedy")
    tracemalloc.start()
    sizes, tok = scan_sizes(spy, spec)
    order = np.random.default_rng(1).permutation(N).astype(np.uint32)
    plan = pack_compact(sizes.lengths[order], (sizes.image_tokens[order] > 0).astype(np.uint8),
                        budget=256, image_cap=4, policy="greedy")  # fmt: skip
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert spy.scanned == [
        ["id", "width", "height", "prompt_ids_n_tokens", "response_ids_n_tokens"]
    ]
    assert tok["eos_id"] == 50256 and len(sizes.lengths) == N
    held = sizes.nbytes + plan.nbytes
    print(f"held {held / N:.1f} B/sample, numpy peak while planning {peak / N:.1f} B/sample")
    assert held <= 12 * N
    assert peak <= 64 * N  # transient: the scan's batches and the plan's arrays
