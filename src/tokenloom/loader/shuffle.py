"""The per-epoch visiting order: one uniform permutation per ``(seed, epoch)``.

Every process of a job (every rank, every DataLoader worker, a resumed run next week) must compute
the *identical* order from two integers, without talking to the others. The order is drawn from

    np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))

but not through ``Generator.permutation``: NumPy guarantees that a *bit generator's* raw stream is
stable across releases, not that ``Generator`` methods keep drawing the same values (NEP 19 allows
them to change for bug fixes and speed). So the permutation is the stable ``argsort`` of ``n`` raw
64-bit PCG64 outputs: a function of the raw stream alone, hence the same on every NumPy version.
Ties between two 64-bit keys (probability about ``n**2 / 2**65``, ~3e-8 for a million rows) are
broken by position, so the result stays deterministic even then. Cost: O(n log n), about 0.15 s
per million rows on one core.

:data:`PERMUTATION_ALGORITHM` names this recipe; it belongs in the loader's fingerprint so that a
future change of recipe is refused on resume instead of silently reading other rows.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PERMUTATION_ALGORITHM", "epoch_rng", "epoch_permutation"]

PERMUTATION_ALGORITHM = "pcg64-seedseq[seed,epoch]-rawsort-v1"
"""Identity of the recipe of :func:`epoch_permutation` (part of the plan fingerprint)."""


def _check_seed(name: str, value: object) -> int:
    # bool is an int subclass; ``seed=True`` is almost certainly a mistake.
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def epoch_rng(*, seed: int, epoch: int) -> np.random.Generator:
    """The random generator of one ``(seed, epoch)``, identical in every process.

    Args:
        seed: The job's seed, a non-negative integer.
        epoch: The epoch number, a non-negative integer.

    Returns:
        ``np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))``.

    Raises:
        ValueError: ``seed`` or ``epoch`` is not a non-negative integer.
    """
    seq = np.random.SeedSequence([_check_seed("seed", seed), _check_seed("epoch", epoch)])
    return np.random.Generator(np.random.PCG64(seq))


def epoch_permutation(n: int, *, seed: int, epoch: int) -> np.ndarray:
    """A uniform random permutation of ``range(n)`` for one ``(seed, epoch)``.

    Args:
        n: Number of items (rows) to permute, ``n >= 0``.
        seed: The job's seed, a non-negative integer.
        epoch: The epoch number, a non-negative integer.

    Returns:
        ``perm``: shape ``(n,)``, int64, each of ``0..n-1`` exactly once; ``perm[i]`` is the
        input position visited ``i``-th. Same arguments give the same array in every process and
        on every NumPy version (see the module docstring); another seed or epoch gives an
        independent one.

    Raises:
        ValueError: ``n`` is negative or ``seed``/``epoch`` are not non-negative integers.
    """
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    rng = epoch_rng(seed=seed, epoch=epoch)
    keys = rng.bit_generator.random_raw(int(n))  # (n,) uint64, the stable raw stream
    # A stable sort makes the result independent of the sort algorithm, ties included.
    return np.argsort(keys, kind="stable").astype(np.int64, copy=False)
