"""MosaicML Streaming (MDS) for the loader benchmark: the writer of the pre-packed copy and the
reader wrapped for a spawn-context torch DataLoader.

``mosaicml-streaming`` 0.13 pins ``numpy<2.2`` (tokenloom pins numpy 2.4), so it is installed
with ``pip install --no-deps`` plus the few packages its MDS code imports (Brotli, python-snappy,
zstd, xxhash, catalogue). Its package ``__init__`` files also import its text/vision datasets and
``StreamingDataLoader``, which need ``transformers`` and ``torchvision``; the MDS reader and
writer do not. :func:`import_streaming` registers the two packages without running those
``__init__`` files (whether or not ``transformers`` is installed: with it, ``torchvision`` is
still missing), so no stub of either is ever created. Importing this module
does that first, which is why the dataset crosses into DataLoader workers wrapped in
:class:`MDSBlocks`: unpickling the wrapper imports this module before the MDS dataset's class.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from tokenloom.errors import TokenloomError

__all__ = ["import_streaming", "mds_writer", "MDSBlocks", "collate_blocks"]

_INSTALL = (
    "pip install --no-deps mosaicml-streaming==0.13.0 && "
    "pip install Brotli==1.2.1 python-snappy==0.7.3 zstd==1.5.7.2 xxhash==3.8.2 catalogue==2.0.10"
)


def import_streaming() -> None:
    """Make ``streaming.base.*`` importable (see the module docstring).

    Raises:
        TokenloomError: naming the install line when ``mosaicml-streaming`` is missing.
    """
    if "streaming.base.dataset" in sys.modules:
        return
    spec = importlib.util.find_spec("streaming")
    if spec is None or not spec.submodule_search_locations:
        raise TokenloomError(f"the MDS baseline needs mosaicml-streaming: `{_INSTALL}`")
    if "streaming" not in sys.modules:
        root = list(spec.submodule_search_locations)
        for name, path in (("streaming", root), ("streaming.base", [f"{p}/base" for p in root])):
            module = types.ModuleType(name)
            module.__path__ = path
            # a spec, so that importlib.util.find_spec still answers for the package
            module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            module.__spec__.submodule_search_locations = path
            sys.modules[name] = module
    try:
        import streaming.base.dataset  # noqa: F401
        import streaming.base.format.mds.writer  # noqa: F401
    except ModuleNotFoundError as exc:
        raise TokenloomError(
            f"mosaicml-streaming cannot be imported ({exc}); `{_INSTALL}`"
        ) from exc


if importlib.util.find_spec("streaming") is not None:
    import_streaming()  # before any MDS object is unpickled in this process


@contextmanager
def mds_writer(out: str, *, seq_len: int) -> Iterator[Any]:
    """An ``MDSWriter`` of one column ``input_ids`` = ``ndarray:uint16:<seq_len>``, no
    compression, no hashing (the reader is local and the benchmark measures reading)."""
    import_streaming()
    from streaming.base.format.mds.writer import MDSWriter

    with MDSWriter(out=out, columns={"input_ids": f"ndarray:uint16:{seq_len}"}) as writer:
        yield writer


def collate_blocks(samples: list[dict[str, np.ndarray]]) -> torch.Tensor:
    """``B`` samples -> ``(B, L)`` int64 tensor (as the other loaders deliver)."""
    return torch.from_numpy(np.stack([s["input_ids"] for s in samples]).astype(np.int64))


def _mds_s3_environment(options: dict) -> None:
    """Point MDS's boto3 client at ``options``' endpoint, in this (benchmark) process and the
    DataLoader workers it spawns later (they inherit the environment)."""
    import os

    env = {
        "S3_ENDPOINT_URL": options.get("aws_endpoint"),
        "AWS_ACCESS_KEY_ID": options.get("aws_access_key_id"),
        "AWS_SECRET_ACCESS_KEY": options.get("aws_secret_access_key"),
        "AWS_DEFAULT_REGION": options.get("aws_region", "us-east-1"),
    }
    os.environ.update({k: v for k, v in env.items() if v})


class MDSBlocks(IterableDataset):
    """An IterableDataset over an MDS directory: in stored order (``shuffle_algo=None``, for
    the pre-shuffled copy) or with MDS's own shuffle of the blocks (e.g. ``"py1e"``, its
    default algorithm, for the copy packed in document order; a new order per epoch).

    Built in the parent process, as MosaicML documents (it sets up its shared memory there), and
    pickled into the DataLoader's workers.
    """

    def __init__(
        self,
        local: str,
        *,
        batch_size: int,
        shuffle_algo: str | None = None,
        seed: int = 0,
        storage_options: dict | None = None,
    ) -> None:
        super().__init__()
        import_streaming()
        from streaming.base.dataset import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        from tokenloom.table.storage import is_remote

        clean_stale_shared_memory()
        shuffle = {"shuffle": False}
        if shuffle_algo is not None:
            shuffle = {"shuffle": True, "shuffle_algo": shuffle_algo, "shuffle_seed": seed}
        if is_remote(local):
            # MDS downloads whole shards into a local cache (boto3; endpoint from S3_ENDPOINT_URL)
            import tempfile

            _mds_s3_environment(storage_options or {})
            self._cache = tempfile.TemporaryDirectory(prefix="tokenloom-mds-")
            self.inner = StreamingDataset(
                remote=local, local=self._cache.name, batch_size=batch_size, **shuffle
            )
            return
        self.inner = StreamingDataset(local=local, batch_size=batch_size, **shuffle)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_cache", None)  # the parent owns (and removes) the cache directory
        return state

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return iter(self.inner)
