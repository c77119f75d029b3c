"""Curation: exact and near-duplicate detection, heuristic quality scores, the held-out split.

Every function here is pure: Arrow or numpy columns in, arrays out, no table access. The
backfill engine calls the per-row ones on each batch (``text_hashes``, ``minhash_signatures``,
``quality_scores``) and the global ones once over the stored columns (``exact_duplicates`` over
``(id, text_hash)``, ``lsh_clusters`` over ``(id, minhash)``); the held-out split is a SQL filter.
See ``docs/curation.md`` for the defaults, the reasons for them and measured figures.
"""

from tokenloom.curate.exact import exact_duplicates, exact_duplicates_naive
from tokenloom.curate.inputs import CurateError
from tokenloom.curate.lsh import (
    DEFAULT_THRESHOLD,
    lsh_clusters,
    lsh_clusters_naive,
    optimal_params,
)
from tokenloom.curate.minhash import (
    EMPTY,
    MinHashConfig,
    estimate_jaccard,
    minhash_signatures,
    minhash_signatures_naive,
)
from tokenloom.curate.normalize import normalize_text, text_hashes
from tokenloom.curate.quality import (
    CODE,
    KINDS,
    PROSE,
    RULES,
    Rule,
    detect_kind,
    quality_scores,
    quality_scores_naive,
)
from tokenloom.curate.shingle import Fold, shingle_key, shingle_set
from tokenloom.curate.split import heldout_filter, heldout_mask, train_filter

__all__ = [
    "CurateError",
    "normalize_text",
    "text_hashes",
    "exact_duplicates",
    "exact_duplicates_naive",
    "Fold",
    "shingle_key",
    "shingle_set",
    "MinHashConfig",
    "EMPTY",
    "minhash_signatures",
    "minhash_signatures_naive",
    "estimate_jaccard",
    "DEFAULT_THRESHOLD",
    "optimal_params",
    "lsh_clusters",
    "lsh_clusters_naive",
    "PROSE",
    "CODE",
    "KINDS",
    "Rule",
    "RULES",
    "detect_kind",
    "quality_scores",
    "quality_scores_naive",
    "heldout_filter",
    "train_filter",
    "heldout_mask",
]
