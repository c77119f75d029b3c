"""The Python loader resumes on the table version its state was taken on, as ``train --resume``
does: a column added since (an unrelated backfill) is a newer version, not another stream."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tests.conftest import real_paragraphs
from tests.loader.tables import token_table
from tokenloom.backfill import add_column, udf
from tokenloom.loader import LoaderSpec, ResumeMismatchError
from tokenloom.loader.pipeline.dataset import PackedStream
from tokenloom.table import Table


@udf(inputs=["text"], output={"n_bytes": pa.int64()}, version="1")
def n_bytes(batch):  # noqa: ANN001, ANN201
    return [len(t.encode()) for t in batch.column("text").to_pylist()]


def _steps(stream: PackedStream, n: int) -> list[bytes]:
    out = []
    for batch in stream.batches():
        out.append(batch["input_ids"].tobytes())
        if len(out) == n:
            break
    return out


def test_resume_after_an_unrelated_column_continues_on_the_pinned_version(tmp_path):
    uri = token_table(tmp_path, real_paragraphs(30))
    spec = LoaderSpec(table=uri, seq_len=32, global_batch=2, eos_id=0)
    first = PackedStream(spec)
    pinned = first.version
    _steps(first, 3)
    state = first.state_dict()
    want = _steps(first, 4)  # what an uninterrupted run reads next
    add_column(uri, None, n_bytes, workers=0, progress=False)
    latest = Table.open(uri).version
    assert latest > pinned

    resumed = PackedStream(spec)  # no version given: the latest now
    assert resumed.version == latest
    resumed.load_state_dict(state)
    assert resumed.version == pinned and resumed.spec.version == pinned
    assert _steps(resumed, 4) == want

    explicit = PackedStream(spec.replace(version=latest))  # a version asked for is kept
    with pytest.raises(ResumeMismatchError) as info:
        explicit.load_state_dict(state)
    message = str(info.value)
    assert message.startswith(
        f"checkpoint was taken on table version {pinned} but the loader reads version {latest}"
    )
    assert "built again" not in message
    assert explicit.version == latest
