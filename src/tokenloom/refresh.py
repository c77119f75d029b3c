"""``tokenloom refresh``: bring every derived column up to date after an append.

Each column a backfill added records the UDF that made it (``tokenloom.udf`` in its field
metadata). Rows appended later have no value in it (they read as null, see
:mod:`tokenloom.table.coverage`). Refresh runs, for each column that does not cover every row,
the job that made it again — with the recorded UDF, so only the missing rows are computed (the
backfill is incremental) and the new values equal what a full run gives:

==============================  ==============================================================
recorded UDF                    job run again
==============================  ==============================================================
``TextHash``, ``ExactLookup``   exact dedup (new rows hashed and flagged against every row)
``MinHash``, ``NearLookup``     near dedup at the recorded threshold and keep policy
``Quality``                     quality scores
``Encode``                      tokenize with the recorded tokenizer (vocabulary hash checked)
``LineBoundaries``              the cut points of the recorded token column
``Embed``                       embeddings with the recorded model settings
any UDF with a ``ref``          ``add_column`` with the UDF loaded from ``module:name``
==============================  ==============================================================

A column made by something else (no recorded UDF, or a UDF defined inside a function) is listed
as not refreshable, with the rows it lacks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from tokenloom.errors import TokenloomError

__all__ = ["RefreshError", "RefreshResult", "RefreshStep", "made_by", "refresh_table"]

_UDF_META_KEY = b"tokenloom.udf"
_ORDER = {
    "TextHash": 0,
    "ExactLookup": 0,
    "MinHash": 1,
    "NearLookup": 1,
    "Quality": 2,
    "Encode": 3,
    "LineBoundaries": 4,  # after the token column it reads
    "Embed": 5,
}


class RefreshError(TokenloomError):
    """Some columns still do not cover every row after a refresh."""


@dataclass(frozen=True, kw_only=True)
class RefreshStep:
    """One job run again."""

    job: str
    """What ran (``dedup``, ``dedup --near``, ``score``, ``tokenize``, ...)."""
    columns: list[str]
    """The columns it brought up to date."""
    rows_missing: int
    """Rows those columns lacked before."""
    versions: list[int]
    """Table versions it committed."""
    seconds: float


@dataclass(kw_only=True)
class RefreshResult:
    """What :func:`refresh_table` did."""

    table: str
    rows: int
    steps: list[RefreshStep] = field(default_factory=list)
    not_refreshable: dict[str, int] = field(default_factory=dict)
    """Columns no recorded UDF can fill -> rows they lack."""
    version: int = 0
    """The table version after the refresh."""

    def to_json(self) -> dict:
        return asdict(self)


def made_by(ds: Any, column: str) -> dict | None:
    """The identity of the UDF a backfill recorded on ``column`` (a *derived* column), or
    ``None`` for a column no backfill made (ingest's, or one added by hand)."""
    raw = (ds.schema.field(column).metadata or {}).get(_UDF_META_KEY)
    return json.loads(raw) if raw else None


def _jobs(ds: Any, missing: dict[str, int]) -> tuple[list[tuple[str, dict, list[str]]], dict]:
    """Group the columns lacking rows by the UDF that made them: ``[(name, identity, columns)]``
    in dependency order, plus the columns nobody can fill."""
    groups: dict[str, tuple[str, dict, list[str]]] = {}
    lost: dict[str, int] = {}
    for col in missing:
        made = made_by(ds, col)
        if made is None or (made.get("name") not in _ORDER and not made.get("ref")):
            lost[col] = missing[col]
            continue
        name = made["name"]
        # one job per UDF family (dedup's hash and its flags are one job); else one per UDF
        family = {"ExactLookup": "TextHash", "NearLookup": "MinHash"}.get(name, name)
        gid = family if family in ("TextHash", "MinHash", "Quality") else made["fingerprint"]
        if gid not in groups or name == "NearLookup":  # the threshold is on the flags
            groups[gid] = (name, made, groups[gid][2] if gid in groups else [])
        groups[gid][2].append(col)
    order = sorted(groups.values(), key=lambda g: _ORDER.get(g[0], 99))
    return order, lost


def _run(  # noqa: ANN202
    uri: str,
    name: str,
    ident: dict,
    cols: list[str],
    workers: int | None,
    progress,  # noqa: ANN001
    so: Mapping[str, str] | None,
):
    """Run one job again (``so``: the object-store options); returns (job label, versions)."""
    kwargs = dict(ident.get("kwargs") or {})
    if name in ("TextHash", "ExactLookup"):
        from tokenloom.curate.jobs import dedup_exact

        return "dedup", dedup_exact(
            uri, workers=workers, progress=progress, storage_options=so
        ).versions
    if name in ("MinHash", "NearLookup"):
        from tokenloom.curate.jobs import dedup_near
        from tokenloom.curate.lsh import DEFAULT_THRESHOLD

        threshold = kwargs.get("threshold", DEFAULT_THRESHOLD)
        keep = kwargs.get("keep", "first")
        res = dedup_near(
            uri, threshold=threshold, keep=keep, workers=workers, progress=progress,
            storage_options=so,
        )  # fmt: skip
        return f"dedup --near --threshold {threshold} --keep {keep}", res.versions
    if name == "Quality":
        from tokenloom.curate.jobs import score_quality

        return "score", score_quality(
            uri, workers=workers, progress=progress, storage_options=so
        ).versions
    if name == "Encode":
        from tokenloom.table import Table
        from tokenloom.tokenize.column import TOKENIZER_META_KEY, tokenize_table

        schema = Table.open(uri, storage_options=so).schema()
        column = next(c for c in cols if TOKENIZER_META_KEY in (schema.field(c).metadata or {}))
        res = tokenize_table(
            uri, kwargs["spec"], column=column, workers=workers, roundtrip_sample=0,
            progress=progress, storage_options=so,
        )  # fmt: skip
        return f"tokenize --tokenizer {kwargs['spec']} --column {column}", [
            v for v in [res.version] if v is not None
        ]
    if name == "LineBoundaries":
        from tokenloom.tokenize.boundaries import add_boundaries

        res = add_boundaries(
            uri, kwargs["column"], workers=workers, progress=progress,
            storage_options=dict(so) if so else None,
        )  # fmt: skip
        return f"tokenize --boundaries ({kwargs['column']})", [
            v for v in [res.version] if v is not None
        ]
    if name == "Embed":
        from tokenloom.search.embed import MAX_TOKENS, embed_table

        res = embed_table(
            uri, column=ident["inputs"][0], output=cols[0], workers=workers,
            max_tokens=kwargs.get("max_tokens", MAX_TOKENS), progress=progress,
            storage_options=so,
        )  # fmt: skip
        return "embed", [v for v in [res.version] if v is not None]
    from tokenloom.backfill import add_column
    from tokenloom.backfill.udf import load_udf
    from tokenloom.table import Table

    udf = load_udf(ident["ref"], **kwargs)
    res = add_column(
        Table.open(uri, storage_options=so),
        cols[0] if len(udf.columns) == 1 else None,
        udf,
        workers=workers,
        progress=progress,
    )
    return f"backfill run --udf {ident['ref']}", [v for v in [res.version] if v is not None]


def refresh_table(
    uri: str,
    *,
    workers: int | None = None,
    progress: bool | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> RefreshResult:
    """Compute every derived column for the rows it lacks, each with the UDF that made it.

    Args:
        uri: The table (its latest version).
        workers: Backfill workers per job (default: CPU count, at most 8; 0 runs inline).
        progress: Progress bars on stderr (default: when stderr is a terminal).
        storage_options: Object-store options for every job (with the ``AWS_*`` environment).

    Returns:
        The jobs run and the columns that could not be filled (``not_refreshable``).
    """
    from tokenloom.table import Table
    from tokenloom.table.coverage import missing_rows

    ds = Table.open(uri, storage_options=storage_options).dataset
    missing = missing_rows(ds)
    jobs, lost = _jobs(ds, missing)
    result = RefreshResult(table=uri, rows=ds.count_rows(), not_refreshable=lost)
    for name, ident, cols in jobs:
        started = time.perf_counter()
        label, versions = _run(uri, name, ident, cols, workers, progress, storage_options)
        result.steps.append(
            RefreshStep(
                job=label,
                columns=cols,
                rows_missing=max(missing[c] for c in cols),
                versions=list(versions),
                seconds=round(time.perf_counter() - started, 3),
            )
        )
    after = Table.open(uri, storage_options=storage_options).dataset
    result.version = after.version
    still = missing_rows(after)
    result.not_refreshable = {c: n for c, n in still.items()}
    return result
