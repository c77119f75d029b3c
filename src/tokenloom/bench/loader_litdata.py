"""litdata (Lightning's streaming format) as a loader baseline, in its own LLM-pretraining
recipe: ``optimize`` writes every document's tokens followed by EOS, in id order, into chunks
read by ``TokensLoader``; ``StreamingDataset(item_loader=TokensLoader(block_size=L),
shuffle=True)`` cuts the concatenated stream into ``L``-token blocks and shuffles them (chunks in
a seeded random order per epoch, blocks within each chunk), through ``StreamingDataLoader``.

The copy's build time and bytes are reported beside its throughput, as for the other copies.
litdata is installed with ``pip install --no-deps -r requirements/bench.txt`` (see there for its
dependencies); its image encodings (``tifffile``, ``torchvision``) are not needed for tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenloom.bench.loader_data import (
    EOS_ID,
    Built,
    CorpusSpec,
    _cached,
    corpus_chunks,
    doc_lengths,
)
from tokenloom.errors import TokenloomError

if TYPE_CHECKING:
    from tokenloom.bench.loader_cases import CaseSpec

__all__ = ["CHUNK_BYTES", "build_litdata", "litdata_batches"]

CHUNK_BYTES = "64MB"
"""Chunk size of the copy (litdata's unit of download, caching and shuffling)."""
_INSTALL = "pip install --no-deps litdata==0.2.76 lightning-utilities==0.15.3 obstore==0.12.1"


def _import_litdata() -> Any:
    try:
        import litdata
    except ModuleNotFoundError as exc:
        raise TokenloomError(f"the litdata baseline needs litdata ({exc}): `{_INSTALL}`") from exc
    return litdata


def _documents(spec: CorpusSpec) -> Iterator[np.ndarray]:
    """Every document's tokens then EOS, in id order (one optimize input: the whole corpus)."""
    eos = np.array([EOS_ID], dtype=np.uint16)
    for _first, lens, values in corpus_chunks(spec):
        ends = np.cumsum(lens)
        for doc in np.split(values, ends[:-1]):
            yield np.concatenate([doc, eos])


def build_litdata(path: str, spec: CorpusSpec, *, seq_len: int, rebuild: bool = False) -> Built:
    """litdata's ``optimize`` over the corpus (one worker; documents in id order)."""

    def build(out: str) -> tuple[int, int]:
        from functools import partial

        from litdata.streaming.item_loader import TokensLoader

        _import_litdata().optimize(
            fn=partial(_generate_one, spec=spec),
            inputs=[0],
            output_dir=out,
            chunk_bytes=CHUNK_BYTES,
            item_loader=TokensLoader(),
            num_workers=1,
            mode="overwrite",
            verbose=False,
            start_method="spawn",
        )
        return spec.docs, int(doc_lengths(spec).sum())

    del seq_len  # the blocks are cut when reading (TokensLoader's block_size)
    return _cached(path, spec, build, rebuild=rebuild)


def _generate_one(_index: int, *, spec: CorpusSpec) -> Iterator[np.ndarray]:
    """optimize's ``fn``: the one input yields every document."""
    yield from _documents(spec)


def litdata_batches(spec: CaseSpec, notes: Any) -> Iterator[Any]:
    """``StreamingDataLoader`` over ``StreamingDataset(shuffle=True)``, epoch after epoch
    (the loader moves the dataset to its next epoch, reshuffled, by itself)."""
    litdata = _import_litdata()
    from litdata.streaming.item_loader import TokensLoader

    ds = litdata.StreamingDataset(
        spec.path,
        item_loader=TokensLoader(block_size=spec.seq_len),
        shuffle=True,
        drop_last=True,
        seed=0,
    )
    dl = litdata.StreamingDataLoader(
        ds,
        batch_size=spec.batch_size,
        num_workers=spec.workers,
        drop_last=True,
        **({"multiprocessing_context": "spawn"} if spec.workers > 0 else {}),
    )
    notes.text = f"{len(ds):,} blocks per epoch, chunks of {CHUNK_BYTES}"
    while True:
        for batch in dl:
            yield batch.long()
