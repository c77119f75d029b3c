"""The stream skeleton (:mod:`tokenloom.loader.plan.stream`): the spec's common part, the topology
rule, the cursor and its state (elastic resume for both loaders), and the take wrapper."""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa
import pytest

from tests.loader.tables import token_table
from tests.rows.tables import row_table
from tokenloom.loader.pipeline.take import TakeError, take
from tokenloom.loader.plan.epoch import PlanError, step_blocks
from tokenloom.loader.plan.spec import LoaderSpec
from tokenloom.loader.plan.state import ResumeMismatchError
from tokenloom.loader.plan.stream import (
    Cursor,
    PlanCache,
    StreamSpec,
    Topology,
    split_global_batch,
    worker_groups,
)
from tokenloom.rows.plan import RowPlan
from tokenloom.rows.spec import RowSpec

# -- the spec's common part ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"global_batch": 0}, "global_batch must be an integer >= 1, got 0"),
        ({"global_batch": True}, "global_batch must be an integer >= 1, got True"),
        ({"seed": -1}, "seed must be an integer >= 0, got -1"),
        ({"version": -2}, "version must be an integer >= 0, got -2"),
        ({"filter": "  "}, "filter must be SQL text or None, got '  '"),
        ({"drop_last": "yes"}, "drop_last must be True or False, got 'yes'"),
        ({"table": ""}, "table must be a path or URI, got ''"),
    ],
)
def test_both_specs_refuse_the_common_fields_alike(tmp_path, bad, message):
    for make in (
        lambda **kw: LoaderSpec(**{"table": str(tmp_path / "t"), "seq_len": 8, **kw}),
        lambda **kw: RowSpec(**{"table": str(tmp_path / "t"), "columns": ["k"], **kw}),
        lambda **kw: StreamSpec(**{"table": str(tmp_path / "t"), **kw}),
    ):
        with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
            make(**bad)


def test_specs_keep_their_keyword_form_replace_dict_and_fingerprint(tmp_path):
    spec = LoaderSpec(table=str(tmp_path / "t"), seq_len=16, global_batch=6, seed=2)
    assert isinstance(spec, StreamSpec) and spec.table == str(tmp_path / "t")
    assert LoaderSpec.from_dict(spec.to_dict()) == spec
    assert spec.replace(drop_last=True).drop_last is True
    inputs = spec.fingerprint_inputs()
    assert {k: inputs[k] for k in ("filter", "seed", "global_batch", "drop_last")} == {
        "filter": None, "seed": 2, "global_batch": 6, "drop_last": False,
    }  # fmt: skip
    rows = RowSpec(table=str(tmp_path / "t"), columns="k, label", global_batch=4)
    assert rows.columns == ("k", "label") and rows.replace(seed=1).seed == 1
    assert rows.fingerprint_inputs()["columns"] == ["k", "label"]


# -- the topology -------------------------------------------------------------------------------


def test_the_divisibility_rule_is_one_message_naming_the_fix(tmp_path):
    with pytest.raises(PlanError) as caught:
        split_global_batch(12, 5, unit="blocks")
    text = str(caught.value)
    assert text == (
        "global batch 12 blocks does not split evenly over 5 ranks (each rank takes "
        "global_batch / world_size); pick a global batch that is a multiple of the world size, "
        "e.g. 10 or 15 (--global-batch-size / global_batch=)"
    )
    with pytest.raises(PlanError, match="e.g. 3 \\(--global"):  # below one rank each
        split_global_batch(2, 3)
    # every loader's copy is this one rule
    loader = LoaderSpec(table=str(tmp_path / "t"), seq_len=8, global_batch=12)
    rows = RowSpec(table=str(tmp_path / "t"), columns=["k"], global_batch=12)
    plan = RowPlan.build(40, seed=0, epoch=0, global_batch=12, drop_last=False)
    for call, unit in (
        (lambda: loader.per_rank(5), "blocks"),
        (lambda: rows.per_rank(5), "rows"),
        (lambda: plan.positions(0, rank=0, world_size=5), "rows"),
        (lambda: Topology(0, 5).per_rank(12), "items"),
    ):
        with pytest.raises(PlanError) as caught:
            call()
        assert str(caught.value) == text.replace("blocks", unit)
    assert Topology(2, 4).per_rank(12) == 3 and Topology(2, 4).first(5, 12) == 66


@pytest.mark.parametrize(("rank", "world"), [(2, 2), (-1, 2), (0, 0)])
def test_a_rank_outside_the_world_is_refused_once(rank, world):
    message = "world_size must be >= 1" if world < 1 else rf"rank must be in \[0, {world}\)"
    with pytest.raises(PlanError, match=message):
        Topology(rank, world)
    with pytest.raises(PlanError, match=message):  # the pure plan math says the same
        step_blocks(0, rank=rank, world_size=world, batch_size=1, num_blocks=4, drop_last=False)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_worker_groups_deal_every_step_once_round_robin(workers):
    groups = [worker_groups(5, 23, 4, w, workers) for w in range(workers)]
    dealt = [
        g for i in range(max(map(len, groups))) for gs in groups if i < len(gs) for g in [gs[i]]
    ]
    assert [s for g in dealt for s in g] == list(range(5, 23))


# -- the cursor ---------------------------------------------------------------------------------


def test_cursor_rolls_over_and_set_epoch_keeps_a_resumed_step():
    at = Cursor()
    at.delivered(0, 0, 3)
    assert at == (0, 1)
    at.delivered(0, 2, 3)
    assert at == (1, 0)
    at.seek(1, 2)
    at.set_epoch(1)  # already in it: the step stays (a resumed run calls set_epoch too)
    assert at == (1, 2)
    at.set_epoch(4)
    assert at == (4, 0)
    state = at.state({"seed": 1}).to_dict()
    again = Cursor()
    again.restore(state, {"seed": 1}, allow_data_change=False)
    assert again == (4, 0)
    with pytest.raises(ResumeMismatchError, match="seed"):
        Cursor().restore(state, {"seed": 2}, allow_data_change=False)


def test_plan_cache_keeps_the_last_epochs_and_builds_each_once():
    built = []
    cache: PlanCache[int] = PlanCache(keep=2)

    def build(e: int) -> int:
        built.append(e)
        return e * 10

    assert [cache.get(e, build) for e in (0, 0, 1, 0, 2, 1)] == [0, 0, 10, 0, 20, 10]
    assert built == [0, 1, 2] and 0 not in cache


def _row_ids(ds, steps=None):
    out = []
    for i, batch in enumerate(ds):
        out.append(batch["row_id"].tolist())
        if steps is not None and i + 1 == steps:
            break
    return out


def _token_ids(ds, steps=None):
    out = []
    for i, batch in enumerate(ds.batches()):
        out.append(batch["input_ids"].tolist())
        if steps is not None and i + 1 == steps:
            break
    return out


def _elastic(make, read, steps_first: int):
    """Uninterrupted on 1 rank vs 2 ranks for ``steps_first`` steps, then resumed on 3 ranks
    from rank 0's state: the global steps must be the same, across the epoch boundary."""
    ref = make(0, 1)
    whole = read(ref) + read(ref)
    two = [make(r, 2) for r in range(2)]
    for d in two:
        assert len(read(d, steps_first)) == steps_first
    state = two[0].state_dict()
    three = [make(r, 3) for r in range(3)]
    for d in three:
        d.load_state_dict(state)
        assert d.cursor == (state["epoch"], state["step"])
    rest = [read(d) + read(d) for d in three]
    n = len(rest[0])
    assert n and all(len(r) == n for r in rest)
    joined = [sum((rest[r][s] for r in range(3)), []) for s in range(n)]
    assert joined == whole[steps_first : steps_first + n]


def test_row_loader_resumes_exactly_on_another_world_size(tmp_path):
    from tokenloom.rows.dataset import RowDataset

    uri = row_table(tmp_path, n=30)
    spec = RowSpec(table=uri, columns=["k"], global_batch=6, seed=4)

    def make(rank, world):
        return RowDataset(spec, rank=rank, world_size=world, transform_threads=0)

    _elastic(make, _row_ids, steps_first=3)


def test_token_loader_resumes_exactly_on_another_world_size(tmp_path):
    pytest.importorskip("torch")
    from tokenloom.loader.pipeline.dataset import PackedStream

    uri = token_table(tmp_path, [f"doc {i} " + "x" * (i % 7 * 3) for i in range(40)])
    spec = LoaderSpec(table=uri, seq_len=8, global_batch=6, seed=1)

    def make(rank, world):
        return PackedStream(spec, rank=rank, world_size=world)

    def read(ds, steps=None):  # a rank's share of a global step: its blocks, row by row
        return [[row for row in step] for step in _token_ids(ds, steps)]

    _elastic(make, read, steps_first=2)


# -- the take wrapper ---------------------------------------------------------------------------


def test_take_reads_rows_in_order_with_blobs_as_bytes_and_handles_no_ids(tmp_path):
    ds = lance.dataset(row_table(tmp_path, n=6))
    rowids = ds.to_table(columns=["id"], with_row_id=True).column("_rowid").to_numpy()
    got = take(ds, rowids[[4, 1]], ["k", "payload"])
    assert got.column("k").to_pylist() == [4, 1]
    assert got.column("payload").to_pylist() == [b"OK" + b"\x04\x00" * 5, b"OK" + b"\x01\x00" * 2]
    empty = take(ds, np.zeros(0, np.uint64), ["k", "payload"])
    assert empty.num_rows == 0 and empty.column_names == ["k", "payload"]
    assert empty.schema.field("payload").type == pa.large_binary()
    assert empty.schema.field("k").type == ds.schema.field("k").type


def test_take_names_a_missing_column(tmp_path):
    ds = lance.dataset(row_table(tmp_path, n=3))
    with pytest.raises(TakeError, match=r"the table has no column 'nope' \(version \d+; columns: "):
        take(ds, [0], ["k", "nope"])


def test_the_micro_batch_rule_stays_its_own_and_names_the_divisors(tmp_path):
    pytest.importorskip("torch")
    from tokenloom.train.config import TrainConfig
    from tokenloom.train.loop import TrainError, _micro_batches

    spec = LoaderSpec(table=str(tmp_path / "t"), seq_len=8, global_batch=12)
    cfg = TrainConfig(loader=spec, out=str(tmp_path / "run"), micro_batch_size=4)
    assert _micro_batches(cfg, 3) == (4, 1)
    with pytest.raises(TrainError, match=r"does not divide the 6 blocks .* \(1, 2, 3, 6\)"):
        _micro_batches(cfg, 2)
    with pytest.raises(PlanError, match="does not split evenly over 5 ranks"):
        _micro_batches(cfg, 5)  # the topology rule comes first, in its own words


def test_the_skeleton_is_pure_and_a_row_worker_needs_no_torch():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import tokenloom.loader.plan.stream, tokenloom.loader.plan.spec\n"
        "print(sorted(m for m in ('torch', 'lance', 'pyarrow') if m in sys.modules))\n"
        "import tokenloom.rows.dataset, tokenloom.loader.pipeline.transit\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "False"]
