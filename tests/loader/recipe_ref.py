"""Slow references for the data recipes: plans as lists of positions, packed one position at a time.

A *position* is ``(row id, t, n, piece, ctx_end, ends_window, piece_end)``: token ``t`` of a row of
``n`` tokens (``t == n`` is its EOS), inside piece ``piece`` whose positions end at ``piece_end``.
The labelling rules are written out here once, in the words of the docs, independently of the
vectorised packer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tests.loader.helpers import EOS, PAD, columns, gather
from tokenloom.loader import IGNORE_INDEX, PackedArrays, epoch_permutation, pack_blocks
from tokenloom.loader.plan.bestfit import naive_best_fit_blocks
from tokenloom.loader.plan.window import naive_window_docs

Pos = tuple[int, int, int, int, int, bool, int]


def naive_pieces(
    rows: dict[int, np.ndarray], *, seed: int, epoch: int, window: int, overlap: int
) -> list[tuple]:
    """Pieces in visiting order: ``(doc, row_id, tok_start, tok_end, has_eos, ctx_end, ends)``."""
    ids, n = columns(rows)
    ids, n = ids[n > 0], n[n > 0]
    perm = epoch_permutation(len(ids), seed=seed, epoch=epoch)
    return naive_window_docs(ids[perm].tolist(), n[perm].tolist(), window=window, overlap=overlap)


def piece_positions(rows: dict[int, np.ndarray], pieces: list[tuple], v: int) -> list[Pos]:
    _, rid, a, b, eos, ctx, ends = pieces[v]
    n = len(rows[rid])
    end = b + int(eos)
    return [(rid, t, n, v, ctx, ends, end) for t in range(a, end)]


def naive_concat_blocks(rows, pieces, L: int) -> list[list[Pos]]:
    stream = [p for v in range(len(pieces)) for p in piece_positions(rows, pieces, v)]
    return [stream[i : i + L] for i in range(0, len(stream), L)]


def naive_bestfit_blocks(rows, pieces, L: int, fit_window: int) -> list[list[Pos]]:
    sizes = [b - a + int(e) for _, _, a, b, e, _, _ in pieces]
    window_of = [d // fit_window for d, *_ in pieces]
    blocks = naive_best_fit_blocks(sizes, window_of, seq_len=L)
    return [[p for v in blk for p in piece_positions(rows, pieces, v)] for blk in blocks]


def naive_pack_positions(
    rows: dict[int, np.ndarray],
    plan_blocks: list[list[Pos]],
    blocks: Sequence[int],
    *,
    L: int,
    lookahead: bool,
) -> tuple[PackedArrays, np.ndarray]:
    """Pack ``blocks`` (indices into ``plan_blocks``, ``-1`` = padding) position by position.

    Returns:
        The batch and its ``(S, 2)`` context ranges.
    """
    B = len(blocks)
    inp, lab = np.full((B, L), PAD), np.full((B, L), IGNORE_INDEX)
    posn, seg_ids = np.zeros((B, L), dtype=np.int64), np.full((B, L), -1)
    cont, cu, spans, ctx_rows = np.zeros(B, dtype=bool), [], [], []

    def tok(rid: int, t: int) -> int:
        return EOS if t == len(rows[rid]) else int(rows[rid][t])

    for i, b in enumerate(blocks):
        content = plan_blocks[b] if b >= 0 else []
        seg, j0 = -1, 0
        for j in range(L):
            if j < len(content) and (j == 0 or content[j - 1][3] != content[j][3]):
                rid, t = content[j][0], content[j][1]
                cu.append(i * L + j)
                seg, j0 = seg + 1, j
                spans.append([i, j, rid, t, t])
                ctx_rows.append([t, t])
                cont[i] |= j == 0 and t > 0
            elif j == len(content):
                cu.append(i * L + j)
                j0 = j
            posn[i, j] = j - j0
            if j >= len(content):
                continue
            rid, t, n, v, ctx, ends, pend = content[j]
            inp[i, j], seg_ids[i, j] = tok(rid, t), seg
            if t < n:
                spans[-1][4] = t + 1
            if t < ctx:
                ctx_rows[-1][1] = t + 1
            # The label: the next token of the same row, trained at most once.
            if t == n or t + 1 < ctx:
                continue  # an EOS predicts nothing; context targets carry no loss
            if t + 1 == pend:  # last position of a piece without EOS
                if ends:
                    continue  # the next window trains this target
                if t + 1 == n:
                    lab[i, j] = EOS
                elif lookahead:
                    lab[i, j] = tok(rid, t + 1)
            elif j + 1 < len(content):
                lab[i, j] = tok(rid, t + 1)  # inside the piece and the block
            elif t + 1 == n:
                lab[i, j] = EOS  # the EOS is in the next block, but known
            elif lookahead:
                lab[i, j] = tok(rid, t + 1)
    cu.append(B * L)
    seg_len = np.diff(cu)
    ctx = np.asarray(ctx_rows, dtype=np.int64).reshape(-1, 2)
    real = sum(s[4] - s[3] for s in spans)
    pad = B * L - int((seg_ids >= 0).sum())
    out = PackedArrays(
        input_ids=inp.astype(np.int64),
        labels=lab.astype(np.int64),
        position_ids=posn,
        doc_ids=seg_ids.astype(np.int64),
        cu_seqlens=np.asarray(cu, dtype=np.int32),
        max_seqlen=int(seg_len.max()) if seg_len.size else 0,
        continues=cont,
        spans=np.asarray(spans, dtype=np.int64).reshape(-1, 5),
        real_tokens=real,
        eos_positions=B * L - pad - real,
        padding_positions=pad,
        loss_positions=int((lab != IGNORE_INDEX).sum()),
    )
    return out, ctx


def fast_pack(plan, spans_fn, rows, blocks, *, lookahead: bool) -> PackedArrays:
    """Spans of ``blocks`` from the fast planner, gathered and packed by :func:`pack_blocks`."""
    spans = spans_fn(plan, np.asarray(blocks, dtype=np.int64))
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


def context_of(out: PackedArrays) -> np.ndarray:
    """The batch's context ranges, empty ones where the packer set none."""
    if out.context is not None:
        return out.context
    return np.repeat(out.spans[:, 3:4], 2, axis=1)


def trained_targets(out: PackedArrays, where: dict[int, tuple[int, int]]) -> list[tuple[int, int]]:
    """``(row id, target index)`` of every position with a loss; ``where``: token id -> (row, t)."""
    got = []
    for x in out.input_ids[out.labels != IGNORE_INDEX].tolist():
        rid, t = where[x]  # an EOS never has a label, so x is a real (unique) token id
        got.append((rid, t + 1))
    return got
