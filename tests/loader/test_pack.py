"""The vectorised packer equals the naive stream walk; the batch contract's invariants hold."""

from __future__ import annotations

import time
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.loader.helpers import (
    EOS,
    PAD,
    assert_packed_equal,
    columns,
    corpora,
    epochs,
    gather,
    make_rows,
    seeds,
)
from tokenloom.loader import (
    PackedArrays,
    PlanError,
    block_spans,
    naive_pack,
    pack_blocks,
    plan_epoch,
    step_blocks,
    steps_in_epoch,
    token_ranges,
)
from tokenloom.loader.pipeline import prebuilt as prebuilt_module
from tokenloom.loader.plan import pack as pack_module
from tokenloom.loader.plan.pack import TokenSource
from tokenloom.loader.plan.spans import Spans


def pack(plan, rows, blocks, *, lookahead: bool) -> PackedArrays:
    spans = block_spans(plan, np.asarray(blocks, dtype=np.int64))
    tokens, offsets = gather(spans, rows, lookahead=lookahead)
    return pack_blocks(
        spans,
        tokens,
        offsets,
        num_blocks_in_batch=len(blocks),
        seq_len=plan.seq_len,
        eos_id=EOS,
        pad_id=PAD,
        lookahead=lookahead,
    )


def check_invariants(out: PackedArrays, L: int) -> None:
    """What attention and loss code relies on, stated without reference to the naive packer."""
    B = out.input_ids.shape[0]
    cu = out.cu_seqlens.astype(np.int64)
    assert out.cu_seqlens.dtype == np.int32 and cu[0] == 0 and cu[-1] == B * L
    assert (np.diff(cu) > 0).all() and set(range(0, B * L, L)) <= set(cu.tolist())
    assert out.max_seqlen == (int(np.diff(cu).max()) if B else 0)
    flat_pos = out.position_ids.reshape(-1)
    assert set(np.flatnonzero(flat_pos == 0).tolist()) == set(cu[:-1].tolist())
    assert (flat_pos[1:][flat_pos[1:] != 0] == flat_pos[:-1][flat_pos[1:] != 0] + 1).all()
    pad = out.doc_ids == -1
    assert (out.input_ids[pad] == PAD).all() and (out.labels[pad] == -100).all()
    assert int(pad.sum()) == out.padding_positions
    assert out.loss_positions == int((out.labels != -100).sum())
    assert out.real_tokens + out.eos_positions + out.padding_positions == B * L
    # A label is never taken across a document boundary: with distinct token ids, a non-EOS
    # label is the next token id of the same row (ids are consecutive within a row).
    lab, inp = out.labels, out.input_ids
    tok_label = (lab != -100) & (lab != EOS)
    assert (lab[tok_label] == inp[tok_label] + 1).all()


@settings(derandomize=True, max_examples=200, deadline=None)
@given(corpus=corpora(), seed=seeds, epoch=epochs, lookahead=st.booleans(), data=st.data())
def test_pack_equals_naive(
    corpus: tuple[int, list[int]], seed: int, epoch: int, lookahead: bool, data: st.DataObject
) -> None:
    L, lengths = corpus
    rows = make_rows(lengths)
    plan = plan_epoch(*columns(rows), seed=seed, epoch=epoch, seq_len=L)
    everything = list(range(plan.num_blocks)) + [-1]
    picked = data.draw(st.lists(st.sampled_from(everything), max_size=8))
    for blocks in (everything, picked):
        got = pack(plan, rows, blocks, lookahead=lookahead)
        want = naive_pack(
            rows,
            blocks,
            seed=seed,
            epoch=epoch,
            seq_len=L,
            eos_id=EOS,
            pad_id=PAD,
            lookahead=lookahead,
        )
        assert_packed_equal(got, want)
        check_invariants(got, L)


@settings(derandomize=True, max_examples=40, deadline=None)
@given(corpus=corpora(), seed=seeds, global_batch=st.sampled_from([1, 2, 3, 4, 6, 12]))
def test_global_batch_packs_identically_across_world_sizes(
    corpus: tuple[int, list[int]], seed: int, global_batch: int
) -> None:
    L, lengths = corpus
    rows = make_rows(lengths)
    plan = plan_epoch(*columns(rows), seed=seed, epoch=0, seq_len=L)
    by_world = {}
    for world in (w for w in range(1, 5) if global_batch % w == 0):
        b = global_batch // world
        steps = steps_in_epoch(plan, global_batch=(b) * world, drop_last=False)
        by_world[world] = [
            np.concatenate(
                [
                    pack(
                        plan,
                        rows,
                        step_blocks(
                            s,
                            rank=r,
                            world_size=world,
                            batch_size=b,
                            num_blocks=plan.num_blocks,
                            drop_last=False,
                        ),
                        lookahead=True,
                    ).input_ids
                    for r in range(world)
                ]
            )
            for s in range(steps)
        ]
    for world, got in by_world.items():
        assert len(got) == len(by_world[1])
        for a, b in zip(got, by_world[1], strict=True):
            assert np.array_equal(a, b), world


def test_worked_example() -> None:
    # Rows 5: [1, 2, 3], 8: [4]; seq_len 3; order fixed by the plan (checked below).
    rows = make_rows([3, 1])
    plan = plan_epoch(*columns(rows), seed=1, epoch=0, seq_len=3)
    assert plan.row_ids.tolist() == [5, 8]
    out = pack(plan, rows, [0, 1, -1], lookahead=True)
    # stream: 1 2 3 E 4 E | blocks [1 2 3] [E 4 E] [pad]
    assert out.input_ids.tolist() == [[1, 2, 3], [0, 4, 0], [-1, -1, -1]]
    assert out.labels.tolist() == [[2, 3, 0], [-100, 0, -100], [-100] * 3]
    assert out.position_ids.tolist() == [[0, 1, 2], [0, 0, 1], [0, 1, 2]]
    assert out.doc_ids.tolist() == [[0, 0, 0], [0, 1, 1], [-1, -1, -1]]
    assert out.cu_seqlens.tolist() == [0, 3, 4, 6, 9]
    assert out.continues.tolist() == [False, True, False]
    assert out.spans.tolist() == [[0, 0, 5, 0, 3], [1, 0, 5, 3, 3], [1, 1, 8, 0, 1]]
    counts = (out.real_tokens, out.eos_positions, out.padding_positions, out.loss_positions)
    assert counts == (4, 2, 3, 4)
    # Block ending mid-document: the lookahead token is its last label; without it, -100.
    plan2 = plan_epoch(*columns(rows), seed=1, epoch=0, seq_len=2)
    assert pack(plan2, rows, [0], lookahead=True).labels.tolist() == [[2, 3]]
    assert pack(plan2, rows, [0], lookahead=False).labels.tolist() == [[2, -100]]


def test_rejects_tokens_breaking_the_contract() -> None:
    rows = make_rows([5, 2])
    plan = plan_epoch(*columns(rows), seed=1, epoch=0, seq_len=4)
    assert plan.row_ids.tolist() == [5, 8]
    spans = block_spans(plan, np.array([0, 1]))
    tokens, offsets = gather(spans, rows, lookahead=False)
    kwargs = {"num_blocks_in_batch": 2, "seq_len": 4, "eos_id": EOS, "pad_id": PAD}
    with pytest.raises(
        PlanError,
        match=r"stretch 0 \(row id 5\) needs tokens \[0, 5\) .*lookahead=True\) but 4 were",
    ):
        pack_blocks(spans, tokens, offsets, lookahead=True, **kwargs)
    with pytest.raises(PlanError, match="must have shape"):
        pack_blocks(spans, tokens, offsets[:-1], lookahead=False, **kwargs)
    with pytest.raises(PlanError, match="seq_len=8 but the spans were planned with seq_len=4"):
        pack_blocks(spans, tokens, offsets, lookahead=False, **{**kwargs, "seq_len": 8})
    with pytest.raises(PlanError, match=r"outside \[0, num_blocks_in_batch=1\)"):
        pack_blocks(spans, tokens, offsets, lookahead=False, **{**kwargs, "num_blocks_in_batch": 1})
    start, stop = token_ranges(spans, lookahead=False)
    assert (stop - start).tolist() == np.diff(offsets).tolist()


def test_pack_throughput() -> None:
    """Print pack throughput on realistic lengths (median ~450, mean ~750 tokens); no assertion."""
    rng = np.random.default_rng(0)
    n = 200_000
    lengths = rng.lognormal(6.1, 1.0, n).astype(np.int64)
    ids = np.arange(n, dtype=np.int64)
    plan = plan_epoch(ids, lengths, seed=0, epoch=0, seq_len=2048)
    B = 8
    batches = [np.arange(s * B, (s + 1) * B, dtype=np.int64) for s in range(200)]
    t_spans = t_pack = 0.0
    for blocks in batches:
        t0 = time.perf_counter()
        spans = block_spans(plan, blocks)
        t1 = time.perf_counter()
        start, stop = token_ranges(spans, lookahead=True)
        size = stop - start  # synthetic reader: token t of row r is r * 8191 + t
        offsets = np.zeros(len(spans) + 1, dtype=np.int64)
        np.cumsum(size, out=offsets[1:])
        within = np.arange(offsets[-1]) - np.repeat(offsets[:-1], size)
        tokens = (np.repeat(spans.row_id * 8191 + start, size) + within).astype(np.int32)
        t2 = time.perf_counter()
        out = pack_blocks(
            spans,
            tokens,
            offsets,
            num_blocks_in_batch=B,
            seq_len=2048,
            eos_id=EOS,
            pad_id=PAD,
            lookahead=True,
        )
        t_spans += t1 - t0
        t_pack += time.perf_counter() - t2
    positions = len(batches) * B * 2048
    print(
        f"\nblock_spans: {len(batches) * B / t_spans:,.0f} blocks/s; "
        f"pack_blocks (B={B}, L=2048): {len(batches) * B / t_pack:,.0f} blocks/s, "
        f"{positions / t_pack / 1e6:.0f}M positions/s"
    )
    assert out.input_ids.shape == (B, 2048)


def test_two_million_token_document_packs_exactly() -> None:
    big = 2_000_000
    rows = {9: np.arange(1, big + 1, dtype=np.int64)}
    plan = plan_epoch(*columns(rows), seed=0, epoch=0, seq_len=1024)
    blocks = np.arange(plan.num_blocks, dtype=np.int64)
    out = pack(plan, rows, blocks, lookahead=True)
    pad = plan.padding_positions
    flat = out.input_ids.reshape(-1)
    assert np.array_equal(flat, np.concatenate([rows[9], [EOS], np.full(pad, PAD)]))
    labels = out.labels.reshape(-1)
    assert np.array_equal(labels[: big - 1], rows[9][1:])  # across block ends: lookahead
    assert labels[big - 1] == EOS and (labels[big:] == -100).all()
    assert out.continues.tolist() == [False] + [True] * (plan.num_blocks - 1)
    assert out.spans.shape == (plan.num_blocks, 5)
    assert (out.real_tokens, out.loss_positions, out.padding_positions) == (big, big, pad)


def _adversarial_batch(rng: np.random.Generator, *, windows: bool) -> dict:
    """Random stretches within the packer's contract, beyond what the planners make: empty
    documents (EOS only), documents running over several blocks, blocks continuing mid-document,
    stretches ending exactly at their document's end without the EOS (it is in the next block),
    padding tails, whole padding blocks, a short last block; with ``windows``, context ranges
    anywhere (inside, before, past the stretch) and windows ending anywhere, mid-block too."""
    B, L = int(rng.integers(1, 6)), int(rng.integers(1, 13))
    names = "block pos row_id doc_len tok_start tok_end has_eos ctx_end ends_window".split()
    fields: dict[str, list] = {k: [] for k in names}
    for b in range(B):
        if rng.random() < 0.15:
            continue  # a whole padding block
        pos, first = 0, True
        while pos < L:
            doc_len = int(rng.choice([0, 1, 2, int(rng.integers(0, 4 * L + 2))]))
            start = int(rng.integers(0, doc_len + 1)) if first and rng.random() < 0.5 else 0
            room, left = L - pos, doc_len - start
            ends = windows and rng.random() < 0.2 and left >= 1
            if ends:  # a window ends inside this block, or at its end
                end, eos = start + int(rng.integers(1, min(left, room) + 1)), False
            elif left + 1 <= room:
                end, eos = doc_len, True
            else:  # cut by the block's end (at the document's end when left == room)
                end, eos = start + room, False
            fields["block"].append(b)
            fields["pos"].append(pos)
            fields["row_id"].append(int(rng.integers(0, 1000)))
            fields["doc_len"].append(doc_len)
            fields["tok_start"].append(start)
            fields["tok_end"].append(end)
            fields["has_eos"].append(eos)
            fields["ctx_end"].append(int(rng.integers(0, end + 3)) if rng.random() < 0.5 else 0)
            fields["ends_window"].append(ends)
            pos += end - start + eos
            first = False
            if eos and rng.random() < 0.2:
                break  # a padding tail
    arr = {k: np.asarray(v, dtype=bool if k in ("has_eos", "ends_window") else np.int64)
           for k, v in fields.items()}  # fmt: skip
    if not windows:
        arr["ctx_end"] = arr["ends_window"] = None
    arr["doc"] = np.arange(len(arr["block"]), dtype=np.int64)
    blocks = np.arange(B, dtype=np.int64)
    return {"spans": Spans(seq_len=L, blocks=blocks, **arr), "B": B, "L": L}


def _compare_packers(spans, tokens, offsets, B: int, L: int, **kw) -> PackedArrays:
    got = pack_blocks(spans, tokens, offsets, num_blocks_in_batch=B, seq_len=L, eos_id=EOS,
                      pad_id=PAD, **kw)  # fmt: skip
    plain = tokens.gather(offsets) if isinstance(tokens, TokenSource) else tokens
    want = pack_blocks(spans, plain, offsets, num_blocks_in_batch=B, seq_len=L, eos_id=EOS,
                       pad_id=PAD, compiled=False, **kw)  # fmt: skip
    assert_packed_equal(got, want)
    # the numpy packer's slice copies of the stretches where they lie (long stretches) equal
    # its vectorised passes over the gathered tokens
    with mock.patch.object(pack_module, "_SLICE_MIN_TOKENS", 0):
        sliced = pack_blocks(spans, tokens, offsets, num_blocks_in_batch=B, seq_len=L,
                             eos_id=EOS, pad_id=PAD, compiled=False, **kw)  # fmt: skip
    assert_packed_equal(sliced, want)
    for name in ("context", "context_positions", "masked_positions", "masked_blocks"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        assert a is None or np.array_equal(a, b), (name, a, b)
    for counted in (got, want):  # both packers count as they pack
        pad, trains = counted.block_counts
        assert np.array_equal(pad, (want.doc_ids == -1).sum(axis=1))
        assert np.array_equal(trains, (want.labels != -100).sum(axis=1))
    return got


@pytest.fixture(scope="module")
def prebuilt():
    """The prebuilt kernel (built once a machine: a fresh clone's first run takes ~15 s)."""
    if not prebuilt_module.can_build():
        pytest.skip("no C compiler here: workers pack with numpy (tests/loader/test_workers.py)")
    assert prebuilt_module.ensure() is not None
    module = prebuilt_module.load()
    assert module is not None
    return module


@pytest.mark.parametrize("kernel", ["jit", "prebuilt"])
@pytest.mark.parametrize("windows", [False, True], ids=["concat", "windows"])
def test_compiled_packer_equals_numpy_reference_on_adversarial_stretches(
    windows: bool, kernel: str, request: pytest.FixtureRequest
) -> None:
    """Every field, every count, bit for bit: with and without lookahead, loss masks and the
    overlap loss, token ids of several dtypes (-100 among them), tokens gathered or left where
    they lie (a buffer plus copied ranges, as the reader hands them over), read-only buffers
    (Arrow's): numba's JIT kernel and the one built ahead of time for DataLoader workers (a
    token type it has no function for packs with numpy there)."""
    module = request.getfixturevalue("prebuilt") if kernel == "prebuilt" else None
    with mock.patch.object(pack_module, "_PREBUILT", module):
        _compare_on_adversarial_stretches(windows, module)


def _compare_on_adversarial_stretches(windows: bool, prebuilt: Any) -> None:
    rng = np.random.default_rng(7 if windows else 3)
    for case in range(250):
        batch = _adversarial_batch(rng, windows=windows)
        spans, B, L = batch["spans"], batch["B"], batch["L"]
        lookahead = bool(case % 2)
        start, stop = token_ranges(spans, lookahead=lookahead)
        n = stop - start
        offsets = np.zeros(len(spans) + 1, dtype=np.int64)
        np.cumsum(n, out=offsets[1:])
        dtype = (np.uint16, np.int32, np.int64, np.uint32, np.int16)[case % 5]
        tokens = rng.integers(0, 500, int(offsets[-1])).astype(dtype)
        if prebuilt is not None:  # the prebuilt function of its type, or none (numpy)
            fn = getattr(prebuilt, f"pack_rows_{np.dtype(dtype).name}", None)
            assert (fn is None) == (dtype is np.int16)
            assert pack_module._kernel(TokenSource(values=tokens, at=offsets[:-1])) is fn
        if np.dtype(dtype).kind == "i" and tokens.size:
            tokens[rng.random(tokens.size) < 0.05] = -100  # an id equal to the ignore index
        tokens.flags.writeable = bool(case % 3)
        masked = rng.random(tokens.size) < 0.3 if case % 4 < 2 else None
        kw = {"lookahead": lookahead, "masked": masked, "overlap_loss": windows and case % 5 == 0}
        got = _compare_packers(spans, tokens, offsets, B, L, **kw)
        check_invariants_without_ids(got, L)
        # the same ranges where a reader leaves them: most in one buffer, a few copied apart
        values = np.zeros(int(offsets[-1]) + 7, dtype=dtype)
        apart = rng.random(len(spans)) < 0.3
        extra = np.concatenate([tokens[offsets[i] : offsets[i + 1]] for i in np.flatnonzero(apart)]
                               or [np.zeros(0, dtype)]).astype(dtype)  # fmt: skip
        at = np.zeros(len(spans), dtype=np.int64)
        e = 0
        for i in range(len(spans)):
            if apart[i]:
                at[i], e = len(values) + e, e + int(n[i])
            else:  # at a random offset of the buffer (ranges may overlap: both packers read
                # the same buffer)
                at[i] = int(rng.integers(0, len(values) - n[i] + 1))
                values[at[i] : at[i] + n[i]] = tokens[offsets[i] : offsets[i + 1]]
        values.flags.writeable = bool(case % 3)
        source = TokenSource(values=values, at=at, extra=extra)
        _compare_packers(spans, source, offsets, B, L, **kw)


def check_invariants_without_ids(out: PackedArrays, L: int) -> None:
    """:func:`check_invariants` less the id pattern (these token ids are random)."""
    B = out.input_ids.shape[0]
    cu = out.cu_seqlens.astype(np.int64)
    assert out.cu_seqlens.dtype == np.int32 and cu[0] == 0 and cu[-1] == B * L
    assert (np.diff(cu) > 0).all() and set(range(0, B * L, L)) <= set(cu.tolist())
    flat_pos = out.position_ids.reshape(-1)
    assert set(np.flatnonzero(flat_pos == 0).tolist()) == set(cu[:-1].tolist())
    pad = out.doc_ids == -1
    assert (out.input_ids[pad] == PAD).all() and (out.labels[pad] == -100).all()
    assert out.real_tokens + out.eos_positions + out.padding_positions == B * L


def test_compiled_packer_refuses_ranges_outside_its_buffers() -> None:
    spans = _adversarial_batch(np.random.default_rng(1), windows=False)["spans"]
    start, stop = token_ranges(spans, lookahead=False)
    offsets = np.zeros(len(spans) + 1, dtype=np.int64)
    np.cumsum(stop - start, out=offsets[1:])
    n = int(offsets[-1])
    assert n > 0
    at = offsets[:-1].copy()
    at[np.flatnonzero(stop > start)[-1]] += 1  # one range runs past the buffer's end
    source = TokenSource(values=np.zeros(n, dtype=np.int32), at=at)
    with pytest.raises(PlanError, match="outside its buffers"):
        pack_blocks(spans, source, offsets, num_blocks_in_batch=len(spans.blocks),
                    seq_len=spans.seq_len, eos_id=EOS, pad_id=PAD, lookahead=False)  # fmt: skip
