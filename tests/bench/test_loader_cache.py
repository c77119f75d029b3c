"""Page-cache preparation of the loader benchmark: warm reads every file, cold drops their
pages with posix_fadvise and says so when the kernel kept them."""

from __future__ import annotations

import os

import pytest

from tokenloom.bench.loader_cache import files_under, prepare_cache, resident_fraction


def test_warm_then_cold_on_a_copy(tmp_path):
    copy = tmp_path / "copy"
    (copy / "sub").mkdir(parents=True)
    (copy / "b.bin").write_bytes(os.urandom(1 << 20))
    (copy / "sub" / "a.bin").write_bytes(os.urandom(3 << 20))
    (copy / "empty").write_bytes(b"")
    assert list(files_under(str(copy))) == [
        str(copy / "b.bin"),
        str(copy / "empty"),
        str(copy / "sub" / "a.bin"),
    ]
    assert list(files_under(str(copy / "b.bin"))) == [str(copy / "b.bin")]

    warm = prepare_cache([str(copy)], "warm")
    if warm.resident is None:
        pytest.skip("mincore is not available here: residency cannot be measured")
    assert warm.mode == "warm" and warm.resident == 1.0 and warm.note == ""

    cold = prepare_cache([str(copy)], "cold")
    assert cold.mode == "cold"
    if cold.note:  # e.g. tmpfs keeps its pages: the run is reported as not cold
        assert cold.resident > 0.05 and "stayed cached" in cold.note
    else:
        assert cold.resident <= 0.05
        assert resident_fraction([str(copy / "sub")]) <= 0.05

    with pytest.raises(ValueError, match="cache mode"):
        prepare_cache([str(copy)], "hot")
