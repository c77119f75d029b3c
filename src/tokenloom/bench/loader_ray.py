"""Ray Data as a loader baseline: ``read_lance`` (or ``read_parquet``) -> a shuffle -> packing in
``map_batches`` -> ``iter_torch_batches``, the pipeline Ray's "data loading for ML training"
guide describes.

Two shuffles are measured, as that guide offers them:

* ``block``: ``randomize_block_order`` (the blocks a read task produced, in a random order) plus
  a local shuffle buffer in ``iter_torch_batches`` (its recommended cheap shuffle);
* ``global``: ``random_shuffle`` (an all-to-all exchange of every row through the object store,
  which the guide warns is expensive; the first batch waits for the whole epoch's exchange).

Packing is a stateless ``map_batches`` over :data:`PACK_DOCS` documents at a time: the documents
joined with EOS (:func:`~tokenloom.bench.loader_data.packed_stream`) and cut into ``seq_len``
blocks, the tail under one block dropped (under one block per :data:`PACK_DOCS` documents, as a
pre-packed copy drops its last partial block). Ray starts locally (``num_cpus`` = the case's
workers, an object store of :data:`OBJECT_STORE_MB`, its session files in a temporary folder
removed afterwards) and is shut down when the source is closed; a Ray this process already runs
is used as it is, and left running. ``ray`` is installed with
``pip install -r requirements/bench.txt``.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenloom.bench.loader_data import packed_stream
from tokenloom.errors import TokenloomError

if TYPE_CHECKING:
    from tokenloom.bench.loader_cases import CaseSpec

__all__ = ["OBJECT_STORE_MB", "PACK_DOCS", "SHUFFLE_BUFFER_BLOCKS", "pack_arrow", "ray_batches"]

OBJECT_STORE_MB = 1024
"""Ray's object store (MB): small, on a shared machine; ``random_shuffle`` spills past it."""
PACK_DOCS = 4096
"""Documents per ``map_batches`` call (each packs its own documents; the tail is dropped)."""
SHUFFLE_BUFFER_BLOCKS = 1024
"""``local_shuffle_buffer_size`` of the ``block`` shuffle, in packed blocks (8 MB at L=1024)."""
_INSTALL = "pip install --no-deps -r requirements/bench.txt (ray[data])"


def _import_ray() -> Any:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no telemetry prompt, offline
    try:
        import ray
        import ray.data  # noqa: F401 - the Data library is what is measured
    except ModuleNotFoundError as exc:
        raise TokenloomError(
            f"the Ray Data baseline needs ray[data] ({exc}): `{_INSTALL}`"
        ) from exc
    return ray


def pack_arrow(table: Any, *, seq_len: int, eos_id: int) -> dict[str, np.ndarray]:
    """Pack one Arrow batch of documents (an ``input_ids`` list column) into blocks.

    Returns:
        ``{"input_ids": (n, seq_len) int64}``: the documents in batch order, each followed by
        EOS, cut into blocks; the tail under one block is dropped.
    """
    import pyarrow as pa

    col = table.column("input_ids")
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    lengths = col.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
    values = col.flatten().to_numpy(zero_copy_only=False)
    stream = packed_stream(values.astype(np.int64), lengths, eos_id=eos_id)
    n = stream.shape[0] // seq_len
    return {"input_ids": stream[: n * seq_len].reshape(n, seq_len)}


def ray_batches(spec: CaseSpec, notes: Any) -> Iterator[Any]:
    """``(B, L)`` int64 batches from a local Ray Data pipeline, epoch after epoch.

    Options: ``read`` (``lance``: the table itself; ``parquet``: the Parquet copy), ``shuffle``
    (``block`` or ``global``, see the module), ``object_store_mb``, ``read_blocks`` (Ray's
    ``override_num_blocks``; default: Ray's own choice).
    """
    ray = _import_ray()
    read = spec.option("read", "lance")
    shuffle = spec.option("shuffle", "block")
    if read not in ("lance", "parquet") or shuffle not in ("block", "global"):
        raise ValueError(f"ray options: read lance|parquet, shuffle block|global; got {spec}")
    cpus = max(spec.workers, 1)
    store_mb = int(spec.option("object_store_mb", OBJECT_STORE_MB))
    own = not ray.is_initialized()  # a caller's Ray (a test's, shared) is not ours to stop
    temp = tempfile.mkdtemp(prefix="tl-ray-") if own else None  # short: sockets' paths
    if own:
        ray.init(
            num_cpus=cpus,
            object_store_memory=store_mb * 2**20,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
            _temp_dir=temp,
        )
    else:
        cpus = int(ray.cluster_resources().get("CPU", 0))
        store_mb = int(ray.cluster_resources().get("object_store_memory", 0)) >> 20
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    blocks = 0
    current: Any = None
    try:
        blocks_read = spec.option("read_blocks")  # None: Ray picks (~200 blocks, by the CPUs)
        if read == "lance":
            source = ray.data.read_lance(
                spec.path, columns=["input_ids"], override_num_blocks=blocks_read
            )
        else:  # its columns= is deprecated: the projection is pushed down from select_columns
            source = ray.data.read_parquet(
                spec.path, override_num_blocks=blocks_read
            ).select_columns(["input_ids"])
        epoch = 0
        while True:
            ds = (
                source.randomize_block_order(seed=epoch)
                if shuffle == "block"
                else source.random_shuffle(seed=epoch)
            )
            ds = ds.map_batches(
                pack_arrow,
                batch_format="pyarrow",
                batch_size=PACK_DOCS,
                fn_kwargs={"seq_len": spec.seq_len, "eos_id": spec.eos_id},
            )
            local = SHUFFLE_BUFFER_BLOCKS if shuffle == "block" else None
            current = iter(
                ds.iter_torch_batches(
                    batch_size=spec.batch_size,
                    drop_last=True,
                    local_shuffle_buffer_size=local,
                    local_shuffle_seed=epoch if local else None,
                )
            )
            for batch in current:
                blocks += spec.batch_size
                yield batch["input_ids"]
            epoch += 1
    finally:
        # the epoch's iterator (its prefetch threads) ends before Ray does: a thread still
        # using the worker after shutdown makes Ray exit the process
        close = getattr(current, "close", None)
        if close is not None:
            close()
        if own:
            ray.shutdown()
            shutil.rmtree(temp, ignore_errors=True)
        how = "randomize_block_order + local buffer" if shuffle == "block" else "random_shuffle"
        notes.text = f"read_{read}, {how}, {cpus} CPUs, object store {store_mb} MB"
        notes.figures = {"blocks": blocks}
