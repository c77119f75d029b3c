"""Tests of tokenloom.search: embeddings, indexes, queries, contamination."""
