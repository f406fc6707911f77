"""The query side: retrieval (dense, BM25, fusion, rerank) and grounded generation."""
