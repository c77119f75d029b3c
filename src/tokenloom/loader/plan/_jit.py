"""How tokenloom's compiled kernels are compiled (numba): imported only by the kernel modules
(``_pack_jit``, ``_bestfit_jit``, :mod:`tokenloom.vision._knapsack_jit`), each imported on its
first use, never by ``import tokenloom``."""

from __future__ import annotations

import warnings

from numba import njit
from numba.core.errors import NumbaWarning

__all__ = ["jit"]


def jit(fn):  # type: ignore[no-untyped-def]
    """``njit(cache=True, nogil=True)``; without an on-disk cache where no cache directory is
    writable (numba refuses ``cache=True`` then): the first call of a process compiles."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NumbaWarning)
            return njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return njit(cache=False, nogil=True)(fn)
