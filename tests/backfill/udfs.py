"""UDFs used by the backfill tests (module level, so spawned workers and Ray import them)."""

from __future__ import annotations

import os
import time

import pyarrow as pa
import pyarrow.compute as pc

from tokenloom.backfill import udf


@udf(inputs=["text"], output=pa.field("n_words", pa.int32()), version="1")
def n_words(batch: pa.RecordBatch) -> pa.Array:
    """Whitespace-separated words per document."""
    return pc.list_value_length(pc.utf8_split_whitespace(batch.column("text"))).cast(pa.int32())


@udf(inputs=["text"], output=pa.field("n_upper", pa.int64()), version="1", batch_size=64)
def slow_upper(batch: pa.RecordBatch) -> pa.Array:
    """Uppercase letters per document, slowly (so a test can kill a run midway)."""
    time.sleep(float(os.environ.get("TOKENLOOM_TEST_SLEEP", "0.02")))
    return pa.array([sum(c.isupper() for c in t) for t in batch.column("text").to_pylist()])


@udf(
    inputs=["id", "text"],
    output={"words": pa.list_(pa.string()), "first_char": pa.string()},
    version="1",
)
class Splitter:
    """A class UDF with two outputs and a lazy per-worker set-up."""

    def __init__(self, lower: bool = False, _cache: str | None = None) -> None:
        self.lower = lower
        self.pid = os.getpid()

    def __call__(self, batch: pa.RecordBatch) -> dict:
        text = batch.column("text")
        if self.lower:
            text = pc.utf8_lower(text)
        words = pc.utf8_split_whitespace(text, max_splits=3)
        return {"words": words, "first_char": pc.utf8_slice_codeunits(text, 0, 1)}


@udf(inputs=["id", "text"], output=pa.field("checked", pa.int64()), version="1")
def fails_on_13(batch: pa.RecordBatch) -> pa.Array:
    """Raises on the row whose id is 13."""
    ids = batch.column("id").to_pylist()
    if 13 in ids:
        raise ValueError("unlucky row")
    return pa.array(ids)


@udf(inputs=["id", "text"], output=pa.field("checked", pa.int64()), version="2")
def fails_on_13_fixed(batch: pa.RecordBatch) -> pa.Array:
    """The fixed version of :func:`fails_on_13`."""
    return batch.column("id")


def _node_tag(batch: pa.RecordBatch) -> pa.Array:
    time.sleep(0.05)  # a unit takes a moment: every node gets work before the queue drains
    tag = os.environ.get("TOKENLOOM_TEST_NODE", "")
    return pa.array([tag] * batch.num_rows, pa.string())


@udf(inputs=["id"], output=pa.field("ran_on", pa.string()), version="1")
def ran_on(batch: pa.RecordBatch) -> pa.Array:
    """The name of the Ray node that computed each row (``TOKENLOOM_TEST_NODE`` of its node)."""
    return _node_tag(batch)


@udf(
    inputs=["id"],
    output=pa.field("ran_on_b", pa.string()),
    version="1",
    resources={"tokenloom_test_b": 1},
)
def ran_on_b(batch: pa.RecordBatch) -> pa.Array:
    """Like :func:`ran_on`, for a UDF that only nodes with the resource ``tokenloom_test_b`` run."""
    return _node_tag(batch)


class NativePanic(BaseException):
    """Like ``pyo3_runtime.PanicException``: a ``BaseException`` that does not unpickle (its
    constructor takes two arguments but ``args`` holds one)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@udf(inputs=["id"], output=pa.field("panicked", pa.int64()), version="1")
def panics_on_21(batch: pa.RecordBatch) -> pa.Array:
    """Raises a :class:`NativePanic` on the row whose id is 21."""
    ids = batch.column("id").to_pylist()
    if 21 in ids:
        raise NativePanic("native code gave up", 7)
    return pa.array(ids)


@udf(inputs=["id"], output=pa.field("never", pa.int64()), version="1")
class BrokenSetup:
    """A class UDF whose setup fails (say a model file that is not there)."""

    def __init__(self) -> None:
        raise FileNotFoundError("model.bin is not there")

    def __call__(self, batch: pa.RecordBatch) -> pa.Array:
        return batch.column("id")  # pragma: no cover - never set up
