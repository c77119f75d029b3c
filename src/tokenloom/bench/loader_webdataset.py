"""WebDataset for the loader benchmark: pre-packed blocks in tar shards, written with
``webdataset.ShardWriter`` and read with ``webdataset.WebDataset`` in DataLoader workers.

Each sample is one block of ``L`` uint16 token ids stored as raw bytes (``input_ids.bin``, no
encoding to parse); shards hold :data:`BLOCKS_PER_SHARD` blocks (8 MB at ``L = 1024``). The
blocks are the pre-shuffled stream of the MDS copy, so the reader does no shuffling: each
worker reads every ``W``-th shard in order and batches its samples into ``(B, L)`` int64
tensors (``.batched``), as WebDataset pipelines do. ``webdataset`` is installed with
``pip install --no-deps -r requirements/bench.txt`` (it needs braceexpand, numpy and PyYAML).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from tokenloom.errors import TokenloomError

__all__ = ["BLOCKS_PER_SHARD", "write_shards", "shard_urls", "wds_blocks", "batches"]

BLOCKS_PER_SHARD = 4096
"""Samples per tar shard (a shard is the unit a worker reads and the shuffle of shards)."""
_INSTALL = "pip install --no-deps webdataset==1.0.2 braceexpand==0.1.7 PyYAML==6.0.4"
_KEY = "input_ids.bin"


def _import_wds() -> Any:
    try:
        import webdataset
    except ModuleNotFoundError as exc:
        raise TokenloomError(
            f"the WebDataset baseline needs webdataset ({exc}): `{_INSTALL}`"
        ) from exc
    return webdataset


def write_shards(out: str, blocks: Iterable[np.ndarray]) -> int:
    """Write ``(n, L)`` uint16 block arrays, one sample per row, into ``out/shard-NNNNNN.tar``.

    Returns:
        The number of blocks written.
    """
    wds = _import_wds()
    os.makedirs(out, exist_ok=True)
    count = 0
    pattern = os.path.join(out, "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=BLOCKS_PER_SHARD, verbose=0) as sink:
        for chunk in blocks:
            for row in np.ascontiguousarray(chunk, dtype=np.uint16):
                sink.write({"__key__": f"{count:010d}", _KEY: row.tobytes()})
                count += 1
    return count


def shard_urls(path: str) -> list[str]:
    """The shards of a copy, in order."""
    urls = sorted(glob.glob(os.path.join(path, "shard-*.tar")))
    if not urls:
        raise TokenloomError(f"no WebDataset shards (shard-*.tar) under {path}")
    return urls


def _decode(sample: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(sample[_KEY], dtype=np.uint16)  # (L,)


def _collate(blocks: list[np.ndarray]) -> Any:
    import torch

    return torch.from_numpy(np.stack(blocks).astype(np.int64))  # (B, L)


def wds_blocks(path: str, *, batch_size: int) -> Any:
    """A ``webdataset.WebDataset`` pipeline of ``(B, L)`` int64 tensors (a torch
    IterableDataset: each DataLoader worker reads every ``W``-th shard; a partial last batch
    of a worker is dropped)."""
    wds = _import_wds()
    return (
        wds.WebDataset(
            shard_urls(path),
            shardshuffle=False,  # the blocks are pre-shuffled
            nodesplitter=None,
            workersplitter=wds.split_by_worker,
            empty_check=False,
        )
        .map(_decode)
        .batched(batch_size, collation_fn=_collate, partial=False)
    )


def batches(path: str, *, batch_size: int, workers: int, args: dict) -> Iterator[Any]:
    """``(B, L)`` tensors from one torch DataLoader over :func:`wds_blocks` (``args``: its
    keywords for the workers), epoch after epoch."""
    from torch.utils.data import DataLoader

    dl = DataLoader(
        wds_blocks(path, batch_size=batch_size), batch_size=None, num_workers=workers, **args
    )
    while True:
        yield from dl
