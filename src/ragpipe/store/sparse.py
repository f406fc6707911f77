"""BM25 sparse vectors: the encoder both backends index and query with."""

from __future__ import annotations


class SparseEncoder:
    """Qdrant's BM25 text-to-sparse model (term frequencies; IDF is the store's)."""

    def __init__(self) -> None:
        import qdrant_edge

        self._bm25 = qdrant_edge.Bm25()

    def document(self, text: str) -> tuple[list[int], list[float]]:
        vector = self._bm25.embed_document(text)
        return list(vector.indices), list(vector.values)

    def query(self, text: str) -> tuple[list[int], list[float]]:
        vector = self._bm25.embed_query(text)
        return list(vector.indices), list(vector.values)
