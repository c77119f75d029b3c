"""Pack the tokens of a batch's stretches into fixed blocks with labels and segment metadata.

**Input contract of** :func:`pack_blocks`. For each stretch ``i`` of ``spans`` (in ``spans``
order) the caller passes the document's tokens ``[start_i, stop_i)`` as returned by
:func:`token_ranges`: ``start_i = tok_start``, and ``stop_i = min(tok_end + 1, doc_len)`` with
``lookahead=True``, or ``stop_i = tok_end`` with ``lookahead=False``. The extra *lookahead* token is
present only for a stretch that ends inside its document's tokens (the block ends mid-document); it
is never written to ``input_ids``, only used as the label of the block's last position. Without it
that one label is ``-100`` (one lost target per block ending mid-document, for cheaper reads). All
slices are concatenated into ``tokens`` with ``token_offsets`` (``(S + 1,)``, ``offsets[0] == 0``)
delimiting them, the layout of an Arrow list array's values and offsets.

**Output choices** (all per block row of the ``(B, L)`` batch):

* ``labels``: the next stream position's id when it belongs to the same document, so a document's
  last token predicts its EOS (even when the EOS falls in the next block); the EOS predicts
  nothing (``-100``: the next document is unrelated); padding is ``-100``.
* Segments: every stretch is one segment, and a block's padding tail is one more segment, so
  ``cu_seqlens`` (int32, over the flattened ``B * L`` batch) has a boundary at every segment start
  and every block start and ends at ``B * L``. A block starting mid-document starts a new segment:
  attention is isolated per segment, so the continuation cannot see its beginning anyway.
* ``position_ids`` restart at 0 at every ``cu_seqlens`` boundary (segment-relative, padding
  included); ``doc_ids`` number the stretches of a block 0, 1, 2, ... and are ``-1`` on padding.

**Windows of long documents** (optional :attr:`Spans.ctx_end` / :attr:`Spans.ends_window`, set by
:mod:`~tokenloom.loader.plan.window`). A window after the first starts with the last tokens of the
previous window as *context only*: the position whose **target** is a context token gets label
``-100`` (the model is not trained to predict context it was given again); the last context
token's label, the first new token, is trained. A stretch that ``ends_window`` gets ``-100`` as its
last label and reads no lookahead token, because the next window trains that target with its
context. Both fields ``None`` (the default planners) leave every output exactly as before; when
either is set, :attr:`PackedArrays.context` holds each stretch's context token range.

**Loss masks** (optional ``masked``, :mod:`~tokenloom.loader.pipeline.lossmask`): a ``(T,)`` bool
array aligned with ``tokens`` saying which read tokens lie in a masked span of their row. A position
whose target is such a token (the next token of the stretch, or its lookahead token) gets
``-100``; :attr:`PackedArrays.masked_positions` counts the labels this turned to ``-100``.
``None`` leaves every output exactly as before.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenloom.loader.plan.epoch import PlanError
from tokenloom.loader.plan.scratch import scratch
from tokenloom.loader.plan.shuffle import epoch_permutation
from tokenloom.loader.plan.spans import Spans

__all__ = [
    "IGNORE_INDEX",
    "PackedArrays",
    "TokenSource",
    "token_ranges",
    "pack_blocks",
    "naive_pack",
]

IGNORE_INDEX = -100
"""Label of positions that carry no loss (PyTorch's ``cross_entropy`` default ``ignore_index``)."""


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class PackedArrays:
    """One packed batch of ``B`` blocks of ``L`` positions, as numpy arrays."""

    input_ids: np.ndarray
    """``(B, L)`` int64: token ids, EOS after each document, ``pad_id`` on padding."""
    labels: np.ndarray
    """``(B, L)`` int64: next token of the same document, else ``-100``."""
    position_ids: np.ndarray
    """``(B, L)`` int64: index within the segment (restarts at every ``cu_seqlens`` boundary)."""
    doc_ids: np.ndarray
    """``(B, L)`` int64: segment index within the block, ``-1`` on padding."""
    cu_seqlens: np.ndarray
    """``(num_segments + 1,)`` int32: segment boundaries over the flattened ``B * L`` positions."""
    max_seqlen: int
    """Longest segment (padding segments included)."""
    continues: np.ndarray
    """``(B,)`` bool: the block's first stretch starts mid-document."""
    spans: np.ndarray
    """``(S, 5)`` int64 provenance: (block in batch, position, row id, token start, token end)."""
    real_tokens: int
    """Document tokens in the batch (EOS excluded)."""
    eos_positions: int
    """EOS positions in the batch."""
    padding_positions: int
    """Padding positions in the batch (``B * L - real_tokens - eos_positions``)."""
    loss_positions: int
    """Positions whose label is not ``-100``."""
    context: np.ndarray | None = None
    """``(S, 2)`` int64 ``[ctx_start, ctx_end)``: the context-only tokens of each stretch (empty
    range when none), in ``spans`` order; ``None`` unless the spans carry window fields."""
    context_positions: int = 0
    """Context-only token positions in the batch (counted in :attr:`real_tokens` too)."""
    masked_positions: int = 0
    """Positions a loss mask set to ``-100`` that would otherwise carry a label (not in
    :attr:`loss_positions`)."""
    masked_blocks: np.ndarray | None = None
    """``(B,)`` int64 :attr:`masked_positions` of each block; ``None`` without a loss mask."""
    block_counts: np.ndarray | None = None
    """``(2, B)`` int64: padding positions and positions whose label trains, per block (the
    compiled packer counts them as it writes, the numpy one from its layout and one pass over
    the labels; ``None``: the caller counts them on the arrays)."""


@dataclass(frozen=True, eq=False)
class TokenSource:
    """The read tokens of a batch's stretches where they lie, not gathered into one array.

    Stretch ``i``'s ``n_i = offsets[i + 1] - offsets[i]`` tokens (the ``token_offsets`` passed
    with it) are ``values[at[i] : at[i] + n_i]`` when ``at[i] < len(values)``, else
    ``extra[at[i] - len(values) :][:n_i]``: ``values`` is typically the taken rows' token
    buffer (Arrow's values, zero-copy) and ``extra`` the few ranges copied from elsewhere (the
    long-document cache), one after another.
    """

    values: np.ndarray
    """The buffer holding most ranges (any integer dtype)."""
    at: np.ndarray
    """``(S,)`` int64: where each range starts in ``values`` followed by ``extra``."""
    extra: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Ranges that are not in ``values``."""

    def check(self, offsets: np.ndarray) -> None:
        """Refuse ranges outside both buffers, or across their border.

        Raises:
            PlanError: A range is not inside ``values`` nor inside ``extra``.
        """
        at = np.asarray(self.at)
        n = offsets[1:] - offsets[:-1]
        if at.shape != n.shape:
            raise PlanError(f"token source: {at.shape[0]} range starts for {n.shape[0]} stretches")
        nv, ne = self.values.shape[0], self.extra.shape[0]
        ok = (n == 0) | ((at >= 0) & (at + n <= nv)) | ((at >= nv) & (at + n <= nv + ne))
        if not bool(ok.all()):
            i = int(np.flatnonzero(~ok)[0])
            raise PlanError(
                f"token source: stretch {i}'s {n[i]} tokens at {at[i]} are outside its buffers "
                f"({nv} values, {ne} extra)"
            )

    def last_tokens(self, offsets: np.ndarray, stretches: np.ndarray) -> np.ndarray:
        """The last token of each of ``stretches``' ranges (non-empty), as int64."""
        at = np.asarray(self.at, dtype=np.int64)[stretches]
        a = at + (offsets[stretches + 1] - offsets[stretches]) - 1
        nv = self.values.shape[0]
        out = np.empty(len(a), dtype=np.int64)
        here = a < nv
        out[here] = self.values[a[here]]
        out[~here] = self.extra[a[~here] - nv]
        return out

    def gather(self, offsets: np.ndarray) -> np.ndarray:
        """The ranges concatenated: the ``(T,)`` tokens :func:`pack_blocks` also takes."""
        nv = self.values.shape[0]
        lengths = offsets[1:] - offsets[:-1]
        dtype = self.values.dtype if nv or not self.extra.shape[0] else self.extra.dtype
        tokens = np.empty(int(offsets[-1]), dtype=dtype)
        at = np.asarray(self.at, dtype=np.int64)
        other = np.flatnonzero((at >= nv) & (lengths > 0))
        if not len(other):  # one source buffer: one gather
            _gather(self.values, at, lengths, offsets, tokens)
            return tokens
        # The few ranges of ``extra`` are copied one by one; the rest is one gather from
        # ``values``, the extra ranges' positions in it written first and then overwritten.
        if int(lengths.sum()) > int(lengths[other].sum()):
            at0 = at.copy()
            at0[other] = 0
            _gather(self.values, at0, lengths, offsets, tokens, clip=True)
        for i in other.tolist():
            lo = int(at[i]) - nv
            tokens[offsets[i] : offsets[i + 1]] = self.extra[lo : lo + int(lengths[i])]
        return tokens


_SLICE_MIN_TOKENS = 64
"""Mean tokens per stretch from which the numpy packer copies each stretch as one slice (a
Python step of ~1 us each) rather than in vectorised passes over every token."""


def _copy_stretches(source: TokenSource, out: np.ndarray, at: np.ndarray, n: np.ndarray) -> None:
    """``out[at[i] : at[i] + n[i]]`` = the first ``n[i]`` tokens of stretch ``i`` in ``source``,
    one slice copy per stretch."""
    values, extra = source.values, source.extra
    nv = values.shape[0]
    for d, a, k in zip(at.tolist(), np.asarray(source.at).tolist(), n.tolist(), strict=True):
        if k:
            if a < nv:
                out[d : d + k] = values[a : a + k]
            else:
                out[d : d + k] = extra[a - nv : a - nv + k]


def _gather(
    buf: np.ndarray,
    begin: np.ndarray,
    lengths: np.ndarray,
    at: np.ndarray,
    out: np.ndarray,
    *,
    clip: bool = False,
) -> None:
    """``out[at[i] : at[i] + lengths[i]] = buf[begin[i] : begin[i] + lengths[i]]`` for ranges
    that tile ``out`` in order: one ``take`` through an index built as a running sum of its
    jumps (in a reused scratch array: no fresh megabyte-sized temporaries). ``clip``: ranges
    past the end of ``buf`` are allowed (placeholders the caller overwrites)."""
    nz = lengths > 0
    b, n, o = begin[nz], lengths[nz], at[:-1][nz]
    if not len(b):
        return
    idx = scratch("read.gather", len(out))
    idx.fill(1)
    idx[o[1:]] = b[1:] - (b[:-1] + n[:-1] - 1)
    idx[0] = b[0]
    np.cumsum(idx, out=idx)
    np.take(buf, idx, out=out, mode="clip" if clip else "raise")


def token_ranges(spans: Spans, *, lookahead: bool) -> tuple[np.ndarray, np.ndarray]:
    """The token range of its document the reader must pass for each stretch (see module doc).

    Args:
        spans: The stretches to pack.
        lookahead: Include the token after a stretch that ends inside its document.

    Returns:
        ``(start, stop)``, each ``(S,)`` int64: pass ``doc_tokens[start[i]:stop[i]]`` for stretch
        ``i``.
    """
    stop = np.minimum(spans.tok_end + 1, spans.doc_len) if lookahead else spans.tok_end
    if lookahead and spans.ends_window is not None:
        stop = np.where(spans.ends_window, spans.tok_end, stop)  # the next window trains it
    return spans.tok_start, stop


def _check_inputs(
    spans: Spans, offsets: np.ndarray, n_tokens: int, B: int, L: int, la: bool
) -> None:
    S = len(spans)
    for name in ("ctx_end", "ends_window"):
        extra = getattr(spans, name)
        if extra is not None and np.shape(extra) != (S,):
            raise PlanError(f"spans.{name} must have shape ({S},), got {np.shape(extra)}")
    if L != spans.seq_len:
        raise PlanError(f"seq_len={L} but the spans were planned with seq_len={spans.seq_len}")
    if offsets.shape != (S + 1,) or offsets[0] != 0 or offsets[-1] != n_tokens:
        raise PlanError(
            f"token_offsets must have shape ({S + 1},), start at 0 and end at len(tokens)="
            f"{n_tokens}; got shape {offsets.shape}"
            + (f", first {offsets[0]}, last {offsets[-1]}" if offsets.size else "")
        )
    start, stop = token_ranges(spans, lookahead=la)
    got = np.diff(offsets)
    if not np.array_equal(got, stop - start):
        i = int(np.flatnonzero(got != stop - start)[0])
        raise PlanError(
            f"stretch {i} (row id {spans.row_id[i]}) needs tokens [{start[i]}, {stop[i]}) of its "
            f"document ({stop[i] - start[i]} tokens, lookahead={la}) but {got[i]} were passed"
        )
    if spans.ends_window is not None and bool((spans.ends_window & spans.has_eos).any()):
        i = int(np.flatnonzero(spans.ends_window & spans.has_eos)[0])
        raise PlanError(f"stretch {i} both ends its window and holds its document's EOS")
    if S == 0:
        return
    m = spans.length
    block, pos = spans.block, spans.pos
    if int(block.min()) < 0 or int(block.max()) >= B:
        raise PlanError(f"spans refer to blocks outside [0, num_blocks_in_batch={B})")
    new_block = np.ones(S, dtype=bool)
    new_block[1:] = block[1:] != block[:-1]
    want_pos = np.zeros(S, dtype=np.int64)
    want_pos[1:] = np.where(new_block[1:], 0, pos[:-1] + m[:-1])
    ok = (m >= 1) & (pos == want_pos) & (pos + m <= L)
    ok[1:] &= block[1:] >= block[:-1]
    if not bool(ok.all()):
        i = int(np.flatnonzero(~ok)[0])
        raise PlanError(
            f"stretch {i} (block {block[i]}, position {pos[i]}, {m[i]} positions) does not "
            f"continue the previous one; spans must come from block_spans"
        )


def pack_blocks(
    spans: Spans,
    tokens: np.ndarray | TokenSource,
    token_offsets: np.ndarray,
    *,
    num_blocks_in_batch: int,
    seq_len: int,
    eos_id: int,
    pad_id: int,
    lookahead: bool,
    out: np.ndarray | None = None,
    masked: np.ndarray | None = None,
    overlap_loss: bool = False,
    compiled: bool = True,
) -> PackedArrays:
    """Pack stretches into a ``(B, L)`` batch: O(B * L + S).

    Compiled (the default): one pass of :func:`tokenloom.loader.plan._pack_jit.pack_rows` writes the
    four fields from the tokens where they lie. ``compiled=False``: the vectorised numpy
    packer, the reference the compiled one is tested against field by field (same output).

    Args:
        spans: The stretches of the batch's blocks
        (:func:`~tokenloom.loader.plan.spans.block_spans`). tokens: ``(T,)`` integer token ids of
        every stretch, per the module's input contract;
            or a :class:`TokenSource`: the same ranges where they lie (no gathered copy).
        token_offsets: ``(S + 1,)`` integers delimiting each stretch's tokens in ``tokens``
            (with a :class:`TokenSource`: their lengths, as CSR; ``masked`` is aligned with
            them).
        num_blocks_in_batch: ``B``, the rows of the batch (``len(spans.blocks)`` normally).
        seq_len: ``L``, positions per block (must equal the plan's).
        eos_id: Id written after each document.
        pad_id: Id written on padding positions.
        lookahead: Whether ``tokens`` holds the lookahead token (see the module docstring).
        out: Optional ``(4, B, L)`` int64 C-contiguous buffer that receives ``input_ids``,
            ``labels``, ``position_ids`` and ``doc_ids`` (e.g. shared memory a DataLoader
            worker hands over without a copy); the returned arrays are views of it.
        masked: Optional ``(T,)`` bool, aligned with ``tokens``: the read tokens in a loss-mask
            span (see the module docstring).
        overlap_loss: Keep the loss on targets that are context tokens (a window's overlap is
            trained again; ``context`` still reports the range). Default: context only.
        compiled: Pack with the compiled kernel (``False``: the numpy reference).

    Returns:
        The :class:`PackedArrays`.

    Raises:
        PlanError: The inputs break the contract (lengths, offsets, ordering, block range).
    """
    B, L = int(num_blocks_in_batch), int(seq_len)
    if B * L >= 2**31:
        raise PlanError(f"B * L = {B * L} positions do not fit int32 cu_seqlens")
    offs = np.asarray(token_offsets).astype(np.int64, copy=False)
    if isinstance(tokens, TokenSource):
        source = tokens
        n_tokens = int(offs[-1]) if offs.ndim == 1 and offs.size else 0
    else:
        toks = np.asarray(tokens).reshape(-1)
        source = TokenSource(values=toks, at=offs[:-1] if offs.ndim == 1 else offs)
        n_tokens = int(toks.shape[0])
    for buf in (source.values, source.extra):
        if buf.size and not np.issubdtype(buf.dtype, np.integer):
            raise PlanError(f"tokens must hold integer ids, got dtype {buf.dtype}")
    _check_inputs(spans, offs, n_tokens, B, L, bool(lookahead))
    if isinstance(tokens, TokenSource):
        tokens.check(offs)
    if masked is not None:
        masked = np.asarray(masked, dtype=bool).reshape(-1)
        if masked.shape != (n_tokens,):
            raise PlanError(f"masked must have shape {(n_tokens,)}, got {masked.shape}")
    if out is None:
        out = np.empty((4, B, L), dtype=np.int64)
    elif out.shape != (4, B, L) or out.dtype != np.int64 or not out.flags.c_contiguous:
        raise PlanError(f"out must be a C-contiguous (4, {B}, {L}) int64 array")
    kernel = _kernel(source) if compiled else None
    if kernel is not None:
        return _pack_compiled(
            kernel, spans, source, offs, B, L, eos_id, pad_id, bool(lookahead), out, masked,
            overlap_loss,
        )  # fmt: skip
    plain = None if isinstance(tokens, TokenSource) else source.values
    return _pack_numpy(
        spans, source, plain, offs, B, L, eos_id, pad_id, bool(lookahead), out, masked,
        overlap_loss,
    )  # fmt: skip


_RAMP = np.zeros(0, dtype=np.int64)
_RAMP.flags.writeable = False


def _ramp(n: int) -> np.ndarray:
    """``np.arange(n)`` as int64, read-only, from one array kept (grown when too short)."""
    global _RAMP
    ramp = _RAMP
    if ramp.shape[0] < n:
        ramp = np.arange(max(n, 2 * ramp.shape[0], 1 << 16), dtype=np.int64)
        ramp.flags.writeable = False
        _RAMP = ramp
    return ramp[:n]


def _pack_numpy(
    spans: Spans,
    source: TokenSource,
    plain: np.ndarray | None,
    offs: np.ndarray,
    B: int,
    L: int,
    eos_id: int,
    pad_id: int,
    lookahead: bool,
    out: np.ndarray,
    masked: np.ndarray | None,
    overlap_loss: bool,
) -> PackedArrays:
    """The vectorised numpy packer (the reference; inputs checked by :func:`pack_blocks`).
    ``plain``: the tokens as one array in ``offs``'s layout (``None``: gathered from ``source``
    when needed)."""
    ids_out, lab_out, pos_out, doc_out = (out[i].reshape(-1) for i in range(4))  # (B * L,)
    S = len(spans)
    has_eos = spans.has_eos
    ntok = spans.tok_end - spans.tok_start  # (S,) tokens of each stretch
    m = ntok + has_eos  # (S,) positions of each stretch
    P = int(m.sum())  # filled positions: each block's prefix, blocks in order
    end = np.cumsum(m)  # (S,) one past each stretch's last position among the P
    eos_at = end[has_eos] - 1  # (E,) where the EOS go

    # Values of the P filled positions: the tokens (lookahead ones removed), EOS inserted.
    full = P == B * L  # no padding: the filled positions are the batch, written in place
    values = ids_out if full else scratch("pack.values", P)
    # Long stretches are copied where they lie, one slice each (no gathered copy of the tokens
    # and no masked insertion of the EOS: a third of this packer's time on documents of
    # hundreds of tokens); short ones in vectorised passes, cheaper than a slice per stretch.
    slices = masked is None and S > 0 and int(ntok.sum()) >= _SLICE_MIN_TOKENS * S
    toks = plain if plain is not None or slices else source.gather(offs)
    if slices:
        _copy_stretches(source, values, end - m, ntok)
    else:
        assert toks is not None
        extra = (offs[1:] - offs[:-1]) > ntok  # (S,) stretch came with a lookahead token
        is_tok = np.ones(P, dtype=bool)
        is_tok[eos_at] = False
        if extra.any():
            keep = np.ones(toks.shape[0], dtype=bool)
            keep[offs[1:][extra] - 1] = False
            values[is_tok] = toks[keep]
        else:
            values[is_tok] = toks
    values[eos_at] = eos_id

    # Labels: the next filled value, then fix the positions where that is not the next token of
    # the same document: each EOS, and each stretch cut by its block's end.
    lab = lab_out if full else scratch("pack.labels", P)
    lab[:-1] = values[1:]
    lab[eos_at] = IGNORE_INDEX
    cut = ~has_eos  # (S,) stretch ends at the block end before its EOS (at most one per block)
    last = end[cut] - 1
    doc_done = spans.tok_end[cut] == spans.doc_len[cut]
    tail = np.full(last.shape[0], IGNORE_INDEX, dtype=np.int64)
    tail[doc_done] = eos_id  # the EOS is in the next block, but it is known
    if lookahead:
        tail[~doc_done] = source.last_tokens(offs, np.flatnonzero(cut)[~doc_done])
    lab[last] = tail
    lost = 0 if lookahead else int((~doc_done).sum())  # targets given up without lookahead
    windowed = spans.ctx_end is not None or spans.ends_window is not None
    context = None
    if spans.ends_window is not None:
        lab[end[np.asarray(spans.ends_window, dtype=bool)] - 1] = IGNORE_INDEX
    if spans.ctx_end is not None:
        ctx_end = np.asarray(spans.ctx_end, dtype=np.int64)
        # Positions holding tokens t < ctx_end - 1 target a context token t + 1: no loss (none
        # masked with overlap_loss: the overlap is trained again).
        c = np.clip(ctx_end - 1 - spans.tok_start, 0, ntok)  # (S,)
        if overlap_loss:
            c = np.zeros_like(c)
        first_pos = end - m  # (S,) first filled position of each stretch
        c_total = int(c.sum())
        idx = np.repeat(first_pos, c) + (np.arange(c_total) - np.repeat(np.cumsum(c) - c, c))
        lab[idx] = IGNORE_INDEX
        ctx_hi = np.clip(ctx_end, spans.tok_start, spans.tok_end)
        context = np.stack([spans.tok_start, ctx_hi], axis=1).astype(np.int64).reshape(S, 2)
    elif windowed:
        context = np.stack([spans.tok_start, spans.tok_start], axis=1).astype(np.int64)
        context = context.reshape(S, 2)
    n_masked, masked_blocks = 0, None
    if masked is not None:
        # The mask of each position's target: the next filled value's (EOS never masked), or
        # for a stretch cut by its block's end, its lookahead token's.
        mv = np.zeros(P, dtype=bool)
        mv[is_tok] = masked[keep] if extra.any() else masked
        drop = np.zeros(P, dtype=bool)
        drop[:-1] = mv[1:]
        drop[eos_at] = False
        drop[last] = False
        if lookahead:
            drop[last[~doc_done]] = masked[offs[1:][cut][~doc_done] - 1]
        drop &= lab != IGNORE_INDEX  # only labels that would train count as masked
        hit = np.flatnonzero(drop)
        lab[hit] = IGNORE_INDEX
        n_masked = int(hit.shape[0])
        stretch = np.searchsorted(end, hit, side="right")  # (M,) stretch of each masked position
        masked_blocks = np.bincount(spans.block[stretch], minlength=B).astype(np.int64)

    # Lay the filled prefixes into (B, L).
    filled = np.zeros(B, dtype=np.int64)
    new_block = np.ones(S, dtype=bool)
    new_block[1:] = spans.block[1:] != spans.block[:-1]
    last_of_block = np.ones(S, dtype=bool)
    last_of_block[:-1] = new_block[1:]
    filled[spans.block[last_of_block]] = (spans.pos + m)[last_of_block]  # prefixes start at 0
    if not full:
        inside = (np.arange(L) < filled[:, None]).reshape(-1)  # (B * L,) filled prefixes
        ids_out.fill(pad_id)
        lab_out.fill(IGNORE_INDEX)
        ids_out[inside] = values
        lab_out[inside] = lab

    # Segments: each stretch, plus each block's padding tail (whole padding blocks included).
    first_of_block = np.maximum.accumulate(np.where(new_block, np.arange(S), 0))
    pad_rows = np.flatnonzero(filled < L)
    seg_start = np.concatenate([spans.block * L + spans.pos, pad_rows * L + filled[pad_rows]])
    seg_doc = np.concatenate([np.arange(S) - first_of_block, np.full(pad_rows.shape[0], -1)])
    order = np.argsort(seg_start, kind="stable")
    cu = np.append(seg_start[order], B * L)
    seg_len = np.diff(cu)
    # position_ids: each position less its segment's start; doc_ids: its segment's, repeated
    # (``np.repeat`` writes ~0.5 ns a position where a running sum of the jumps at segment
    # starts, ``np.cumsum`` over int64, costs ~3 ns: the two were most of this packer's time).
    if B * L:
        np.subtract(_ramp(B * L), np.repeat(cu[:-1], seg_len), out=pos_out)
        doc_out[:] = np.repeat(seg_doc[order].astype(np.int64, copy=False), seg_len)

    continues = np.zeros(B, dtype=bool)
    continues[spans.block[new_block]] = spans.tok_start[new_block] > 0
    provenance = np.stack(
        [spans.block, spans.pos, spans.row_id, spans.tok_start, spans.tok_end], axis=1
    ).astype(np.int64, copy=False)
    real, eos = int(ntok.sum()), int(eos_at.shape[0])
    # Unsigned token ids cannot equal IGNORE_INDEX: then the labels that train are known
    # from the stretches; signed ones (a label may be an id of -100) are counted on the labels.
    unsigned = all(a.dtype.kind == "u" or not a.size for a in (source.values, source.extra))
    if (
        windowed
        or masked is not None
        or not unsigned
        or eos_id == IGNORE_INDEX
        or (ntok[cut] == 0).any()
    ):
        # counted on the final labels (windows, a loss mask, signed ids, an empty cut stretch)
        trained = np.count_nonzero(lab_out.reshape(B, L) != IGNORE_INDEX, axis=1)
    else:
        # from the stretches, without a pass over the labels: each token's position trains,
        # but the last of a cut stretch whose target is given up, and the masked ones
        kept = ntok if lookahead else ntok - (cut & (spans.tok_end != spans.doc_len))
        trained = np.bincount(spans.block, weights=kept, minlength=B)
    return PackedArrays(
        input_ids=out[0],
        labels=out[1],
        position_ids=out[2],
        doc_ids=out[3],
        cu_seqlens=cu.astype(np.int32),
        max_seqlen=int(seg_len.max()) if seg_len.size else 0,
        continues=continues,
        spans=provenance.reshape(S, 5),
        real_tokens=real,
        eos_positions=eos,
        padding_positions=B * L - real - eos,
        # windowed: counted on the final labels; else from the counts, less the masked ones
        loss_positions=int((lab != IGNORE_INDEX).sum()) if windowed else real - lost - n_masked,
        context=context,
        context_positions=int((context[:, 1] - context[:, 0]).sum()) if windowed else 0,
        masked_positions=n_masked,
        masked_blocks=masked_blocks,
        # padding: each block past its filled prefix (the step counters' other pass, saved)
        block_counts=np.stack([L - filled, trained]).astype(np.int64, copy=False),
    )


def _pack_compiled(
    kernel: Any,
    spans: Spans,
    source: TokenSource,
    offs: np.ndarray,
    B: int,
    L: int,
    eos_id: int,
    pad_id: int,
    lookahead: bool,
    out: np.ndarray,
    masked: np.ndarray | None,
    overlap_loss: bool,
) -> PackedArrays:
    """:func:`_pack_numpy`'s output from one pass of the compiled kernel ``kernel`` (numba's
    JIT or the prebuilt module's, :func:`_kernel`; inputs checked by :func:`pack_blocks`); the
    per-stretch metadata stays numpy (O(S))."""
    S = len(spans)

    def i64(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a, dtype=np.int64)

    def flag(a: np.ndarray | None) -> np.ndarray:
        return _NO_FLAGS if a is None else np.ascontiguousarray(a, dtype=np.bool_)

    has_eos = flag(spans.has_eos)
    tok_start, tok_end, doc_len = i64(spans.tok_start), i64(spans.tok_end), i64(spans.doc_len)
    block = i64(spans.block)
    ctx_end = _NO_INTS if spans.ctx_end is None else i64(spans.ctx_end)
    cu = np.empty(S + B + 1, dtype=np.int32)
    per_block = np.empty((3, B), dtype=np.int64)  # filled, loss, dropped by the loss mask
    values, extra = source.values, source.extra
    if not extra.size and extra.dtype != values.dtype:
        extra = values[:0]  # one specialisation per token type (the prebuilt one's signature)
    n_cu = kernel(
        values,
        extra,
        i64(source.at),
        i64(offs),
        flag(masked),
        masked is not None,
        block,
        i64(spans.pos),
        tok_start,
        tok_end,
        doc_len,
        has_eos,
        ctx_end,
        spans.ctx_end is not None,
        flag(spans.ends_window),
        spans.ends_window is not None,
        lookahead,
        bool(overlap_loss),
        int(eos_id),
        int(pad_id),
        L,
        out,
        cu,
        per_block[0],
        per_block[1],
        per_block[2],
    )
    cu = cu[:n_cu]
    filled, loss, dropped = per_block
    continues = np.zeros(B, dtype=bool)
    if S:
        new_block = np.ones(S, dtype=bool)
        new_block[1:] = block[1:] != block[:-1]
        continues[spans.block[new_block]] = spans.tok_start[new_block] > 0
    provenance = np.stack(
        [spans.block, spans.pos, spans.row_id, spans.tok_start, spans.tok_end], axis=1
    )
    ntok = tok_end - tok_start
    real, eos = int(ntok.sum()), int(np.count_nonzero(has_eos))
    n_masked = int(dropped.sum()) if masked is not None else 0
    windowed = spans.ctx_end is not None or spans.ends_window is not None
    context = None
    if spans.ctx_end is not None:
        ctx_hi = np.clip(ctx_end, tok_start, tok_end)
        context = np.stack([tok_start, ctx_hi], axis=1).astype(np.int64).reshape(S, 2)
    elif windowed:
        context = np.stack([tok_start, tok_start], axis=1).astype(np.int64).reshape(S, 2)
    if windowed:
        loss_positions = int(loss.sum())
    else:
        lost = 0 if lookahead else int(np.count_nonzero(~has_eos & (tok_end != doc_len)))
        loss_positions = real - lost - n_masked
    seg_len = np.diff(cu)
    return PackedArrays(
        input_ids=out[0],
        labels=out[1],
        position_ids=out[2],
        doc_ids=out[3],
        cu_seqlens=cu,
        max_seqlen=int(seg_len.max()) if seg_len.size else 0,
        continues=continues,
        spans=provenance.astype(np.int64, copy=False).reshape(S, 5),
        real_tokens=real,
        eos_positions=eos,
        padding_positions=B * L - real - eos,
        loss_positions=loss_positions,
        context=context,
        context_positions=int((context[:, 1] - context[:, 0]).sum()) if windowed else 0,
        masked_positions=n_masked,
        masked_blocks=dropped if masked is not None else None,
        block_counts=np.stack([L - filled, loss]),
    )


_NO_FLAGS = np.zeros(0, dtype=np.bool_)
_NO_INTS = np.zeros(0, dtype=np.int64)
_KERNEL: Any = None
_KERNEL_LOCK = threading.Lock()
_PREBUILT: Any = None
"""The prebuilt kernels' module where this process packs with them (:func:`use_prebuilt`)."""


def use_prebuilt(module: Any) -> None:
    """Pack in this process with ``module``'s kernels (the packer built ahead of time,
    :mod:`~tokenloom.loader.pipeline.prebuilt`: no numba, no LLVM; its ``pack_rows_<dtype>``
    take the arguments of :func:`tokenloom.loader.plan._pack_jit.pack_rows`) instead of numba's
    JIT, and with the numpy packer for tokens of a type it has no function for: what a
    DataLoader worker does."""
    global _PREBUILT
    _PREBUILT = module


def _kernel(source: TokenSource) -> Any | None:
    """The compiled packer for ``source``'s tokens: the prebuilt module's in a process that
    uses it (:func:`use_prebuilt`), where it has one for their type and their buffers are
    contiguous (``None`` otherwise: the numpy packer then); else
    :func:`tokenloom.loader.plan._pack_jit.pack_rows`, imported on first use: numba is loaded by
    the first pack, never by ``import tokenloom`` (the first call on a machine compiles it, then
    numba's on-disk cache serves every process)."""
    global _KERNEL
    prebuilt = _PREBUILT
    if prebuilt is not None:
        values, extra = source.values, source.extra
        if not (values.flags.c_contiguous and extra.flags.c_contiguous):
            return None
        if extra.dtype != values.dtype and extra.size:
            return None  # (a TokenSource's ranges copied apart share the column's type)
        return getattr(prebuilt, f"pack_rows_{values.dtype.name}", None)
    if _KERNEL is None:
        with _KERNEL_LOCK:
            if _KERNEL is None:
                from tokenloom.loader.plan._pack_jit import pack_rows

                _KERNEL = pack_rows
    return _KERNEL


def naive_pack(
    rows: Mapping[int, Sequence[int]],
    blocks: Sequence[int],
    *,
    seed: int,
    epoch: int,
    seq_len: int,
    eos_id: int,
    pad_id: int,
    lookahead: bool,
) -> PackedArrays:
    """Slow reference for the whole pipeline plan → spans → pack: walks the epoch's full stream.

    Args:
        rows: Every selected row: ``row id -> token ids`` (empty lists allowed).
        blocks: Block indices of the batch, ``-1`` for a padding block.
        seed: The job's seed.
        epoch: The epoch number.
        seq_len: Positions per block.
        eos_id: Id written after each document.
        pad_id: Id written on padding.
        lookahead: As for :func:`pack_blocks`.

    Returns:
        The same :class:`PackedArrays` :func:`pack_blocks` must produce.
    """
    ids = [i for i in sorted(rows) if len(rows[i]) > 0]
    stream: list[tuple[int, int, int, int, int]] = []  # (id, doc, row id, token index, doc len)
    for k, p in enumerate(epoch_permutation(len(ids), seed=seed, epoch=epoch)):
        rid, toks = ids[p], [int(x) for x in rows[ids[p]]]
        stream += [(x, k, rid, t, len(toks)) for t, x in enumerate(toks)]
        stream.append((eos_id, k, rid, len(toks), len(toks)))
    B, L = len(blocks), seq_len
    inp, lab = np.full((B, L), pad_id), np.full((B, L), IGNORE_INDEX)
    posn, seg_ids = np.zeros((B, L), dtype=np.int64), np.full((B, L), -1)
    cont, cu, spans, eos = np.zeros(B, dtype=bool), [], [], 0
    for i, b in enumerate(blocks):
        cur, seg, j0 = None, -1, 0  # current doc (or "pad"), segment index, segment start
        for j in range(L):
            p = b * L + j
            here = "pad" if b < 0 or p >= len(stream) else stream[p][1]
            if here != cur:
                cur, j0 = here, j
                cu.append(i * L + j)
                if here != "pad":
                    seg += 1
                    spans.append([i, j, stream[p][2], stream[p][3], stream[p][3]])
                    cont[i] |= j == 0 and stream[p][3] > 0
            posn[i, j] = j - j0
            if here == "pad":
                continue
            x, _, _, t, n = stream[p]
            inp[i, j], seg_ids[i, j] = x, seg
            eos += t == n
            if t < n:
                spans[-1][4] = t + 1
                if t + 1 == n:
                    lab[i, j] = eos_id
                elif j + 1 < L or lookahead:
                    lab[i, j] = stream[p + 1][0]
    cu.append(B * L)
    seg_len = np.diff(cu)
    real = sum(s[4] - s[3] for s in spans)
    return PackedArrays(
        input_ids=inp.astype(np.int64),
        labels=lab.astype(np.int64),
        position_ids=posn,
        doc_ids=seg_ids.astype(np.int64),
        cu_seqlens=np.asarray(cu, dtype=np.int32),
        max_seqlen=int(seg_len.max()) if seg_len.size else 0,
        continues=cont,
        spans=np.asarray(spans, dtype=np.int64).reshape(-1, 5),
        real_tokens=real,
        eos_positions=eos,
        padding_positions=B * L - int((seg_ids >= 0).sum()),
        loss_positions=int((lab != IGNORE_INDEX).sum()),
    )
