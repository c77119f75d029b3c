"""Resume state: round trip, version check, fingerprint, and errors that name the changed input."""

from __future__ import annotations

import json

import pytest

from tokenloom.errors import TokenloomError
from tokenloom.loader import (
    PERMUTATION_ALGORITHM,
    LoaderState,
    LoaderStateError,
    ResumeMismatchError,
    check_fingerprint,
    plan_fingerprint,
)

INPUTS = {
    "table_version": 12,
    "filter": "quality > 0.5 AND NOT is_dup",
    "token_column": "input_ids",
    "tokenizer": {"name": "gpt2", "sha256": "abc123"},
    "seq_len": 1024,
    "seed": 0,
    "global_batch": 64,
    "eos_id": 50256,
    "pad_id": 50256,
    "lookahead": True,
    "drop_last": False,
    "permutation": PERMUTATION_ALGORITHM,
}


def test_fingerprint_is_canonical_and_sensitive() -> None:
    fp = plan_fingerprint(**INPUTS)
    assert len(fp) == 64 and fp == plan_fingerprint(**dict(reversed(list(INPUTS.items()))))
    # Pinned: sha256 of the canonical JSON '{"a":1,"b":[1,2]}' (sorted keys, no spaces).
    expected = "8baa73198470c7bb4c3ce142a8fd651affc0310d878bb9bd159e37a573fb4874"
    assert plan_fingerprint(b=[1, 2], a=1) == expected
    for key in INPUTS:
        changed = {**INPUTS, key: "something else"}
        assert plan_fingerprint(**changed) != fp, key
    with pytest.raises(LoaderStateError, match="must be JSON values"):
        plan_fingerprint(x=object())
    with pytest.raises(LoaderStateError, match="must be JSON values"):
        plan_fingerprint(x=float("nan"))


def test_the_table_version_message() -> None:
    with pytest.raises(ResumeMismatchError) as info:
        check_fingerprint(INPUTS, {**INPUTS, "table_version": 14})
    assert str(info.value) == (
        "checkpoint was taken on table version 12 but the loader reads version 14; "
        "pass `version=12` to resume exactly, or `allow_data_change=True`"
    )
    assert info.value.changes == {"table_version": (12, 14)}
    assert isinstance(info.value, TokenloomError)


def test_each_changed_input_is_named() -> None:
    current = {**INPUTS, "filter": "quality > 0.7", "seq_len": 2048}
    with pytest.raises(ResumeMismatchError) as info:
        check_fingerprint(INPUTS, current)
    lines = str(info.value).splitlines()
    assert lines == [
        "checkpoint was taken with filter 'quality > 0.5 AND NOT is_dup' but the loader uses "
        "'quality > 0.7'; pass `filter='quality > 0.5 AND NOT is_dup'` to resume exactly, "
        "or `allow_data_change=True`",
        "checkpoint was taken with seq_len 1024 but the loader uses 2048; pass `seq_len=1024` "
        "to resume exactly (a different seq_len makes a different stream, so the cursor is void)",
    ]
    assert set(info.value.changes) == {"filter", "seq_len"}


def test_allow_data_change_covers_data_inputs_only() -> None:
    data_change = {**INPUTS, "table_version": 14, "filter": "true", "tokenizer": {"name": "x"}}
    check_fingerprint(INPUTS, data_change, allow_data_change=True)
    with pytest.raises(ResumeMismatchError, match="seed"):
        check_fingerprint(INPUTS, {**data_change, "seed": 1}, allow_data_change=True)


def test_missing_and_added_inputs() -> None:
    less = {k: v for k, v in INPUTS.items() if k != "seed"}
    with pytest.raises(ResumeMismatchError, match="the loader does not set seed; pass `seed=0`"):
        check_fingerprint(INPUTS, less)
    with pytest.raises(ResumeMismatchError, match="the checkpoint has no seed"):
        check_fingerprint(less, INPUTS)
    check_fingerprint(INPUTS, dict(INPUTS))  # identical: no error


def test_state_round_trip_through_json() -> None:
    state = LoaderState.create(epoch=2, step=317, inputs=INPUTS)
    assert state.fingerprint == plan_fingerprint(**INPUTS)
    back = LoaderState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert back == state and back.version == 1
    back.check(dict(INPUTS))
    with pytest.raises(ResumeMismatchError, match="table version 12 but the loader reads"):
        back.check({**INPUTS, "table_version": 13})
    back.check({**INPUTS, "table_version": 13}, allow_data_change=True)


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"version": 2}, "has version 2 but this tokenloom reads version 1"),
        ({"version": None}, "has version None"),
        ({"step": "3"}, "field 'step' must be int"),
        ({"epoch": True}, "field 'epoch' must be int"),
        ({"step": -1}, "must be >= 0"),
        ({"inputs": {**INPUTS, "seed": 5}}, "do not match its fingerprint"),
    ],
)
def test_from_dict_rejects_bad_states(patch: dict, match: str) -> None:
    data = {**LoaderState.create(epoch=0, step=1, inputs=INPUTS).to_dict(), **patch}
    with pytest.raises(LoaderStateError, match=match):
        LoaderState.from_dict(data)


def test_a_new_version_is_named_first_and_is_not_called_a_rebuilt_table() -> None:
    """Another version has other data files, so its identity differs too: that is no rebuild."""
    saved = {**INPUTS, "table_identity": "files:aaaa"}
    current = {**INPUTS, "table_version": 14, "table_identity": "files:bbbb", "seed": 3}
    with pytest.raises(ResumeMismatchError) as info:
        check_fingerprint(saved, current)
    lines = str(info.value).splitlines()
    assert lines[0].startswith("checkpoint was taken on table version 12 but the loader reads")
    assert len(lines) == 2 and lines[1].startswith("checkpoint was taken with seed 0")
    assert "built again" not in str(info.value)
    assert info.value.changes["table_identity"] == ("files:aaaa", "files:bbbb")
    same_version = {**saved, "table_identity": "files:bbbb", "filter": "true"}
    with pytest.raises(ResumeMismatchError) as info:
        check_fingerprint(saved, same_version)
    lines = str(info.value).splitlines()
    assert "deleted and built again" in lines[0] and lines[1].startswith(
        "checkpoint was taken with filter"
    )
