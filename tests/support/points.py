"""Index points for store tests: small random vectors and BM25 text."""

from __future__ import annotations

import uuid

import numpy as np

from ragpipe.store import IndexPoint, SparseEncoder

DIM = 8


DOCS = {
    "a.md": ["alpha apples grow on trees", "alpha bananas are yellow", "alpha cherries are red"],
    "b.md": ["beta engines need oil", "beta wings carry the aircraft"],
    "dir/c.md": ["gamma statistics in R", "gamma plots with ggplot", "gamma models", "gamma data"],
}


def _vector(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def make_points(
    sha: str = "s1", fp: str = "f1", files: dict[str, list[str]] = DOCS
) -> list[IndexPoint]:
    sparse = SparseEncoder()
    points = []
    seed = 0
    for path, texts in files.items():
        for i, text in enumerate(texts):
            seed += 1
            indices, values = sparse.document(text)
            pid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{path}|{sha}|{fp}|{i}"))
            payload = {
                "text": text,
                "file_path": path,
                "source_sha": sha,
                "config_fingerprint": fp,
                "chunk_index": i,
                "chunk_total": len(texts),
                "heading_path": ["H"],
            }
            points.append(IndexPoint(pid, _vector(seed), indices, values, payload))
    return points
