"""Search the corpus table: embeddings, indexes, FTS / vector / hybrid queries, contamination."""
