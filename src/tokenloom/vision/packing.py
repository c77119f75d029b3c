"""Image+text samples packed into fixed token budgets: the plan (pure) and the block (numpy).

A sample is ``[image tokens][prompt][response][EOS]``; its length is known before anything is
decoded (image tokens from the stored width and height, text from the stored strings). Three
policies turn a sequence of samples (the epoch's shuffled order) into blocks of at most
``budget`` tokens and at most ``image_cap`` images:

- ``pad_to_longest``: ``per_batch`` samples per batch, one per row, each row padded to the
  batch's longest sample (what a plain collate does);
- ``greedy``: samples in order into the current block until the next one does not fit;
- ``knapsack``: each block takes, from the next ``window`` waiting samples, the subset with the
  most tokens that fits the budget and the image cap (a 0/1 knapsack by dynamic programming,
  the oldest waiting sample always included so none waits forever) — seed 004's packer.

The plan is a pure function of (lengths, images, budget, cap, policy, window): a resumed run
recomputes it and continues at its block cursor. :func:`plan_padding` reports the waste of each.
Attention stays inside a sample and the loss falls on response tokens (and the EOS) only:
:func:`pack_block` builds ``labels``, ``doc_ids`` and ``position_ids`` to say so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "POLICIES",
    "PACK_ALGORITHM",
    "IGNORE",
    "PackPlan",
    "CompactBlocks",
    "pack_compact",
    "plan_blocks",
    "naive_greedy",
    "plan_padding",
    "pack_block",
    "Block",
]

POLICIES = ("pad_to_longest", "greedy", "knapsack")
PACK_ALGORITHM = "vision-pack-v1"
"""Identity of these packers (part of a fingerprint)."""
IGNORE = -100
"""Label of positions without a loss."""
COMPILED_FROM = 16_384
"""Fitting samples from which :func:`pack_compact` runs its knapsack compiled (the reference
takes ~1.5 s CPU there)."""


@dataclass(frozen=True, kw_only=True, eq=False)
class PackPlan:
    """Blocks of sample indices, and what they hold."""

    blocks: list[np.ndarray]
    """Per block, the indices (into the input order) of its samples, in block order."""
    width: np.ndarray
    """``(n_blocks,)`` positions each block occupies (``budget``, or the batch's longest row
    times its rows for ``pad_to_longest``)."""
    dropped: np.ndarray
    """Indices of samples longer than the budget (never packed; counted)."""
    lengths: np.ndarray
    image_tokens: np.ndarray

    @property
    def used(self) -> int:
        """Positions holding a token."""
        return int(sum(int(self.lengths[b].sum()) for b in self.blocks))

    @property
    def positions(self) -> int:
        """Positions allocated (tokens + padding)."""
        return int(self.width.sum())

    def ledger(self) -> dict[str, float]:
        """Image tokens, text tokens, padding and its share, blocks, samples, dropped."""
        packed = np.concatenate(self.blocks) if self.blocks else np.zeros(0, np.int64)
        img = int(self.image_tokens[packed].sum())
        used = self.used
        return {
            "blocks": len(self.blocks),
            "samples": len(packed),
            "image_tokens": img,
            "text_tokens": used - img,
            "padding": self.positions - used,
            "padding_share": (self.positions - used) / max(self.positions, 1),
            "dropped_samples": len(self.dropped),
        }


def _check(lengths: np.ndarray, images: np.ndarray, budget: int, image_cap: int) -> None:
    if budget < 1 or image_cap < 1:
        raise ValueError(f"budget and image_cap must be >= 1, got {budget}, {image_cap}")
    if lengths.shape != images.shape or (lengths < 1).any() or (images < 0).any():
        raise ValueError("lengths (>= 1) and images (>= 0) must be aligned 1-d arrays")


def naive_greedy(lengths: Sequence[int], images: Sequence[int], budget: int, cap: int) -> list:
    """Reference greedy packer, one sample at a time (the fast path must agree)."""
    blocks, cur, used, imgs = [], [], 0, 0
    for i, (n, k) in enumerate(zip(lengths, images, strict=True)):
        if n > budget:
            continue
        if cur and (used + n > budget or imgs + k > cap):
            blocks.append(cur)
            cur, used, imgs = [], 0, 0
        cur.append(i)
        used += n
        imgs += k
    if cur:
        blocks.append(cur)
    return blocks


def _knapsack(lengths: np.ndarray, images: np.ndarray, budget: int, cap: int) -> list[int]:
    """Indices (into the window) of the fullest subset with sum(lengths) <= budget and
    sum(images) <= cap, item 0 always in. DP over (capacity, images): O(window * budget * cap)."""
    first_len, first_img = int(lengths[0]), int(images[0])
    cap_left, budget_left = cap - first_img, budget - first_len
    # reach[k, c]: a subset of the items seen uses exactly c tokens and k images
    reach = np.zeros((cap_left + 1, budget_left + 1), dtype=bool)
    reach[0, 0] = True
    took = []  # per item, the (k, c) states it newly reached
    for n, k in zip(lengths[1:].tolist(), images[1:].tolist(), strict=True):
        new = np.zeros_like(reach)
        if n <= budget_left and k <= cap_left:
            new[k:, n:] = reach[: cap_left + 1 - k, : budget_left + 1 - n] & ~reach[k:, n:]
        reach |= new
        took.append(new)
    ks, cs = np.nonzero(reach)
    best = int(np.argmax(cs))  # most tokens; ties: fewest images (np.nonzero is k-major)
    k, c = int(ks[best]), int(cs[best])
    chosen = []
    for j in range(len(took) - 1, -1, -1):  # walk back: the item that first reached (k, c)
        if took[j][k, c]:
            chosen.append(j + 1)
            k -= int(images[j + 1])
            c -= int(lengths[j + 1])
    assert k == 0 and c == 0, "knapsack walk-back must end at the empty set"
    return [0, *sorted(chosen)]


@dataclass(frozen=True, kw_only=True, eq=False)
class CompactBlocks:
    """Blocks as two flat arrays (what a loader keeps at millions of samples: no Python object
    per block): block ``b`` holds ``members[starts[b] : starts[b + 1]]``."""

    members: np.ndarray
    """Indices (into the input order) of the packed samples, block after block (uint32 below
    ``2**32`` samples)."""
    starts: np.ndarray
    """``(n_blocks + 1,)`` offsets into :attr:`members` (uint32 below ``2**32`` samples)."""
    dropped: int
    """Samples longer than the budget (or with more images than the cap): never packed."""

    def __len__(self) -> int:
        return len(self.starts) - 1

    def block(self, b: int) -> np.ndarray:
        """The samples of block ``b`` (int64)."""
        return self.members[int(self.starts[b]) : int(self.starts[b + 1])].astype(np.int64)

    @property
    def nbytes(self) -> int:
        return int(self.members.nbytes + self.starts.nbytes)


def _narrow(values: Sequence[int], n: int) -> np.ndarray:
    dtype = np.uint32 if n < 2**32 else np.int64
    return np.asarray(values, dtype=dtype)


def pack_compact(
    lengths: np.ndarray,
    images: np.ndarray,
    *,
    budget: int,
    image_cap: int = 4,
    policy: str = "knapsack",
    window: int = 32,
    compiled: bool | None = None,
) -> CompactBlocks:
    """Pack samples (in the given order) into blocks of at most ``budget`` tokens and
    ``image_cap`` images, as :class:`CompactBlocks` (``greedy`` or ``knapsack``; the same blocks
    as :func:`plan_blocks`, in ``O(n * window)``: the knapsack keeps only its window of waiting
    samples). The knapsack runs compiled
    (:func:`tokenloom.vision._knapsack_jit.knapsack_blocks`, ~1-4 µs a block) from
    :data:`COMPILED_FROM` samples on, or when ``compiled=True``; below (or ``compiled=False``)
    it runs the reference, a dynamic programme per block in numpy (~100-300 µs a block), which
    the compiled one equals block for block. Small plans (a demo's, a test's) thus keep numba's
    import (~0.5 s, ~60 MiB a process) out of the process."""
    n_arr = np.asarray(lengths)
    k_arr = np.asarray(images)
    if n_arr.shape != k_arr.shape or n_arr.ndim != 1:
        raise ValueError("lengths and images must be aligned 1-d arrays")
    if budget < 1 or image_cap < 1:
        raise ValueError(f"budget and image_cap must be >= 1, got {budget}, {image_cap}")
    if policy not in ("greedy", "knapsack"):
        raise ValueError(f"policy must be greedy or knapsack, got {policy!r}")
    fits = (n_arr <= budget) & (k_arr <= image_cap)
    order = np.flatnonzero(fits)
    members = np.empty(len(order), dtype=np.uint32 if len(n_arr) < 2**32 else np.int64)
    sizes: list[int] = []
    at = 0
    if policy == "greedy":
        used = imgs = count = 0
        members[:] = order  # greedy keeps the order: only the cuts are computed
        at = len(order)
        for lo in range(0, len(order), 65536):  # Python ints for one chunk at a time
            part = order[lo : lo + 65536]
            for n, k in zip(n_arr[part].tolist(), k_arr[part].tolist(), strict=True):
                if count and (used + n > budget or imgs + k > image_cap):
                    sizes.append(count)
                    used = imgs = count = 0
                used, imgs, count = used + n, imgs + k, count + 1
        if count:
            sizes.append(count)
    elif compiled or (compiled is None and len(order) >= COMPILED_FROM):
        from tokenloom.vision._knapsack_jit import knapsack_blocks

        ends = np.zeros(len(order) + 1, dtype=members.dtype)  # at most a block per sample
        n_blocks = knapsack_blocks(order, n_arr, k_arr, budget, image_cap, window, members, ends)
        starts = ends[: n_blocks + 1].copy()
        return CompactBlocks(members=members, starts=starts, dropped=len(n_arr) - len(order))
    else:
        nxt, total = 0, len(order)
        win: list[int] = []
        while nxt < total or win:
            while len(win) < window and nxt < total:  # the first `window` waiting samples
                win.append(int(order[nxt]))
                nxt += 1
            w = np.asarray(win, dtype=np.int64)
            wl, wk = n_arr[w].astype(np.int64), k_arr[w].astype(np.int64)
            if wl.sum() <= budget and wk.sum() <= image_cap:
                pick = list(range(len(win)))  # all fit: the fullest subset is all of them
            else:
                pick = _knapsack(wl, wk, budget, image_cap)
            members[at : at + len(pick)] = w[pick]
            at += len(pick)
            sizes.append(len(pick))
            taken = set(pick)
            win = [x for j, x in enumerate(win) if j not in taken]
    starts = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=starts[1:])
    return CompactBlocks(
        members=members, starts=_narrow(starts, len(n_arr)), dropped=int(len(n_arr) - len(order))
    )


def plan_blocks(
    lengths: Sequence[int],
    images: Sequence[int],
    *,
    budget: int,
    image_cap: int = 4,
    policy: str = "knapsack",
    window: int = 32,
    per_batch: int = 8,
) -> PackPlan:
    """Pack samples (in the given order) into blocks (see the module docstring).

    Args:
        lengths: ``(n,)`` tokens of each sample (image + prompt + response + EOS).
        images: ``(n,)`` images in each sample (0 or 1 here).
        budget: Positions per block.
        image_cap: Most images per block.
        policy: One of :data:`POLICIES`.
        window: Waiting samples the knapsack chooses from.
        per_batch: Rows per batch for ``pad_to_longest``.

    Returns:
        A :class:`PackPlan`. Samples longer than ``budget`` are in ``dropped``.
    """
    n_arr = np.asarray(lengths, dtype=np.int64)
    k_arr = np.asarray(images, dtype=np.int64)
    _check(n_arr, k_arr, budget, image_cap)
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    fits = (n_arr <= budget) & (k_arr <= image_cap)
    dropped = np.flatnonzero(~fits)
    order = np.flatnonzero(fits)
    blocks: list[np.ndarray] = []
    widths: list[int] = []
    if policy == "pad_to_longest":
        for lo in range(0, len(order), per_batch):
            part = order[lo : lo + per_batch]
            blocks.append(part)
            widths.append(int(n_arr[part].max()) * len(part))
    else:
        packed = pack_compact(
            n_arr, k_arr, budget=budget, image_cap=image_cap, policy=policy, window=window
        )
        blocks = [packed.block(b) for b in range(len(packed))]
        widths = [budget] * len(blocks)
    return PackPlan(
        blocks=blocks,
        width=np.asarray(widths, dtype=np.int64),
        dropped=dropped,
        lengths=n_arr,
        image_tokens=np.zeros_like(n_arr),
    )


def plan_padding(
    lengths: Sequence[int],
    image_tokens: Sequence[int],
    *,
    budget: int,
    image_cap: int = 4,
    window: int = 32,
    per_batch: int = 8,
) -> dict[str, dict[str, float]]:
    """The ledger of every policy on the same samples (image tokens, text, padding, share)."""
    img = np.asarray(image_tokens, dtype=np.int64)
    out = {}
    for policy in POLICIES:
        plan = plan_blocks(
            lengths,
            (img > 0).astype(np.int64),
            budget=budget,
            image_cap=image_cap,
            policy=policy,
            window=window,
            per_batch=per_batch,
        )
        plan = PackPlan(
            blocks=plan.blocks,
            width=plan.width,
            dropped=plan.dropped,
            lengths=plan.lengths,
            image_tokens=img,
        )
        out[policy] = plan.ledger()
    return out


@dataclass(frozen=True, kw_only=True, eq=False)
class Block:
    """One packed block, ready for a model (numpy; ``T`` = budget)."""

    input_ids: np.ndarray
    """``(T,)`` int64 text ids; ``image_id`` at image positions, ``pad_id`` on padding."""
    image_mask: np.ndarray
    """``(T,)`` bool: positions that take a patch embedding instead of a token embedding."""
    patches: np.ndarray
    """``(image positions, patch_dim)`` float32, in position order."""
    labels: np.ndarray
    """``(T,)`` next-token targets on positions whose next token is a response token or the
    sample's EOS; :data:`IGNORE` elsewhere (prompt, image, padding, across samples)."""
    doc_ids: np.ndarray
    """``(T,)`` sample index in the block, ``-1`` on padding (attention stays within one)."""
    position_ids: np.ndarray
    """``(T,)`` restarting at 0 at each sample."""


def pack_block(
    samples: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    *,
    budget: int,
    eos_id: int,
    pad_id: int,
    image_id: int,
    patch_dim: int,
) -> Block:
    """Lay out ``(patches (n_i, D), prompt ids, response ids)`` samples in one block.

    Raises:
        ValueError: The samples do not fit ``budget``.
    """
    T = budget
    ids = np.full(T, pad_id, dtype=np.int64)
    image_mask = np.zeros(T, dtype=bool)
    labels = np.full(T, IGNORE, dtype=np.int64)
    doc = np.full(T, -1, dtype=np.int64)
    pos = np.zeros(T, dtype=np.int64)
    patches = []
    at = 0
    for d, (pt, prompt, response) in enumerate(samples):
        n_img, n_p, n_r = len(pt), len(prompt), len(response)
        length = n_img + n_p + n_r + 1
        if at + length > T:
            raise ValueError(f"samples need {at + length} positions, the block has {T}")
        seq = np.concatenate([np.full(n_img, image_id), prompt, response, [eos_id]]).astype(
            np.int64
        )
        ids[at : at + length] = seq
        image_mask[at : at + n_img] = True
        doc[at : at + length] = d
        pos[at : at + length] = np.arange(length)
        # position t predicts t+1: a loss where t+1 is a response token or the EOS
        first_target = at + n_img + n_p  # the first response token's position
        lo = max(first_target - 1, at)
        labels[lo : at + length - 1] = ids[lo + 1 : at + length]
        if n_img:
            patches.append(np.asarray(pt, dtype=np.float32).reshape(n_img, patch_dim))
        at += length
    return Block(
        input_ids=ids,
        image_mask=image_mask,
        patches=np.concatenate(patches) if patches else np.zeros((0, patch_dim), np.float32),
        labels=labels,
        doc_ids=doc,
        position_ids=pos,
    )
