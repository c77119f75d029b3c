"""length_stats on hand-computable arrays, and against a naive loop."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenloom.stats import LengthStats, Percentiles, SourceLengths, length_stats

N = np.array([10, 20, 30, 40, 100])
SOURCES = np.array(["b", "a", "b", "a", "b"])


def test_hand_computed_figures() -> None:
    s = length_stats(N, seq_len=32, sources=SOURCES)
    assert (s.documents, s.tokens, s.mean, s.seq_len) == (5, 200, 40.0, 32)
    # sorted 10 20 30 40 100, linear interpolation: p5 at rank 0.2, p95 at 3.8, p99 at 3.96
    assert s.percentiles == Percentiles(
        p5=12.0,
        p25=20.0,
        p50=30.0,
        p75=40.0,
        p95=pytest.approx(88.0),
        p99=pytest.approx(97.6),
        max=100,
    )
    # pad/truncate: min(n, 32) = 10 20 30 32 32
    assert (s.truncated_docs, s.kept_tokens, s.padded_positions) == (2, 124, 160)
    assert s.kept_share == 124 / 200
    assert s.real_position_share == 124 / 160
    assert s.padding_share == pytest.approx(36 / 160)
    # packing: 200 tokens + 5 EOS = 205 positions -> ceil(205 / 32) = 7 blocks
    assert s.packed_blocks == 7
    assert s.packed_real_share == 205 / 224
    assert s.by_source == (
        SourceLengths(source="a", docs=2, tokens=60, truncated_docs=1, kept_tokens=52),
        SourceLengths(source="b", docs=3, tokens=140, truncated_docs=1, kept_tokens=72),
    )


def test_summary_reads_like_a_training_team_would() -> None:
    s = length_stats(N, seq_len=32)
    assert s.summary() == (
        "pad/truncate to 32 keeps 62.0% of tokens (2 of 5 documents cut) and wastes 22.5% "
        "of compute on padding; packing keeps 100% of 200 tokens in 7 blocks of 32 "
        "(8.48% padding, last block only)"
    )


def test_to_json_round_trips_through_json() -> None:
    s = length_stats(N, seq_len=32, sources=SOURCES)
    obj = json.loads(json.dumps(s.to_json()))
    assert obj["kept_share"] == 0.62
    assert obj["padding_share"] == pytest.approx(0.225)
    assert obj["percentiles"]["max"] == 100
    assert obj["by_source"][0] == {
        "source": "a",
        "docs": 2,
        "tokens": 60,
        "truncated_docs": 1,
        "kept_tokens": 52,
    }
    assert obj["summary"] == s.summary()
    assert "by_source" in obj and obj["packed_blocks"] == 7


def test_no_sources_no_breakdown() -> None:
    assert length_stats(N, seq_len=32).by_source == ()


def test_everything_fits() -> None:
    s = length_stats(np.array([4, 4], dtype=np.uint16), seq_len=4)
    assert (s.kept_share, s.real_position_share, s.truncated_docs) == (1.0, 1.0, 0)
    assert s.packed_blocks == 3  # 8 tokens + 2 EOS = 10 positions


def test_empty_documents() -> None:
    s = length_stats(np.array([0, 0]), seq_len=4)
    assert (s.tokens, s.kept_share, s.real_position_share, s.packed_blocks) == (0, 1.0, 0.0, 1)


@pytest.mark.parametrize(
    ("n_tokens", "seq_len", "match"),
    [
        (np.array([], dtype=np.int64), 8, "at least one document"),
        (np.array([1, -1]), 8, "negative"),
        (np.array([1.5]), 8, "integers"),
        (np.array([[1, 2]]), 8, "1-D"),
        (np.array([1]), 0, "seq_len must be at least 1"),
    ],
)
def test_bad_input(n_tokens: np.ndarray, seq_len: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        length_stats(n_tokens, seq_len=seq_len)


def test_sources_of_another_length() -> None:
    with pytest.raises(ValueError, match="one per document"):
        length_stats(N, seq_len=8, sources=np.array(["a"]))


def _naive(n: list[int], seq_len: int) -> tuple[int, int, int]:
    """pad/truncate kept tokens and truncated docs by a loop; packing by filling blocks."""
    kept = truncated = 0
    for count in n:
        kept += min(count, seq_len)
        truncated += count > seq_len
    blocks, room = 0, 0
    for count in n:
        need = count + 1  # the document and its EOS
        while need:
            if room == 0:
                blocks, room = blocks + 1, seq_len
            take = min(need, room)
            need, room = need - take, room - take
    return kept, truncated, blocks


@settings(derandomize=True, max_examples=200)
@given(
    st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=40),
    st.integers(min_value=1, max_value=128),
)
def test_matches_naive_loop(n: list[int], seq_len: int) -> None:
    s: LengthStats = length_stats(np.array(n), seq_len=seq_len)
    assert (s.kept_tokens, s.truncated_docs, s.packed_blocks) == _naive(n, seq_len)
    assert 0.0 <= s.real_position_share <= 1.0
    assert 0.0 < s.packed_real_share <= 1.0
    assert math.isclose(s.mean, sum(n) / len(n))


def test_an_arrow_source_column_gives_the_same_breakdown() -> None:
    """The CLI passes the Arrow column (no Python string per document): same figures as the
    numpy labels, whatever its chunks, and a null label reads as the numpy path reads None."""
    import pyarrow as pa

    from tokenloom.stats import source_codes

    labels = ["b", "a", None, "a", "ü"]
    col = pa.chunked_array([pa.array(labels[:2]), pa.array([], pa.string()), pa.array(labels[2:])])
    expected = length_stats(N, seq_len=32, sources=np.array(labels, dtype=object))
    assert length_stats(N, seq_len=32, sources=col) == expected
    assert length_stats(N, seq_len=32, sources=col.combine_chunks()) == expected
    names, codes = source_codes(col, 5)
    assert names.tolist() == ["None", "a", "b", "ü"] and codes.tolist() == [2, 1, 0, 1, 3]
    with pytest.raises(ValueError, match="one per document"):
        length_stats(N, seq_len=8, sources=col[:3])
