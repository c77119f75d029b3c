"""Checks 1 and 2: the blocks decode back to the source text; the stored ids are the tokenizer's.

**text_reconstruction.** Only the batch is used: its provenance rows ``(block, pos, row id,
tok_start, tok_end)``, its ``context`` ranges (windows of long documents) and the ids of
``input_ids`` at ``[pos, pos + tok_end - tok_start)``.

* *Fixed documents* (every block of the epoch holding them was read): the stretches' new
  (non-context) token ranges must tile ``[0, n)`` with no gap and no repeat, the context tokens
  must equal the tokens they repeat, and the tiled ids must decode to the row's ``text`` exactly.
* *Sampled blocks*: each stretch must decode to the same text as
  ``decode(fresh[tok_start:tok_end])`` of a fresh tokenization of the row's text, with equal ids.

**token_ids.** For every row the sample holds, the stored ids equal
``load_tokenizer(identity["name"]).encode(text)``, the stored count equals their length, and the
identity's ``vocab_hash`` equals the loaded tokenizer's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from tokenloom.verify.report import CheckResult
from tokenloom.verify.sample import Sample, StepBatch

__all__ = ["Stretch", "stretches", "visits", "check_text", "check_token_ids"]


@dataclass(frozen=True, slots=True)
class Stretch:
    """One provenance row of a batch, with the ids it put in ``input_ids``."""

    step: int
    block: int
    pos: int
    row: int
    start: int
    end: int
    ctx_end: int
    """Tokens ``[start, ctx_end)`` are context only (``ctx_end == start``: none)."""
    ids: np.ndarray
    order: int = 0
    """The block's index in the epoch's stream (from the plan): stream order, whatever the
    block order puts it in which step."""
    visit: int = 0
    """The pass the block belongs to (:attr:`~tokenloom.verify.sample.StepBatch.visit`)."""

    def where(self) -> str:
        return f"step {self.step} block {self.block} position {self.pos}"


def stretches(batch: StepBatch) -> Iterator[Stretch]:
    """The batch's stretches, read from its provenance, context ranges and ``input_ids`` only."""
    inp = batch.arrays["input_ids"]
    ctx = batch.arrays.get("context")
    planned, passes = batch.order, batch.visit
    for i, (blk, pos, rid, s, e) in enumerate(batch.arrays["spans"].tolist()):
        c = s if ctx is None else min(max(int(ctx[i, 1]), s), e)
        ids = inp[blk, pos : pos + e - s]
        yield Stretch(batch.step, blk, pos, rid, s, e, c, ids, int(planned[blk]), int(passes[blk]))


def _first_diff(a: np.ndarray | str, b: np.ndarray | str) -> int:
    """The first index where ``a`` and ``b`` differ (the shorter length if one is a prefix)."""
    n = min(len(a), len(b))
    if isinstance(a, str) or isinstance(b, str):
        return next((i for i in range(n) if a[i] != b[i]), n)
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def visits(parts: list[Stretch]) -> list[list[Stretch]]:
    """Split a document's stretches into visits, one per pass that holds it (a mixture pool
    that repeats delivers the document once per pass; a row in two pools, once in each), in
    stream order. Within a pass the stretches need not come in token order (best-fit places a
    long document's windows in any blocks of its fit window), so the pass, not token 0, tells
    the visits apart."""
    by_pass: dict[int, list[Stretch]] = {}
    for p in sorted(parts, key=lambda p: (p.order, p.pos)):
        by_pass.setdefault(p.visit, []).append(p)
    return list(by_pass.values())


def _rebuild(rid: int, parts: list[Stretch], sample: Sample) -> str | None:
    """Why the fixed document ``rid`` does not come back exactly from its stretches (or None)."""
    row = sample.rows[rid]
    if parts[0].visit in sample.cut_passes:  # the pool's epoch stops inside this pass
        return _partial_visit(rid, parts, row.stored)
    new = sorted((p for p in parts if p.end > p.ctx_end), key=lambda p: p.ctx_end)
    tiled: list[np.ndarray] = []
    covered = 0
    for p in new:
        if p.ctx_end > covered:
            return f"row {rid}: tokens [{covered}, {p.ctx_end}) are in no block of the epoch"
        if p.ctx_end < covered:
            return (
                f"row {rid}: tokens [{p.ctx_end}, {min(covered, p.end)}) are delivered twice "
                f"(again at {p.where()})"
            )
        tiled.append(p.ids[p.ctx_end - p.start :])
        covered = p.end
    if covered < len(row.stored):
        return f"row {rid}: tokens [{covered}, {len(row.stored)}) are in no block of the epoch"
    ids = np.concatenate(tiled) if tiled else np.zeros(0, dtype=np.int64)
    for p in parts:
        if p.ctx_end > p.start and not np.array_equal(
            p.ids[: p.ctx_end - p.start], ids[p.start : p.ctx_end]
        ):
            return f"row {rid}: context tokens at {p.where()} differ from the tokens they repeat"
    text = sample.tokenizer.decode(ids)
    if text == row.text:
        return None
    at = _first_diff(text, row.text)
    why = ""
    if not np.array_equal(ids, row.stored):
        at_token = _first_diff(ids, row.stored)
        why = f"; the delivered ids differ from the stored ids at token {at_token}"
    elif sample.tokenizer.decode(row.fresh) != row.text:
        why = "; the tokenizer itself does not round-trip this text"
    elif not np.array_equal(row.stored, row.fresh):
        why = "; the stored ids differ from a fresh tokenization (see token_ids)"
    return (
        f"row {rid}: its {len(parts)} stretches decode to {len(text)} characters that differ "
        f"from the row's text ({len(row.text)}) at character {at}{why}"
    )


def _partial_visit(rid: int, parts: list[Stretch], stored: np.ndarray) -> str | None:
    """Why a visit in a pass the epoch stops inside is wrong (or None): it may miss any of the
    document's pieces, but what it delivers must be the stored ids, each token once."""
    covered = 0
    for p in sorted(parts, key=lambda p: (p.ctx_end, p.end)):
        if not np.array_equal(p.ids, stored[p.start : p.end]):
            at = p.start + _first_diff(p.ids, stored[p.start : p.end])
            return (
                f"row {rid}: the tokens delivered at {p.where()} (its pool's epoch ends inside "
                f"this pass) differ from the stored ids at token {at}"
            )
        if p.end > p.ctx_end:
            if p.ctx_end < covered:
                return (
                    f"row {rid}: tokens [{p.ctx_end}, {min(covered, p.end)}) are delivered "
                    f"twice (again at {p.where()})"
                )
            covered = p.end
    return None


def marker_problem(sample: Sample) -> str | None:
    """With a grouped spec: where a prefix token (file marker, BOS) in the batches is not the
    id the layout puts there (or None). Vectorised per batch."""
    files = sample.files
    if files is None:
        return None
    from tokenloom.loader.plan.files import MARKER, ragged

    for batch in sample.batches:
        sp = batch.arrays["spans"]
        if not len(sp):
            continue
        p = files.unfold(sp[:, 2], sp[:, 3], sp[:, 4])
        m = np.flatnonzero(p.kind == MARKER)
        if not m.size:
            continue
        n = p.hi[m] - p.lo[m]
        st = p.stretch[m]
        where = np.repeat(sp[st, 1] + p.at[m] - sp[st, 3], n) + ragged(np.zeros_like(n), n)
        block = np.repeat(sp[st, 0], n)
        want = files.prefix[ragged(files.pptr[p.member[m]] + p.lo[m], n)]
        got = batch.arrays["input_ids"][block, where]
        bad = np.flatnonzero(got != want)
        if bad.size:
            k = int(bad[0])
            row = int(files.rows[np.repeat(p.member[m], n)[k]])
            return (
                f"step {batch.step} block {int(block[k])} position {int(where[k])}: the prefix "
                f"(file marker or BOS) of row {row} holds id {int(got[k])}, expected "
                f"{int(want[k])} ({bad.size:,} of {want.size:,} prefix tokens of the step differ)"
            )
    return None


def check_text(sample: Sample) -> CheckResult:
    """Check 1 (see the module docstring)."""
    started = time.perf_counter()
    wrong = marker_problem(sample)
    if wrong is not None:
        return CheckResult(
            name="text_reconstruction",
            passed=False,
            detail=wrong,
            seconds=time.perf_counter() - started,
        )
    tok = sample.tokenizer
    fixed: dict[int, list[Stretch]] = {rid: [] for rid in sample.fixed_rows}
    items = [st for batch in sample.batches for st in stretches(batch)]
    stray = next((st for st in items if st.row not in sample.rows), None)
    if stray is not None:
        return CheckResult(
            name="text_reconstruction",
            passed=False,
            detail=(
                f"row {stray.row} at {stray.where()} is not a row the loader's filter selects "
                f"({sum(st.row not in sample.rows for st in items):,} such stretches)"
            ),
            seconds=time.perf_counter() - started,
        )
    fresh = [sample.rows[st.row].fresh[st.start : st.end] for st in items]
    for st in items:
        if st.row in fixed:
            fixed[st.row].append(st)
    got = tok.decode_batch([st.ids for st in items])  # one call: the decoder is multithreaded
    want = tok.decode_batch(fresh)
    bad = 0
    first_bad = ""
    for st, f, g, w in zip(items, fresh, got, want, strict=True):
        if g != w or not np.array_equal(st.ids, f):
            bad += 1
            if not first_bad:
                first_bad = (
                    f"row {st.row} tokens [{st.start}, {st.end}) at {st.where()} decode to "
                    f"{g[:40]!r}… but a fresh tokenization gives {w[:40]!r}…"
                )
    n_stretch = len(items)
    problems = [
        f"row {rid}: selected, but no block of the epoch holds any of its tokens"
        for rid, parts in fixed.items()
        if not parts
    ]
    problems += [
        p
        for rid, parts in fixed.items()
        for visit in visits(parts)
        if (p := _rebuild(rid, visit, sample))
    ]
    blocks = sum(len({(st.step, st.block) for st in parts}) for parts in fixed.values())
    seconds = time.perf_counter() - started
    if problems or bad:
        lead = problems[0] if problems else first_bad
        more = f"; {bad:,} of {n_stretch:,} sampled stretches differ" if bad else ""
        return CheckResult(
            name="text_reconstruction", passed=False, detail=lead + more, seconds=seconds
        )
    sizes = ", ".join(f"{rid} ({sample.rows[rid].n_tokens:,} tokens)" for rid in fixed)
    return CheckResult(
        name="text_reconstruction",
        passed=True,
        detail=(
            f"fixed rows {sizes} rebuilt exactly from {blocks} block stretches; "
            f"{n_stretch:,} stretches in {len(sample.batches)} steps decode as a fresh "
            "tokenization"
        ),
        seconds=seconds,
    )


def check_token_ids(sample: Sample) -> CheckResult:
    """Check 2 (see the module docstring)."""
    started = time.perf_counter()
    tok = sample.tokenizer
    problems: list[str] = []
    recorded = sample.identity.get("vocab_hash")
    if recorded != tok.vocab_hash:
        problems.append(
            f"the column records tokenizer {sample.identity.get('name')!r} with vocab_hash "
            f"{str(recorded)[:12]}… but it loads here with {tok.vocab_hash[:12]}…; the ids were "
            "made with another vocabulary"
        )
    differ = miscount = 0
    for rid in sorted(sample.rows):
        row = sample.rows[rid]
        if row.n_tokens != len(row.stored):
            miscount += 1
            if miscount == 1:
                problems.append(
                    f"row {rid}: stored count {row.n_tokens} but {len(row.stored)} stored ids"
                )
        if not np.array_equal(row.stored, row.fresh):
            differ += 1
            if differ == 1:
                i = _first_diff(row.stored, row.fresh)
                have = int(row.stored[i]) if i < len(row.stored) else "nothing"
                want = int(row.fresh[i]) if i < len(row.fresh) else "nothing"
                problems.append(
                    f"row {rid}: stored id {have} at token {i} but {tok.name} gives {want} "
                    f"({len(row.stored)} stored ids, {len(row.fresh)} fresh)"
                )
    seconds = time.perf_counter() - started
    n = len(sample.rows)
    if problems:
        tail = f"; {differ:,} of {n:,} rows differ" if differ else ""
        tail += f"; {miscount:,} stored counts are wrong" if miscount else ""
        return CheckResult(
            name="token_ids", passed=False, detail=problems[0] + tail, seconds=seconds
        )
    return CheckResult(
        name="token_ids",
        passed=True,
        detail=(
            f"{n:,} rows: stored ids and counts equal {tok.name}'s tokenization of their text; "
            f"vocab_hash {tok.vocab_hash[:12]}… matches"
        ),
        seconds=seconds,
    )
