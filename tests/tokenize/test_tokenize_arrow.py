"""The Arrow side: id type selection, list building, decoding list arrays, bad input."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tokenloom.tokenize import Tokenizer, TokenizerError, id_type_for, ids_to_list_array


def test_id_type_boundary() -> None:
    assert id_type_for(1) == pa.uint16()
    assert id_type_for(50257) == pa.uint16()
    assert id_type_for(65536) == pa.uint16()  # ids 0..65535
    assert id_type_for(65537) == pa.int32()
    assert id_type_for(200_019) == pa.int32()
    with pytest.raises(ValueError, match="at least 1"):
        id_type_for(0)


def test_ids_to_list_array_matches_naive() -> None:
    chunks = [np.array([1, 2, 3], np.uint32), np.array([], np.uint32), np.array([65535], np.uint32)]
    out = ids_to_list_array(chunks, pa.uint16())
    naive = pa.array([[1, 2, 3], [], [65535]], type=pa.list_(pa.uint16()))
    assert out.equals(naive)
    wide = ids_to_list_array([np.array([70_000, 5], np.uint32)], pa.int32())
    assert wide.equals(pa.array([[70_000, 5]], type=pa.list_(pa.int32())))


def test_ids_to_list_array_nulls_and_empty() -> None:
    out = ids_to_list_array(
        [np.array([7], np.uint32), np.zeros(0, np.uint32)],
        pa.uint16(),
        nulls=np.array([False, True]),
    )
    assert out.to_pylist() == [[7], None]
    assert ids_to_list_array([], pa.uint16()).to_pylist() == []


def test_decode_batch_of_sliced_array_with_nulls(gpt2: Tokenizer) -> None:
    texts = ["one", None, "two three", "", "four"]
    out = gpt2.encode_batch(texts)
    assert gpt2.decode_batch(out) == texts
    assert gpt2.decode_batch(out.slice(1, 3)) == texts[1:4]
    assert gpt2.decode_batch(pa.chunked_array([out.slice(0, 2), out.slice(2)])) == texts
    assert gpt2.decode_batch([[505], [11545]]) == ["one", "two"]
    assert gpt2.decode(out[2]) == "two three"
    assert gpt2.decode(np.array([505], np.uint16)) == "one"


def test_encode_one(gpt2: Tokenizer) -> None:
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.encode("") == []


def test_non_text_items_are_refused(gpt2: Tokenizer) -> None:
    with pytest.raises(TokenizerError, match="item 1 is bytes"):
        gpt2.encode_batch(["ok", b"raw"])  # type: ignore[list-item]
    with pytest.raises(TokenizerError, match="Arrow type int64"):
        gpt2.encode_batch(pa.array([1, 2]))
