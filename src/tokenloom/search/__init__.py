"""Search the corpus table: MiniLM embeddings, BM25 / vector indexes, fts / vector / hybrid
queries on any version, and n-gram contamination against an evaluation set.

```python
from tokenloom.search import embed_table, build_indexes, search, find_contamination

embed_table("corpus.lance")                 # + embedding (a backfill, one version)
build_indexes("corpus.lance")               # BM25 on text, a vector index sized to the table
search("corpus.lance", "wherefore art thou", mode="hybrid", where="source LIKE 'shakespeare%'")
find_contamination("corpus.lance", ["an eval question ..."], n=13, filter="NOT is_dup")
```

Importing this package loads neither torch nor the model; both load on first use.
"""

from tokenloom.search.contamination import ContaminationResult, find_contamination, read_eval
from tokenloom.search.embed import EmbedResult, embed_table, embed_texts
from tokenloom.search.index import IndexResult, SearchError, build_indexes, choose_vector_index
from tokenloom.search.query import Hit, SearchResult, rrf_fuse, search

__all__ = [
    "ContaminationResult",
    "EmbedResult",
    "Hit",
    "IndexResult",
    "SearchError",
    "SearchResult",
    "build_indexes",
    "choose_vector_index",
    "embed_table",
    "embed_texts",
    "find_contamination",
    "read_eval",
    "rrf_fuse",
    "search",
]
