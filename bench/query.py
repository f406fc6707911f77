"""Query latency on the embedded store at scale, against the raw engine, in one run.

Builds a Qdrant Edge store of N chunks (default 50,000) the way ingest does
(ragpipe's EdgeStore: named dense + BM25 sparse vectors, payload indexes).
Texts are sentences of the sample corpus and Docling's ground-truth Markdown
recombined at random, so BM25 sees real English term statistics; dense vectors are random unit
vectors (embedding 50k chunks would take ~40 minutes here, and latency does
not depend on what the vectors mean). Queries are sentences from the same
pool with random query vectors; query embedding is excluded everywhere.

For each mode it times ragpipe's retrieval path (``Retriever._candidates``:
filters, fusion, the document signal, ranking, hit objects) and the raw
``EdgeShard.query`` of that kind (dense, sparse, or the in-engine RRF hybrid
request), interleaved, and prints p50/p95 and the ratio of p50s. The default
hybrid (convex fusion with the document signal, fused here: three engine
queries) is timed beside the in-engine RRF hybrid (one request). The
client-side path (dense leg in Edge + rank-bm25 over all texts + RRF here)
is printed for comparison. Target: hybrid p50 ≤ 10 ms at 50k chunks.

The store is measured as ingest leaves it, then again after
``EdgeShard.optimize()`` builds the HNSW index.

Usage: python bench/query.py [--chunks 50000] [--queries 200] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from ragpipe.config import RagpipeConfig  # noqa: E402
from ragpipe.query.retrieve import Retriever  # noqa: E402
from ragpipe.store import DENSE, EdgeStore, IndexPoint, SparseEncoder, StoreMeta  # noqa: E402

SAMPLE = REPO / "data" / "sample"


def sentence_pool() -> list[str]:
    """Sentences of the sample corpus's Markdown and Docling's ground-truth Markdown."""
    texts = []
    for path in sorted(SAMPLE.rglob("*")):
        if path.suffix in {".md", ".txt", ".html"}:
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
    faq = REPO.parent / "shared" / "corpus" / "groundtruth"
    for path in sorted(faq.glob("*.md"))[:20]:
        texts.append(path.read_text(encoding="utf-8", errors="replace"))
    sentences = []
    for text in texts:
        for s in re.split(r"(?<=[.?!])\s+", " ".join(text.split())):
            if 5 <= len(s.split()) <= 60:
                sentences.append(s)
    if len(sentences) < 100:
        raise SystemExit(f"only {len(sentences)} sentences found under {SAMPLE} and {faq}")
    return sentences


def chunk_payload(i: int, text: str) -> dict[str, Any]:
    """The payload of the i-th bench chunk, as ingest writes it: 20 chunks per file."""
    return {
        "text": text,
        "file_path": f"doc{i // 20:06d}.md",
        "heading_path": [f"Section {i % 7}"],
        "source_sha": f"{i // 20:064x}",
        "doc_id": f"doc{i // 20:06d}",
        "config_fingerprint": "bench",
        "chunk_index": i % 20,
        "chunk_total": 20,
    }


def build(path: Path, n: int, dim: int, rng: random.Random) -> list[str]:
    sentences = sentence_pool()
    sparse = SparseEncoder()
    np_rng = np.random.default_rng(0)
    store = EdgeStore(path, StoreMeta("bench-random", dim), batch_size=512)
    started = time.perf_counter()
    batch: list[IndexPoint] = []
    for i in range(n):
        text = " ".join(rng.choices(sentences, k=rng.randint(2, 6)))
        vector = np_rng.standard_normal(dim).astype(np.float32)
        vector /= np.linalg.norm(vector)
        indices, values = sparse.document(text)
        batch.append(
            IndexPoint(str(uuid.UUID(int=i + 1)), vector, indices, values, chunk_payload(i, text))
        )
        if len(batch) == 2000:
            store.upsert(batch)
            batch = []
    if batch:
        store.upsert(batch)
    store.close()
    print(f"built {n} chunks in {time.perf_counter() - started:.1f}s", flush=True)
    return sentences


def percentiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {
        "p50_ms": 1000 * statistics.median(xs),
        "p95_ms": 1000 * xs[min(len(xs) - 1, int(0.95 * len(xs)))],
    }


# What is timed: ragpipe's path with these retrieve overrides, against the raw engine
# request of that kind (dense, sparse, or the in-engine RRF hybrid request).
MODES: dict[str, tuple[dict[str, Any], str]] = {
    "dense": ({"mode": "dense"}, "dense"),  # with the document signal (a second query)
    "sparse": ({"mode": "sparse"}, "sparse"),
    "hybrid": ({"mode": "hybrid"}, "hybrid"),  # the default: convex + document signal, here
    "hybrid-rrf-in-engine": (
        {"mode": "hybrid", "fusion_method": "rrf", "doc_weight": 0.0},
        "hybrid",
    ),
}


def measure(
    retriever: Retriever, queries: list[tuple[str, Any]], modes: list[str], k: int
) -> dict[str, Any]:
    store = retriever.store
    assert isinstance(store, EdgeStore)
    qe = store._qe
    shard = store._shard
    cfg = retriever.config.retrieve
    out: dict[str, Any] = {}
    for label in modes:
        overrides, mode = MODES[label]
        mode_cfg = type(cfg).model_validate({**cfg.model_dump(), **overrides})
        legs = cfg.prefetch

        def raw(text: str, vector: Any, mode: str = mode, legs: int = legs) -> Any:
            dense = qe.Query.Nearest(vector.tolist(), using=DENSE)
            if mode == "dense":
                request = qe.QueryRequest(limit=k, query=dense, with_payload=True)
            elif mode == "sparse":
                request = qe.QueryRequest(
                    limit=k, query=store._sparse_query(text), with_payload=True
                )
            else:
                request = qe.QueryRequest(
                    limit=k,
                    prefetches=[
                        qe.Prefetch(limit=legs, query=dense),
                        qe.Prefetch(limit=legs, query=store._sparse_query(text)),
                    ],
                    query=qe.Fusion.Rrf(k=cfg.rrf_k + 1),
                    with_payload=True,
                )
            return shard.query(request)

        ours_s: list[float] = []
        raw_s: list[float] = []

        def ours_run(text: str, vector: Any, mode_cfg: Any = mode_cfg) -> Any:
            return retriever._candidates(text, vector, k, max(mode_cfg.prefetch, k), mode_cfg, None)

        for i, (text, vector) in enumerate(queries):
            # Alternate who goes first: the second run of a query finds warm caches.
            runs: list[tuple[list[float], Callable[..., Any]]] = [(raw_s, raw), (ours_s, ours_run)]
            for times, run in runs if i % 2 == 0 else runs[::-1]:
                started = time.perf_counter()
                run(text, vector)
                times.append(time.perf_counter() - started)
        ours, engine = percentiles(ours_s), percentiles(raw_s)
        out[label] = {
            "ours": ours,
            "raw": engine,
            "ratio_p50": ours["p50_ms"] / engine["p50_ms"],
            "settings": overrides,
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--chunks", type=int, default=50_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--client-queries", type=int, default=20)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--skip-optimize", action="store_true")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "query.json")
    args = parser.parse_args()
    rng = random.Random(0)
    dim = 384
    results: dict[str, Any] = {"chunks": args.chunks, "queries": args.queries, "k": args.k}
    with tempfile.TemporaryDirectory(prefix="ragpipe-bench-query-") as tmp:
        path = Path(tmp) / "store"
        sentences = build(path, args.chunks, dim, rng)
        np_rng = np.random.default_rng(1)
        queries = []
        for _ in range(args.queries):
            vector = np_rng.standard_normal(dim).astype(np.float32)
            queries.append((rng.choice(sentences), vector / np.linalg.norm(vector)))
        cfg = RagpipeConfig(store={"path": path})  # type: ignore[arg-type]
        phases = ["as_ingested"] + ([] if args.skip_optimize else ["optimized"])
        for phase in phases:
            store = EdgeStore(path, StoreMeta("bench-random", None))
            if phase == "optimized":
                started = time.perf_counter()
                store._shard.optimize()
                results["optimize_s"] = time.perf_counter() - started
                print(f"optimize (HNSW build): {results['optimize_s']:.1f}s", flush=True)
            retriever = Retriever(cfg, embedder=_NoEmbedder(dim), store=store)
            measure(retriever, queries[:20], list(MODES), args.k)  # warm-up
            phase_results = measure(retriever, queries, list(MODES), args.k)
            # Client side: dense leg in Edge, rank-bm25 over every text, RRF here.
            client_cfg = cfg.retrieve.model_copy(
                update={"mode": "hybrid", "fusion": "client", "sparse_engine": "rank_bm25"}
            )
            started = time.perf_counter()
            retriever._candidates(
                queries[0][0],
                queries[0][1],
                args.k,
                max(client_cfg.prefetch, args.k),
                client_cfg,
                None,
            )
            build_s = time.perf_counter() - started
            times = []
            for text, vector in queries[: args.client_queries]:
                started = time.perf_counter()
                retriever._candidates(
                    text, vector, args.k, max(client_cfg.prefetch, args.k), client_cfg, None
                )
                times.append(time.perf_counter() - started)
            phase_results["client_hybrid_rank_bm25"] = {
                "ours": percentiles(times),
                "index_build_s": build_s,
            }
            results[phase] = phase_results
            retriever.close()
            print(f"{phase} ({args.chunks} chunks, k={args.k}, {args.queries} queries):")
            for mode in MODES:
                r = phase_results[mode]
                print(
                    f"  {mode:20s} ours p50 {r['ours']['p50_ms']:.2f} ms p95 "
                    f"{r['ours']['p95_ms']:.2f} ms | raw Edge p50 {r['raw']['p50_ms']:.2f} ms "
                    f"p95 {r['raw']['p95_ms']:.2f} ms | ours/raw {r['ratio_p50']:.2f}"
                    + ("  (target: default hybrid p50 <= 10 ms)" if mode == "hybrid" else ""),
                    flush=True,
                )
            c = phase_results["client_hybrid_rank_bm25"]
            print(
                f"  client-side hybrid (rank-bm25 + RRF here): p50 {c['ours']['p50_ms']:.1f} ms "
                f"p95 {c['ours']['p95_ms']:.1f} ms; index build {c['index_build_s']:.1f}s",
                flush=True,
            )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")
    return 0


class _NoEmbedder:
    """Queries arrive as vectors here: the retriever must never embed."""

    name = "bench-random"
    max_tokens = 256

    def __init__(self, dim: int) -> None:
        self.dim = dim

    def embed_documents(self, texts: Any) -> Any:
        raise AssertionError("the benchmark excludes embedding")

    def embed_query(self, text: str) -> Any:
        raise AssertionError("the benchmark excludes embedding")


if __name__ == "__main__":
    raise SystemExit(main())
