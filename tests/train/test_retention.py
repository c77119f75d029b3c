"""Which step checkpoints survive, and the one resolver of ``RUN`` / ``RUN/step-N`` (pure: no
torch, directories made by hand)."""

from __future__ import annotations

import json

import pytest

from tokenloom.train.layout import (
    CheckpointNotFoundError,
    list_steps,
    resolve_checkpoint,
)
from tokenloom.train.retention import best_step, steps_to_keep


def test_keep_last_keeps_the_most_recent_and_always_the_latest():
    assert steps_to_keep([2, 4, 6, 8], latest=8) == {8}
    assert steps_to_keep([2, 4, 6, 8], latest=8, keep_last=3) == {4, 6, 8}
    assert steps_to_keep([8], latest=8, keep_last=5) == {8}


def test_keep_every_keeps_multiples_of_the_global_step_beside_the_last_ones():
    assert steps_to_keep([2, 4, 5, 6, 8, 10], latest=10, keep_every=4, keep_last=2) == {4, 8, 10}
    assert steps_to_keep([3, 6, 7], latest=7, keep_every=3) == {3, 6, 7}


def test_keep_best_keeps_that_step_only_if_it_is_on_disk():
    assert steps_to_keep([2, 4, 6], latest=6, best=2) == {2, 6}
    assert steps_to_keep([4, 6], latest=6, best=2) == {6}


def test_steps_after_the_latest_are_never_kept():
    # a save killed after its rename but before last.json named it; the resume redoes it
    assert steps_to_keep([4, 6, 8], latest=6, keep_last=3, keep_every=2) == {4, 6}


def test_best_step_skips_step_zero_and_non_finite_losses_and_takes_the_earliest_tie():
    assert best_step([(0, 1.0), (2, 3.0), (4, 2.5), (6, 2.5), (8, float("nan"))]) == 4
    assert best_step([(0, 1.0)]) is None
    assert best_step([]) is None


def _run(tmp_path, steps, last):
    run = tmp_path / "run"
    run.mkdir()
    (run / "last.json").write_text(json.dumps({"step": last}))
    for s in steps:
        (run / f"step-{s}").mkdir()
        (run / f"step-{s}" / "record.json").write_text("{}")
    (run / ".step-9.tmp-1").mkdir()  # a temporary is never a checkpoint
    return run


def test_resolve_run_and_step(tmp_path):
    run = _run(tmp_path, [4, 8], last=8)
    assert list_steps(run) == [4, 8]
    latest = resolve_checkpoint(run)
    assert (latest.step, latest.latest, latest.path) == (8, True, str(run / "step-8"))
    kept = resolve_checkpoint(f"{run}/step-4/")
    assert (kept.step, kept.latest, kept.run) == (4, False, str(run))
    assert kept.record_path == str(run / "step-4" / "record.json")


def test_a_missing_step_lists_the_steps_kept(tmp_path):
    run = _run(tmp_path, [4, 8], last=8)
    with pytest.raises(
        CheckpointNotFoundError, match=r"no checkpoint at step 5; .* step-4, step-8"
    ):
        resolve_checkpoint(run / "step-5")
    with pytest.raises(CheckpointNotFoundError, match="is not a run directory"):
        resolve_checkpoint(tmp_path / "nothing" / "step-5")
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        resolve_checkpoint(tmp_path / "nothing")


def test_a_run_whose_named_step_is_gone_says_which_it_keeps(tmp_path):
    run = _run(tmp_path, [4], last=8)
    with pytest.raises(CheckpointNotFoundError, match="names step 8 .* step-4: pass RUN/step-N"):
        resolve_checkpoint(run)


def test_a_run_of_the_single_file_layout_resolves_to_its_last_pt(tmp_path):
    run = tmp_path / "old"
    run.mkdir()
    (run / "last.json").write_text(json.dumps({"step": 6}))
    (run / "last.pt").write_bytes(b"")
    where = resolve_checkpoint(run)
    assert where.legacy and where.state_path == str(run / "last.pt") and where.step == 6
    assert where.record_path == str(run / "last.json")


def test_a_step_spelled_with_zeros_or_a_file_inside_names_the_checkpoint(tmp_path):
    run = _run(tmp_path, [4, 8], last=8)
    for spelled in ("step-04", "step-4/record.json", "step-0004/state.pt"):
        where = resolve_checkpoint(f"{run}/{spelled}")
        assert (where.step, where.path) == (4, str(run / "step-4")), spelled
    assert resolve_checkpoint(run / "last.json").path == str(run / "step-8")
