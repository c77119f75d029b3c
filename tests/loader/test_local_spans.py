"""Local take spans (loader/pipeline/dataset.py): on a local table the rows of consecutive read
groups are taken together (one take of ~4,000 rows costs less per token than several small ones),
and the stream is exactly the one of one take per group, across an epoch boundary; long documents
keep one take per group."""

from __future__ import annotations

import numpy as np

import tokenloom.loader.pipeline.dataset as dataset_module
from tokenloom.bench.loader_data import CorpusSpec, build_table
from tokenloom.loader.pipeline.dataset import PackedStream


def _stream(uri: str, steps: int, **kw) -> tuple[list[dict], PackedStream]:
    ds = PackedStream(uri, seq_len=128, global_batch=8, seed=3, eos_id=0, pad_id=0, **kw)
    out: list[dict] = []
    while len(out) < steps:  # epoch after epoch
        out += [{k: np.array(v, copy=True) for k, v in b.items()} for b in ds.batches()]
    return out[:steps], ds


def test_local_spans_take_groups_together_and_change_nothing(tmp_path, monkeypatch):
    uri = build_table(str(tmp_path / "t.lance"), CorpusSpec(docs=2000)).path
    # spans of ~500 rows: several in this small epoch (the training process's own are ~4,000)
    monkeypatch.setattr(dataset_module, "_LOCAL_SPAN_ROWS", 500)
    probe = PackedStream(uri, seq_len=128, global_batch=8, seed=3, eos_id=0, pad_id=0)
    view = probe.view(0)
    size = probe._group_steps(view)
    per_span = probe._local_span_groups(view, size)
    assert 1 < per_span < view.steps / size  # several spans of several groups each
    steps = view.steps + 3 * size  # into the second epoch
    got, spans = _stream(uri, steps)
    want, plain = _stream(uri, steps, read_group=size)  # an explicit group: one take each
    assert spans.sizing.span_rows > 0 and plain.sizing.span_rows == 0
    assert len(got) == len(want) == steps
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_spans_in_the_training_process_are_larger_than_in_workers(tmp_path, monkeypatch):
    """The training process takes ~4,000 rows at once (cheaper per token); a DataLoader worker's
    spans in flight hold about as many rows (a worker's memory is most of the tree's): one span
    of ~4,000 with a core or less, two of ~2,000 with more; and a worker's spans of longer
    documents stop at its token budget."""
    uri = build_table(str(tmp_path / "t.lance"), CorpusSpec(docs=6000)).path
    ds = PackedStream(uri, seq_len=128, global_batch=8, seed=3, eos_id=0, pad_id=0)
    view = ds.view(0)
    size = ds._group_steps(view)
    rows_per_group = len(ds.inputs.row_ids) / view.steps * size
    here = ds._local_span_groups(view, size) * rows_per_group
    assert dataset_module._LOCAL_SPAN_ROWS <= here < dataset_module._LOCAL_SPAN_ROWS * 1.5
    size_w = ds._group_steps(view, worker=True)
    rows_per_group_w = len(ds.inputs.row_ids) / view.steps * size_w
    in_flight = dataset_module._WORKER_ROWS_IN_FLIGHT
    for cores, spans in ((1, 1), (2, 2), (8, 2)):
        monkeypatch.setattr(dataset_module, "available_cores", lambda workers=1, c=cores: c)
        assert ds._local_spans(2) == spans and ds._local_spans(0) == 2
        there = ds._local_span_groups(view, size_w, workers=2) * rows_per_group_w
        assert in_flight // spans <= there < in_flight // spans * 1.5
        positions = size_w * ds.step_values // 4  # a worker group's token positions
        # as if documents were long: three groups' tokens over the spans in flight at most
        monkeypatch.setattr(dataset_module, "_WORKER_TOKENS_IN_FLIGHT", 3 * positions * spans)
        assert ds._local_span_groups(view, size_w, workers=2) == 3
        assert ds._local_span_groups(view, size) * rows_per_group >= here  # not the process's
        monkeypatch.undo()


def test_a_worker_with_a_core_packs_its_spans_on_one_thread(tmp_path, monkeypatch):
    """A DataLoader worker's spans are taken by the fetcher's threads: with a core or less it
    packs on one thread, one group ahead (two threads only contended for the cores), with more
    as the training process does; either way the counters name what reads: one take per span,
    one span in flight with a core or less (the other workers' takes overlap its packing), else
    two."""
    uri = build_table(str(tmp_path / "t.lance"), CorpusSpec(docs=6000)).path
    for cores, threads in ((1, 1), (2, 2)):
        monkeypatch.setattr(dataset_module, "available_cores", lambda workers=1, c=cores: c)
        ds = PackedStream(uri, seq_len=128, global_batch=8, seed=3, eos_id=0, pad_id=0)
        groups = ds.groups(0, 2)  # worker 0 of 2, as a DataLoader worker runs it
        first = next(groups)
        groups.close()
        assert first.first == 0 and ds.sizing is not None and ds.sizing.span_rows > 0
        assert ds.sizing.io_threads == threads
        assert ds.sizing.read_ahead == 1 if cores == 1 else ds.sizing.read_ahead >= 2
        said = ds.stats.summary()
        # one in flight with a core or less, else two (and the words agree with the number)
        want = "1 fetch span" if cores == 1 else "2 fetch spans"
        takes = "1 concurrent take " if cores == 1 else "2 concurrent takes "
        assert f"{want} of ~{ds.sizing.span_rows} rows ahead, {takes}" in said
    explicit = PackedStream(
        uri, seq_len=128, global_batch=8, seed=3, eos_id=0, pad_id=0, io_threads=3, read_ahead=5
    )
    groups = explicit.groups(0, 2)
    next(groups)
    groups.close()
    assert explicit.sizing is not None
    assert (explicit.sizing.io_threads, explicit.sizing.read_ahead) == (3, 5)  # as given


def test_long_documents_keep_one_take_per_group(tmp_path):
    uri = build_table(str(tmp_path / "long.lance"), CorpusSpec(docs=4, fixed_len=20_000)).path
    ds = PackedStream(uri, seq_len=128, global_batch=2, seed=3, eos_id=0, pad_id=0)
    view = ds.view(0)
    assert ds._local_span_groups(view, ds._group_steps(view)) == 1


def test_stable_ids_read_by_place_equal_the_ones_searched_by_table_id(tmp_path):
    # a concat plan of the loader's own selection reads a group's stable row ids by the
    # documents' places in it; best-fit (another plan) searches them by table id: both equal
    # the search, over a filtered selection, every group of the epoch
    uri = build_table(str(tmp_path / "t.lance"), CorpusSpec(docs=2000)).path
    for packing in ("concat", "best_fit"):
        ds = PackedStream(uri, seq_len=128, global_batch=8, seed=3, eos_id=0, pad_id=0,
                          filter="id % 3 != 0", packing=packing)  # fmt: skip
        view = ds.view(0)
        size = ds._group_steps(view)
        for first in range(0, view.steps, size):
            spans = view.group(np.arange(first, min(first + size, view.steps))).spans
            want = ds.inputs.rowids[np.searchsorted(ds.inputs.row_ids, spans.row_id)]
            np.testing.assert_array_equal(ds._stable_ids(view, spans), want)
