"""The UDF API: direct calls, outputs, fingerprints, pickling by reference, bad results."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from tests.backfill.udfs import Splitter, fails_on_13, fails_on_13_fixed, n_words
from tokenloom.backfill import UDFError, load_udf, udf


def test_function_udf_is_callable_directly():
    out = n_words({"text": ["a b c", "two  words", "one"]})
    assert out.schema.names == ["n_words"]
    assert out.column(0).to_pylist() == [3, 2, 1]


def test_class_udf_two_outputs_and_bound_arguments():
    batch = pa.table({"id": [1, 2], "text": ["Hello Big World now", "x"]})
    out = Splitter(batch)
    assert out.column("words").to_pylist() == [["Hello", "Big", "World", "now"], ["x"]]
    lower = Splitter.bind(lower=True)
    assert lower(batch).column("first_char").to_pylist() == ["h", "x"]
    assert lower.fingerprint() != Splitter.fingerprint()
    assert lower.fingerprint() == Splitter.bind(lower=True).fingerprint()
    # underscore arguments are run-time plumbing, not identity
    assert lower.bind(_cache="/tmp/x").fingerprint() == lower.fingerprint()


def test_fingerprint_changes_with_version_and_inputs():
    assert fails_on_13.fingerprint() != fails_on_13_fixed.fingerprint()
    assert n_words.fingerprint() == load_udf("tests.backfill.udfs:n_words").fingerprint()


def test_pickled_by_reference_keeps_bound_arguments():
    lower = Splitter.bind(lower=True)
    clone = pickle.loads(pickle.dumps(lower))
    assert clone.fingerprint() == lower.fingerprint() and clone.kwargs == {"lower": True}
    assert pickle.loads(pickle.dumps(n_words)) is n_words


def test_wrong_results_are_named():
    @udf(inputs=["text"], output=pa.field("x", pa.int32()), version="1")
    def short(batch):
        return pa.array([1])

    with pytest.raises(UDFError, match="returned 1 values for column 'x' from 2 input rows"):
        short({"text": ["a", "b"]})

    @udf(inputs=["text"], output=pa.field("x", pa.int32()), version="1")
    def wrong_type(batch):
        return pa.array(["a", "b"])

    with pytest.raises(UDFError, match="does not cast safely"):
        wrong_type({"text": ["a", "b"]})

    with pytest.raises(UDFError, match="needs column"):
        n_words({"body": ["a"]})
    with pytest.raises(UDFError, match="package.module:name"):
        load_udf("no_colon")


def test_renamed_udf_survives_pickling():
    renamed = n_words.with_output(pa.schema([pa.field("words_total", pa.int32())]))
    clone = pickle.loads(pickle.dumps(renamed))
    assert clone.columns == ["words_total"]
    assert clone.fingerprint() == renamed.fingerprint() != n_words.fingerprint()
