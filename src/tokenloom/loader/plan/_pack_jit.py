"""The compiled packer (numba): one pass writing every field of a batch. Imported on the first
pack (:func:`tokenloom.loader.plan.pack.pack_blocks`), never by ``import tokenloom``.

:func:`pack_rows` walks the blocks and their stretches once and writes ``input_ids``, ``labels``,
``position_ids`` and ``doc_ids`` straight into the ``(4, B, L)`` output (shared memory in a
DataLoader worker), reading each stretch's tokens where they lie: in the taken rows' buffer
(Arrow's values, zero-copy) or in a small buffer of ranges copied from elsewhere. No gathered
token array, no masked insertion of the EOS, no running sums over the batch. It also returns the
segment boundaries and, per block, the positions it filled, the labels that train and those a
loss mask dropped, which the numpy packer (the reference, :func:`tokenloom.loader.plan.pack.
pack_blocks` with ``compiled=False``) derives with further passes. The caller has checked the
inputs (the same checks for both packers); the kernel trusts them, so it only reads inside the
buffers it is given.
"""

from __future__ import annotations

import numpy as np

from tokenloom.loader.plan._jit import jit

IGNORE = (
    -100
)  # tokenloom.loader.plan.pack.IGNORE_INDEX (not imported: that module imports this one)


@jit
def _tokens(
    src: np.ndarray,
    ntok: int,
    ids: np.ndarray,
    lab: np.ndarray,
    eos_id: int,
    has_eos: bool,
    doc_done: bool,
    lookahead: bool,
) -> None:
    """A stretch's ids and labels from ``src``, its read tokens (its ``ntok`` tokens, then the
    lookahead token when one was read): each token's label is the next token, the last one's
    the EOS (in this block or, when the document is done, the next one), the lookahead token,
    or nothing. (Views indexed from 0 by loop counters: no negative-index wraparound in the
    loops, which lets them vectorise.)"""
    for j in range(ntok):
        ids[j] = src[j]
    for j in range(ntok - 1):
        lab[j] = src[j + 1]
    if ntok > 0:
        if has_eos or doc_done:
            lab[ntok - 1] = eos_id
        elif lookahead:
            lab[ntok - 1] = src[src.shape[0] - 1]
        else:
            lab[ntok - 1] = IGNORE


@jit
def pack_rows(
    values: np.ndarray,
    extra: np.ndarray,
    at: np.ndarray,
    moff: np.ndarray,
    masked: np.ndarray,
    use_mask: bool,
    block: np.ndarray,
    pos: np.ndarray,
    tok_start: np.ndarray,
    tok_end: np.ndarray,
    doc_len: np.ndarray,
    has_eos: np.ndarray,
    ctx_end: np.ndarray,
    use_ctx: bool,
    ends_window: np.ndarray,
    use_ends: bool,
    lookahead: bool,
    overlap_loss: bool,
    eos_id: int,
    pad_id: int,
    seq_len: int,
    out: np.ndarray,
    cu: np.ndarray,
    filled: np.ndarray,
    loss: np.ndarray,
    dropped: np.ndarray,
) -> int:
    """Pack ``B = out.shape[1]`` blocks of ``L = seq_len`` positions (see the module doc).

    Stretch ``i``'s read tokens (``rlen = moff[i + 1] - moff[i]`` of them: its tokens, then a
    lookahead token when one was read) are ``values[at[i]:]`` when ``at[i] < len(values)``,
    else ``extra[at[i] - len(values):]``; ``masked[moff[i]:moff[i + 1]]`` says which lie in a
    loss-mask span (``use_mask``). ``ctx_end`` / ``ends_window`` are read only with
    ``use_ctx`` / ``use_ends``.

    Writes ``out`` (``(4, B, L)`` int64), the segment starts and then ``B * L`` into ``cu``
    (at least ``S + B + 1`` long), and per block the filled positions (``filled``), the
    positions whose label trains (``loss``) and the labels a loss mask set to ``-100``
    (``dropped``).

    Returns:
        The number of values written into ``cu``.
    """
    B = out.shape[1]
    L = seq_len
    ids_all = out[0].reshape(-1)
    lab_all = out[1].reshape(-1)
    pos_all = out[2].reshape(-1)
    doc_all = out[3].reshape(-1)
    nv = values.shape[0]
    S = block.shape[0]
    n_cu = 0
    i = 0
    for b in range(B):
        row = b * L
        first = i
        fill = 0
        n_loss = 0
        n_drop = 0
        while i < S and block[i] == b:
            p0 = row + pos[i]
            ntok = tok_end[i] - tok_start[i]
            eos = has_eos[i]
            m = ntok + (1 if eos else 0)
            rlen = moff[i + 1] - moff[i]
            doc_done = tok_end[i] == doc_len[i]
            ids = ids_all[p0 : p0 + m]
            lab = lab_all[p0 : p0 + m]
            a = at[i]
            if a < nv:
                _tokens(values[a : a + rlen], ntok, ids, lab, eos_id, eos, doc_done, lookahead)
            else:
                src = extra[a - nv : a - nv + rlen]
                _tokens(src, ntok, ids, lab, eos_id, eos, doc_done, lookahead)
            if eos:
                ids[ntok] = eos_id
                lab[ntok] = IGNORE
            elif use_ends and ends_window[i]:
                lab[m - 1] = IGNORE  # the next window trains this target
            if use_ctx and not overlap_loss:
                # positions whose target is a context token carry no loss
                c = min(max(ctx_end[i] - 1 - tok_start[i], 0), ntok)
                for j in range(c):
                    lab[j] = IGNORE
            if use_mask:
                hit = masked[moff[i] : moff[i] + rlen]
                for j in range(ntok - 1):
                    if hit[j + 1] and lab[j] != IGNORE:
                        lab[j] = IGNORE
                        n_drop += 1
                if ntok > 0 and not eos and lookahead and not doc_done:
                    if hit[rlen - 1] and lab[ntok - 1] != IGNORE:
                        lab[ntok - 1] = IGNORE
                        n_drop += 1
            seg = i - first
            posn = pos_all[p0 : p0 + m]
            docs = doc_all[p0 : p0 + m]
            for j in range(m):
                posn[j] = j
                docs[j] = seg
            for j in range(m):
                n_loss += lab[j] != IGNORE
            cu[n_cu] = p0
            n_cu += 1
            fill = pos[i] + m
            i += 1
        if fill < L:  # the block's padding tail: one more segment
            cu[n_cu] = row + fill
            n_cu += 1
            ids = ids_all[row + fill : row + L]
            lab = lab_all[row + fill : row + L]
            posn = pos_all[row + fill : row + L]
            docs = doc_all[row + fill : row + L]
            for j in range(L - fill):
                ids[j] = pad_id
                lab[j] = IGNORE
                posn[j] = j
                docs[j] = -1
        filled[b] = fill
        loss[b] = n_loss
        dropped[b] = n_drop
    cu[n_cu] = B * L
    return n_cu + 1
