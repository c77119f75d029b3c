"""Compare `tokenloom trace` with the provenance a real run's loader emitted (its audit log)."""

from __future__ import annotations

import json
import os
from collections import defaultdict

from tokenloom.search.trace import open_run


def read_log(out: str) -> dict[tuple[int, int], list[tuple]]:
    """``(step, rank) -> provenance rows``; a step logged twice (a killed run redone after
    resume) keeps its last record, the one the checkpointed run continued from."""
    logged: dict[tuple[int, int], list[tuple]] = {}
    for name in os.listdir(out):
        if name.startswith("provenance-rank"):
            rank = int(name[len("provenance-rank") : -len(".jsonl")])
            with open(os.path.join(out, name)) as fh:
                for line in fh:
                    rec = json.loads(line)
                    logged[(rec["step"], rank)] = [tuple(r) for r in rec["spans"]]
    return logged


def assert_trace_matches_log(out: str, *, steps: int, world_at):  # noqa: ANN001, ANN201
    """Every step's trace, per rank (``world_at(step)`` ranks), equals the log, and
    row -> steps is the exact inverse. Returns the trace and the rows' sightings."""
    run = open_run(out)
    assert run.steps_done == steps
    logged = read_log(out)
    expected_rows: dict[int, list[tuple]] = defaultdict(list)
    for step in range(1, steps + 1):
        world = world_at(step)
        for rank in range(world):
            traced = run.step(step, rank=rank)
            assert [s.as_tuple() for s in traced] == logged[(step, rank)], (step, rank)
            for s in traced:
                expected_rows[s.row_id].append((step, rank, *s.as_tuple()))
        assert {s.rank for s in run.step(step)} <= set(range(world))
    for row, seen in expected_rows.items():
        got = [(s.step, s.rank, *s.as_tuple()) for s in run.row(row)]
        assert got == seen, row
    return run, expected_rows
