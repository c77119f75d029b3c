"""A run continues onto changed data mid-epoch (a ``continue`` stream change), checked against a
naive reference that walks the two plans in plain Python: the old plan's steps before the change,
then the rows that still pass and were not delivered yet."""

from __future__ import annotations

import lance
import numpy as np
import pytest

from tests.conftest import real_paragraphs, write_jsonl
from tests.loader.tables import token_table
from tokenloom.ingest import ingest
from tokenloom.loader import LoaderSpec, ResumeMismatchError
from tokenloom.loader.pipeline.dataset import PackedStream
from tokenloom.loader.pipeline.planner import EmptyEpochError, Planner
from tokenloom.loader.plan.change import ChangeError, StreamChange, delivered_rows
from tokenloom.refresh import refresh_table
from tokenloom.table import Table

AT = 5  # the change takes effect at this global step of epoch 0
RECIPES = {
    "concat": {},
    "best_fit": {"packing": "best_fit", "fit_window": 4},
    "window": {"long_docs": "window", "window": 48, "overlap": 8},
    "interleave": {"block_order": "interleave"},
}


def _changed_table(tmp_path, texts: list[str], extra: list[str]) -> tuple[str, int, int]:
    """A table of ``texts`` (its version before), then ``extra`` rows appended and tokenized,
    row 3 deleted and row 4 re-flagged out of ``source != 'bad'`` (its version after)."""
    uri = token_table(tmp_path, texts)
    before = Table.open(uri).version
    write_jsonl(tmp_path / "more.jsonl", [{"text": t, "source": "new"} for t in extra])
    ingest([tmp_path / "more.jsonl"], uri, progress=False)
    refresh_table(uri, workers=0, progress=False)
    ds = lance.dataset(uri)
    ds.delete("id = 3")
    ds.update({"source": "'bad'"}, where="id = 4")
    return uri, before, Table.open(uri).version


def _texts(uri: str, version: int) -> dict[int, bytes]:
    t = lance.dataset(uri, version=version).to_table(columns=["id", "text", "source"])
    return {
        i: s.encode()
        for i, s, src in zip(
            t["id"].to_pylist(), t["text"].to_pylist(), t["source"].to_pylist(), strict=True
        )
        if src != "bad"
    }


def _spans(batch) -> list[tuple[int, int, int, int, int]]:
    return [tuple(x) for x in np.asarray(batch["spans"]).tolist()]


def _check_tokens(batch, texts: dict[int, bytes]) -> None:
    """Every stretch holds the bytes of its row at the version the step reads."""
    ids = np.asarray(batch["input_ids"])
    for blk, pos, rid, start, end in _spans(batch):
        want = np.frombuffer(texts[rid][start:end], dtype=np.uint8)
        assert ids[blk, pos : pos + end - start].tolist() == want.tolist(), (rid, start, end)


def _take(stream: PackedStream, n: int) -> list[dict]:
    """The next ``n`` steps (the cursor moves past exactly these)."""
    it = stream.batches()
    return [next(it) for _ in range(n)]


def _epoch(stream: PackedStream) -> list[dict]:
    """The rest of the stream's current epoch."""
    epoch, out = stream.epoch, []
    for batch in stream.batches():
        out.append(batch)
        if stream.epoch != epoch:
            break
    return out


@pytest.fixture(scope="module")
def paragraphs_90() -> list[str]:
    return real_paragraphs(90)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_continue_matches_the_naive_walk_of_both_plans(tmp_path, paragraphs_90, recipe):
    uri, v0, v1 = _changed_table(tmp_path, paragraphs_90[:50], paragraphs_90[50:])
    spec = LoaderSpec.from_options(
        table=uri, seq_len=64, global_batch=4, seed=7, filter="source != 'bad'", **RECIPES[recipe]
    )
    old = PackedStream(spec.replace(version=v0))
    old_texts, new_texts = _texts(uri, v0), _texts(uri, v1)
    # the reference, in plain Python: what the old plan fed before the change...
    delivered: set[int] = set()
    for batch in _take(old, AT):
        _check_tokens(batch, old_texts)
        delivered |= {s[2] for s in _spans(batch)}
    state = old.state_dict()
    # ...then every row the new version selects that was not fed yet, whole
    want = {i: len(t) for i, t in new_texts.items() if i not in delivered and len(t)}

    resumed = PackedStream(spec, data_change="continue")
    resumed.load_state_dict(state)
    change = resumed.change
    assert (change.epoch, change.step, change.global_step) == (0, AT, AT)
    assert (change.version_before, change.version_after) == (v0, v1)
    tail = _epoch(resumed)
    assert resumed.epoch == 1 and resumed.step == 0
    fed: dict[int, int] = {}
    for batch in tail:
        _check_tokens(batch, new_texts)
        for _blk, _pos, rid, start, end in _spans(batch):
            if recipe == "window":  # the context repeated at a window's start is fed once
                fed[rid] = max(fed.get(rid, 0), end)
            else:
                fed[rid] = fed.get(rid, 0) + end - start
    assert not set(fed) & delivered  # no row delivered twice in the epoch
    assert fed == want  # every row that still passes, whole; the new rows too
    assert 3 not in fed and 4 not in fed  # deleted, re-flagged out
    assert set(range(50, 90)) <= set(fed)
    # the epoch's layout (head steps at the old version) is what was fed
    view = resumed.view(0)
    assert view.steps == AT + len(tail)
    info = resumed.epoch_info(0)
    assert info["steps"] == view.steps and info["change"]["version_after"] == v1
    # later epochs plan the new version afresh
    fresh = Planner(spec.replace(version=v1))
    assert resumed.view(1).steps == fresh.view(1).steps
    a, b = resumed.view(1).layout(0), fresh.view(1).layout(0)
    assert a.spans.row_id.tolist() == b.spans.row_id.tolist()


def test_partly_fed_rows_are_counted_as_dropped_by_the_change(tmp_path, paragraphs_90):
    uri, v0, _ = _changed_table(tmp_path, paragraphs_90[:50], paragraphs_90[50:])
    spec = LoaderSpec(table=uri, seq_len=64, global_batch=4, seed=7, filter="source != 'bad'")
    head = Planner(spec.replace(version=v0)).view(0)
    d = delivered_rows(head, AT)
    # the naive count: the rows whose last stretch in the head stops short of their end
    last: dict[int, tuple[int, int]] = {}
    for s in range(AT):
        lay = head.layout(s)
        for rid, end, n in zip(
            lay.spans.row_id.tolist(),
            lay.spans.tok_end.tolist(),
            lay.spans.doc_len.tolist(),
            strict=True,
        ):
            last[rid] = (max(last.get(rid, (0, 0))[0], end), n)
    short = {r: n - e for r, (e, n) in last.items() if e < n}
    assert sorted(short) == d.partial_ids.tolist()
    assert sum(short.values()) == d.dropped_tokens > 0
    resumed = PackedStream(spec, data_change="continue")
    old = PackedStream(spec.replace(version=v0))
    _take(old, AT)
    resumed.load_state_dict(old.state_dict())
    assert resumed.epoch_info(0)["change"]["dropped_by_change"] == d.dropped_tokens


def test_after_a_change_a_resume_is_exact_on_another_world_size(tmp_path, paragraphs_90):
    uri, v0, v1 = _changed_table(tmp_path, paragraphs_90[:50], paragraphs_90[50:])
    spec = LoaderSpec(table=uri, seq_len=64, global_batch=4, seed=7, filter="source != 'bad'")
    old = PackedStream(spec.replace(version=v0))
    _take(old, AT)
    state = old.state_dict()
    one = PackedStream(spec, data_change="continue")
    one.load_state_dict(state)
    _take(one, 3)
    after = one.state_dict()  # three steps into the tail: the change is in the state
    assert after["inputs"]["changes"][0]["version_after"] == v1
    want = [b["input_ids"] for b in _epoch(one)]
    # a plain resume (no flag) rebuilds the change from the state, on two ranks
    ranks = [PackedStream(spec, rank=r, world_size=2) for r in range(2)]
    parts = []
    for r in ranks:
        r.load_state_dict(after)
        assert r.version == v1 and r.planner.changes == one.planner.changes
        parts.append([b["input_ids"] for b in _epoch(r)])
    assert len(parts[0]) == len(parts[1]) == len(want)
    for a, b, w in zip(*parts, want, strict=True):
        assert np.array_equal(np.concatenate([a, b]), w)
    # the head's steps are read at the old version, from the run's state too
    verify = PackedStream(spec)
    verify.load_state_dict(after)
    verify.seek(0, 0)
    old_texts = _texts(uri, v0)
    for step, batch in enumerate(_take(verify, AT + 1)):
        _check_tokens(batch, old_texts if step < AT else _texts(uri, v1))


def test_a_mixture_keeps_its_shares_and_plans_the_remaining_budget(tmp_path, paragraphs_90):
    uri, v0, v1 = _changed_table(tmp_path, paragraphs_90[:50], paragraphs_90[50:])
    mix = {"even": ("id % 2 = 0", 0.5), "odd": ("id % 2 = 1", 0.5)}
    spec = LoaderSpec.from_options(
        table=uri,
        seq_len=32,
        global_batch=4,
        seed=3,
        filter="source != 'bad'",
        mixture=mix,
        budget_tokens=32 * 4 * 40,
    )
    old = PackedStream(spec.replace(version=v0))
    delivered: set[int] = set()
    for batch in _take(old, AT):
        delivered |= {s[2] for s in _spans(batch)}
    resumed = PackedStream(spec, data_change="continue")
    resumed.load_state_dict(old.state_dict())
    tail = _epoch(resumed)
    assert AT + len(tail) == 40  # the budget: 40 steps over the change
    new_texts = _texts(uri, v1)
    pools = np.concatenate([np.asarray(b["block_pool"]) for b in tail])
    assert abs((pools == 0).mean() - 0.5) <= 0.1
    seen: set[int] = set()
    for batch in tail:
        _check_tokens(batch, new_texts)
        for blk, _pos, rid, start, _end in _spans(batch):
            assert rid % 2 == int(np.asarray(batch["block_pool"])[blk])
            if start == 0:
                assert rid not in seen  # not twice in the epoch (no pool ran out)
                seen.add(rid)
    assert not seen & delivered
    assert 3 not in seen and 4 not in seen


def test_the_default_refuses_a_changed_table_naming_the_option(tmp_path, paragraphs_90):
    uri, v0, v1 = _changed_table(tmp_path, paragraphs_90[:50], paragraphs_90[50:])
    spec = LoaderSpec(table=uri, seq_len=64, global_batch=4, version=v0)
    old = PackedStream(spec)
    next(old.batches())
    with pytest.raises(ResumeMismatchError):
        PackedStream(spec.replace(version=v1)).load_state_dict(old.state_dict())
    same = PackedStream(spec.replace(version=None), data_change="continue")
    same.load_state_dict(PackedStream(spec.replace(version=v1)).state_dict())
    assert same.change is None  # the data of the state: nothing to record
    # only which rows are selected may change: another block length is refused, named
    other = PackedStream(spec.replace(version=None, seq_len=32), data_change="continue")
    with pytest.raises(ResumeMismatchError, match="seq_len"):
        other.load_state_dict(old.state_dict())


def test_a_change_record_round_trips_and_rejects_bad_fields():
    c = StreamChange(
        kind="continue", epoch=1, step=2, global_step=9, version_before=3, version_after=5
    )
    assert StreamChange.from_dict(c.to_dict()) == c
    assert c.tail_seed(7, 0) != c.tail_seed(7, 1)
    with pytest.raises(ChangeError, match="step must be an integer >= 0"):
        StreamChange(
            kind="continue", epoch=0, step=-1, global_step=0, version_before=0, version_after=1
        )


def test_dataloader_workers_read_both_phases_of_a_changed_epoch(tmp_path, paragraphs_90):
    pytest.importorskip("torch")
    from tokenloom.loader import DataLoader, PackedDataset

    uri, v0, v1 = _changed_table(tmp_path, paragraphs_90[:50], paragraphs_90[50:])
    spec = LoaderSpec(table=uri, seq_len=64, global_batch=4, seed=7, filter="source != 'bad'")
    old = PackedStream(spec.replace(version=v0))
    _take(old, AT)
    one = PackedStream(spec, data_change="continue")
    one.load_state_dict(old.state_dict())
    state = one.state_dict()
    one.seek(0, AT - 2)  # two head steps, then the tail: groups straddle the change
    want = [b["input_ids"] for b in _epoch(one)]
    ds = PackedDataset(spec, read_group=3)
    ds.load_state_dict(state)
    ds.seek(0, AT - 2)
    loader = DataLoader(ds, num_workers=2)
    got = [b["input_ids"].numpy() for b in loader]
    assert len(got) == len(want)
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def test_two_changes_in_one_epoch_and_one_at_an_epoch_boundary(tmp_path, paragraphs_90):
    uri, v0, v1 = _changed_table(tmp_path, paragraphs_90[:30], paragraphs_90[30:60])
    spec = LoaderSpec(table=uri, seq_len=64, global_batch=4, seed=7, filter="source != 'bad'")
    old = PackedStream(spec.replace(version=v0))
    fed = {s[2] for b in _take(old, AT) for s in _spans(b)}
    first = PackedStream(spec.replace(version=v1), data_change="continue")
    first.load_state_dict(old.state_dict())
    fed |= {s[2] for b in _take(first, 3) for s in _spans(b)}
    write_jsonl(
        tmp_path / "third.jsonl", [{"text": t, "source": "new"} for t in paragraphs_90[60:]]
    )
    ingest([tmp_path / "third.jsonl"], uri, progress=False)
    refresh_table(uri, workers=0, progress=False)
    v2 = Table.open(uri).version
    second = PackedStream(spec, data_change="continue")
    second.load_state_dict(first.state_dict())
    assert [c.version_after for c in second.planner.changes] == [v1, v2]
    assert second.change.step == AT + 3 and second.change.global_step == AT + 3
    tail = _epoch(second)
    texts = _texts(uri, v2)
    rest = {s[2] for b in tail for s in _spans(b)}
    for b in tail:
        _check_tokens(b, texts)
    assert not rest & fed and rest | fed >= {i for i, t in texts.items() if t}
    # the whole epoch is laid out across both changes: each phase's steps from its version
    again = PackedStream(spec)
    again.load_state_dict(second.state_dict())
    again.seek(0, 0)
    firsts = _take(again, AT + 4)
    for step, b in enumerate(firsts):
        _check_tokens(b, _texts(uri, v0 if step < AT else v1 if step < AT + 3 else v2))
    # at an epoch boundary: the next epoch is the new version's rows, each once
    fourth = paragraphs_90[:3]
    write_jsonl(tmp_path / "fourth.jsonl", [{"text": t, "source": "new"} for t in fourth])
    ingest([tmp_path / "fourth.jsonl"], uri, progress=False)
    refresh_table(uri, workers=0, progress=False)
    v3 = Table.open(uri).version
    boundary = PackedStream(spec, data_change="continue")
    boundary.load_state_dict(second.state_dict())  # the cursor is at (1, 0)
    assert (boundary.change.epoch, boundary.change.step) == (1, 0)
    texts = _texts(uri, v3)
    epoch1 = _epoch(boundary)
    starts = [s[2] for b in epoch1 for s in _spans(b) if s[3] == 0]
    assert sorted(starts) == sorted(i for i, t in texts.items() if t)
    assert boundary.change.global_step == AT + 3 + len(tail)
    # --allow-data-change onto yet another version continues that version's plan, as is
    loose = PackedStream(spec.replace(version=v3), allow_data_change=True)
    loose.load_state_dict(second.state_dict())
    assert loose.planner.changes == () and (loose.epoch, loose.step) == (1, 0)


def test_a_used_up_epoch_or_pool_after_the_change(tmp_path, paragraphs_90):
    uri = token_table(tmp_path, paragraphs_90[:20])
    v0 = Table.open(uri).version
    spec = LoaderSpec(table=uri, seq_len=64, global_batch=4, seed=7)
    old = PackedStream(spec)
    steps = old.view(0).steps
    _take(old, steps - 1)  # the last step still to come
    lance.dataset(uri).delete("id >= 0")  # ...and every row gone
    # nothing is left of epoch 0: the cursor moves to epoch 1, which has no row (refused there)
    gone = PackedStream(spec.replace(version=None), data_change="continue")
    gone.load_state_dict(old.state_dict())
    assert gone.change.version_before == v0 and (gone.epoch, gone.step) == (1, 0)
    assert gone.view(0).steps == steps - 1
    with pytest.raises(EmptyEpochError, match="epoch 1 has no step"):
        gone.view(1)
    # a mixture pool with none of its rows left keeps its share with a new pass
    uri = token_table(tmp_path, paragraphs_90[:40], name="m.lance")
    mix = {"small": ("id < 4", 0.5), "big": ("id >= 4", 0.5)}
    spec = LoaderSpec.from_options(
        table=uri, seq_len=32, global_batch=4, seed=3, mixture=mix, budget_tokens=32 * 4 * 60
    )
    planner = Planner(spec)
    small, big = planner.universes()
    plan = planner.plan_rows(
        [np.zeros(len(small), dtype=bool), np.ones(len(big), dtype=bool)], seed=1, epoch=0
    )
    pools = plan.block_pools(np.arange(plan.num_blocks))
    assert abs((pools == 0).mean() - 0.5) <= 0.05
