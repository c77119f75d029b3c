"""plot_length_histogram writes a PNG; without matplotlib it names the install line."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tokenloom.errors import MissingDependencyError
from tokenloom.stats import plot_length_histogram
from tokenloom.stats.plot import log_bins

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_log_bins() -> None:
    edges = log_bins(999, per_decade=4)
    assert edges[0] == 1.0 and edges[-1] == pytest.approx(1000.0)
    assert len(edges) == 13  # 3 decades x 4 bins, plus one edge
    assert np.allclose(np.diff(np.log10(edges)), 0.25)
    assert len(log_bins(0)) == 5  # one token: 1..2 still gets bins


@pytest.mark.parametrize("with_sources", [False, True])
def test_writes_png(tmp_path: Path, with_sources: bool) -> None:
    pytest.importorskip("matplotlib")
    rng = np.random.default_rng(0)
    n = np.concatenate([rng.lognormal(5, 1.5, size=500).astype(np.int64), [0, 0]])
    sources = np.where(np.arange(n.size) % 3 == 0, "code", "wiki") if with_sources else None
    out = plot_length_histogram(n, tmp_path / "lengths.png", seq_len=1024, sources=sources)
    assert out == tmp_path / "lengths.png"
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > 5_000


def test_missing_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingDependencyError, match=r"tokenloom\[plot\]"):
        plot_length_histogram(np.array([1, 2]), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_bad_sources(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    with pytest.raises(ValueError, match="one label per document"):
        plot_length_histogram(np.array([1, 2]), tmp_path / "x.png", sources=np.array(["a"]))
