"""How cost grows with the index: 100k, 300k and 1M chunks on one machine, ours ÷ raw Edge.

For each size N it builds Qdrant Edge stores the way ingest does (ragpipe's
EdgeStore: named dense + BM25 sparse vectors, payload indexes; random unit
vectors clustered by topic, BM25 over real sentences, see bench/query.py)
and, from the same points, a raw ``EdgeShard`` with the same vectors,
payload indexes and batches. It prints:

* upsert points/s, ours ÷ raw (target ≥ 0.8 at every size);
* HNSW build seconds: ingest's own upkeep (``EdgeStore.build_index``, what
  the upsert stage runs past ``store.hnsw_min_unindexed``) ÷ raw ``optimize()``;
* dense / sparse / hybrid p50 and p95 after the build, ours (the Retriever's
  path) ÷ raw Edge, interleaved (target at 1M: hybrid p50 ≤ 10 ms);
* recall@10 of the HNSW dense search against exact search (target ≥ 0.95),
  and of an int8-quantised store (``store.quantization: int8``, rescored), and
  of one with int8 and its indexes on disk (``store.on_disk``);
* resident memory of a fresh query process that opens the store and runs
  queries (plain, int8, int8 + on_disk; its own memory and mapped files), and
  the store's size on disk;
* the upkeep trade (``--upkeep``, default 10k, 30k, 100k): that many new
  points written in turn; dense and hybrid p50 while they wait outside the
  index and after it is built, and the build's seconds;

and, for a corpus of F unchanged files (default 20k and 100k), the no-op
nightly re-index (``run_ingest``, library) ÷ walking and hashing the files
(target ≤ 3×; Prefect's fixed start comes on top, see bench/index.py). The
first ingest of those files uses the fast ONNX test embedder.

Results: bench/results/scale.json and a log-log plot bench/results/scale.svg.
Not in CI: `make bench-scale` (1M chunks takes hours on 2 cores).

Usage: python bench/scale.py [--sizes 100000,300000,1000000] [--files 20000,100000]
       [--upkeep 10000,30000,100000] [--queries 200] [--recall-queries 100]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import query as query_bench  # noqa: E402  (bench/query.py: sentences, the timed paths)

from ragpipe.config import Quantization, RagpipeConfig  # noqa: E402
from ragpipe.ingest.pipeline import run_ingest  # noqa: E402
from ragpipe.query.retrieve import Retriever  # noqa: E402
from ragpipe.store import (  # noqa: E402
    DENSE,
    EMBEDDER_FIELD,
    INTEGER_FIELDS,
    KEYWORD_FIELDS,
    SPARSE,
    EdgeStore,
    IndexPoint,
    SparseEncoder,
    StoreMeta,
)

DIM = 384
BATCH = 512
CLUSTERS = 2000
SPREAD = 0.35  # noise around a cluster centre: cosine to it about 0.94


def _centres() -> Any:
    """Topic centres: embeddings of real text cluster by topic; random unit vectors do
    not (every point about equally far from every query, where no ANN index recalls
    well and none needs to)."""
    rng = np.random.default_rng(12345)
    centres = rng.standard_normal((CLUSTERS, DIM)).astype(np.float32)
    return centres / np.linalg.norm(centres, axis=1, keepdims=True)


def _near(centre: Any, rng: Any) -> Any:
    noise = rng.standard_normal(DIM).astype(np.float32)
    vector = centre + SPREAD * noise / np.linalg.norm(noise)
    return vector / np.linalg.norm(vector)


def query_vectors(n: int, seed: int = 1) -> list[Any]:
    """Queries near a topic centre, as a question is near the passages that answer it."""
    rng = np.random.default_rng(seed)
    centres = _centres()
    return [_near(centres[rng.integers(CLUSTERS)], rng) for _ in range(n)]


def points(n: int, sentences: list[str], seed: int = 0) -> Iterator[list[IndexPoint]]:
    """N points like ingest writes them, in batches of 2,000 (generated as they go)."""
    rng = random.Random(seed)
    np_rng = np.random.default_rng(seed)
    centres = _centres()
    sparse = SparseEncoder()
    batch: list[IndexPoint] = []
    for i in range(n):
        text = " ".join(rng.choices(sentences, k=rng.randint(2, 6)))
        vector = _near(centres[np_rng.integers(CLUSTERS)], np_rng)
        indices, values = sparse.document(text)
        payload = query_bench.chunk_payload(i, text)
        batch.append(IndexPoint(str(uuid.UUID(int=i + 1)), vector, indices, values, payload))
        if len(batch) == 2000:
            yield batch
            batch = []
    if batch:
        yield batch


def raw_shard(path: Path) -> Any:
    """A raw Edge shard with ragpipe's layout: the same vectors and payload indexes (the
    engine's work is the same; no ragpipe code on the write path)."""
    import qdrant_edge as qe

    config = qe.EdgeConfig(
        vectors={DENSE: qe.EdgeVectorParams(size=DIM, distance=qe.Distance.Cosine)},
        sparse_vectors={SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
    )
    shard = qe.EdgeShard.create(str(path), config)
    for name, kind in [
        *((name, qe.PayloadSchemaType.Keyword) for name in KEYWORD_FIELDS),
        *((name, qe.PayloadSchemaType.Integer) for name in INTEGER_FIELDS),
        ("text", qe.TextIndexParams(tokenizer=qe.TokenizerType.Word, lowercase=True)),
    ]:
        shard.update(qe.UpdateOperation.create_field_index(name, kind))
    return shard


def raw_upsert(shard: Any, batch: list[IndexPoint]) -> None:
    import qdrant_edge as qe

    for start in range(0, len(batch), BATCH):
        shard.update(
            qe.UpdateOperation.upsert_points(
                [
                    qe.Point(
                        uuid.UUID(p.point_id),
                        {
                            DENSE: p.dense.tolist(),
                            SPARSE: qe.SparseVector(p.sparse_indices, p.sparse_values),
                        },
                        {**p.payload, EMBEDDER_FIELD: "bench-random"},
                    )
                    for p in batch[start : start + BATCH]
                ]
            )
        )
    shard.flush()


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def recall_at_10(store: EdgeStore, queries: list[Any]) -> float:
    """Share of the exact top 10 (brute force) that the indexed search returns."""
    qe = store._qe
    found = []
    for vector in queries:
        dense = qe.Query.Nearest(vector.tolist(), using=DENSE)
        exact = store._shard.query(
            qe.QueryRequest(limit=10, query=dense, params=qe.SearchParams(exact=True))
        )
        approx = store.query_dense(vector, 10)
        truth = {str(p.id) for p in exact}
        found.append(len(truth & {h.point_id for h in approx}) / len(truth))
    return statistics.mean(found)


# A fresh process: open the store as a reader does, run queries, report resident memory.
RSS_PROBE = """
import json, sys, numpy as np
sys.path.insert(0, sys.argv[2])
from ragpipe.config import RagpipeConfig
from ragpipe.query.retrieve import Retriever
from ragpipe.store import EdgeStore, StoreMeta
sys.path.insert(0, sys.argv[3])
import query as q
store = EdgeStore(__import__("pathlib").Path(sys.argv[1]), StoreMeta("bench-random", None))
cfg = RagpipeConfig(store={"path": sys.argv[1]})
retriever = Retriever(cfg, embedder=q._NoEmbedder(384), store=store)
rng = np.random.default_rng(7)
for i in range(100):
    v = rng.standard_normal(384).astype(np.float32)
    retriever._candidates("sentence of the corpus", v / np.linalg.norm(v), 10, cfg.retrieve, None)
status = open("/proc/self/status").read().splitlines()
kb = lambda key: [int(x.split()[1]) for x in status if x.startswith(key + ":")][0]
# RssAnon: the process's own memory; RssFile: mapped files (libraries, memory-mapped store
# files) resident in the page cache, which the kernel can drop and read again.
print(json.dumps({"rss_mb": kb("VmRSS") / 1024, "peak_rss_mb": kb("VmHWM") / 1024,
                  "anon_mb": kb("RssAnon") / 1024, "file_mb": kb("RssFile") / 1024}))
"""


def rss(path: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", RSS_PROBE, str(path), str(REPO / "src"), str(REPO / "bench")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def bench_size(n: int, tmp: Path, sentences: list[str], args: argparse.Namespace) -> dict[str, Any]:
    ours_path, raw_path, int8_path = tmp / "ours", tmp / "raw", tmp / "int8"
    lean_path = tmp / "int8-on-disk"
    meta = StoreMeta("bench-random", DIM)
    ours = EdgeStore(ours_path, meta, batch_size=BATCH)
    shard = raw_shard(raw_path)
    int8 = EdgeStore(int8_path, meta, batch_size=BATCH, quantization=Quantization.INT8)
    # The least memory: int8 vectors in RAM, HNSW graph, BM25 and payload indexes on disk.
    lean = EdgeStore(
        lean_path, meta, batch_size=BATCH, quantization=Quantization.INT8, on_disk=True
    )
    ours_s = raw_s = 0.0
    for i, batch in enumerate(points(n, sentences)):
        # Alternate who writes first: the second finds the page cache warm.
        order = [("raw", lambda b: raw_upsert(shard, b)), ("ours", ours.upsert)]
        # (ours flushes at the end of each upsert call, durable when it returns; raw
        # flushes too, below, so both pay for durability)
        for who, write in order if i % 2 == 0 else order[::-1]:
            started = time.perf_counter()
            write(batch)
            if who == "ours":
                ours_s += time.perf_counter() - started
            else:
                raw_s += time.perf_counter() - started
        int8.upsert(batch)
        lean.upsert(batch)
    ours._shard.flush()
    shard.flush()
    result: dict[str, Any] = {
        "chunks": n,
        "upsert": {"ours_pps": n / ours_s, "raw_pps": n / raw_s, "ratio": raw_s / ours_s},
    }
    print(f"{n} chunks: upsert ours {n / ours_s:.0f} pts/s, raw {n / raw_s:.0f} pts/s, "
          f"ours/raw {raw_s / ours_s:.2f}", flush=True)  # fmt: skip
    started = time.perf_counter()
    shard.optimize()
    raw_build = time.perf_counter() - started
    threshold = RagpipeConfig().store.hnsw_min_unindexed
    built = ours.build_index(threshold)  # what the upsert stage runs (default threshold)
    assert built is not None and built.indexed == n, built
    int8_built = int8.build_index(threshold)
    lean_built = lean.build_index(threshold)
    assert int8_built is not None and lean_built is not None
    result["hnsw_build"] = {
        "ours_s": built.seconds, "raw_s": raw_build, "ratio": built.seconds / raw_build,
        "int8_s": int8_built.seconds, "int8_on_disk_s": lean_built.seconds,
    }  # fmt: skip
    print(f"  HNSW build: ours {built.seconds:.1f}s, raw optimize {raw_build:.1f}s, int8 store "
          f"{int8_built.seconds:.1f}s, int8 + on_disk {lean_built.seconds:.1f}s",
          flush=True)  # fmt: skip
    shard.close()
    rng = random.Random(1)
    queries = [(rng.choice(sentences), v) for v in query_vectors(args.queries)]
    vectors = [v for _, v in queries[: args.recall_queries]]
    result["recall_at_10"] = {"hnsw": recall_at_10(ours, vectors),
                              "int8": recall_at_10(int8, vectors),
                              "int8_on_disk": recall_at_10(lean, vectors)}  # fmt: skip
    int8_latency = []
    for vector in vectors:
        started = time.perf_counter()
        int8.query_dense(vector, 10)
        int8_latency.append(time.perf_counter() - started)
    result["int8_dense_raw_call"] = query_bench.percentiles(int8_latency)
    int8.close()
    lean_cfg = RagpipeConfig(store={"path": lean_path})  # type: ignore[arg-type]
    lean_retriever = Retriever(lean_cfg, embedder=query_bench._NoEmbedder(DIM), store=lean)
    query_bench.measure(lean_retriever, queries[:20], ["hybrid"], 10)  # warm-up
    result["int8_on_disk_query"] = query_bench.measure(lean_retriever, queries, ["hybrid"], 10)
    lean_retriever.close()
    cfg = RagpipeConfig(store={"path": ours_path})  # type: ignore[arg-type]
    retriever = Retriever(cfg, embedder=query_bench._NoEmbedder(DIM), store=ours)
    modes = ["dense", "sparse", "hybrid", "hybrid-rrf-in-engine"]
    query_bench.measure(retriever, queries[:20], modes, 10)  # warm-up
    result["query"] = query_bench.measure(retriever, queries, modes, 10)
    retriever.close()
    for mode in modes:
        r = result["query"][mode]
        print(f"  {mode:22s} ours p50 {r['ours']['p50_ms']:.2f} ms p95 {r['ours']['p95_ms']:.2f}"
              f" ms | raw p50 {r['raw']['p50_ms']:.2f} ms | ours/raw {r['ratio_p50']:.2f}",
              flush=True)  # fmt: skip
    rc = result["recall_at_10"]
    lean_hybrid = result["int8_on_disk_query"]["hybrid"]["ours"]
    print(f"  int8 + on_disk: hybrid p50 {lean_hybrid['p50_ms']:.2f} ms p95 "
          f"{lean_hybrid['p95_ms']:.2f} ms", flush=True)  # fmt: skip
    print(f"  recall@10 vs exact: HNSW {rc['hnsw']:.3f}, int8 + rescoring {rc['int8']:.3f}, "
          f"int8 + on_disk {rc['int8_on_disk']:.3f}", flush=True)  # fmt: skip
    counts = [int(c) for c in args.upkeep.split(",") if c]
    result["upkeep"] = bench_upkeep(ours_path, n, sentences, queries, counts)
    result["memory"] = {"plain": rss(ours_path), "int8": rss(int8_path),
                        "int8_on_disk": rss(lean_path)}  # fmt: skip
    paths = {"plain": ours_path, "int8": int8_path, "int8_on_disk": lean_path, "raw": raw_path}
    result["disk_mb"] = {name: du(path) / 1e6 for name, path in paths.items()}
    for name, m in result["memory"].items():
        print(f"  query process RSS, {name}: {m['rss_mb']:.0f} MB (process memory "
              f"{m['anon_mb']:.0f}, mapped files {m['file_mb']:.0f}; peak "
              f"{m['peak_rss_mb']:.0f}); disk {result['disk_mb'][name]:.0f} MB",
              flush=True)  # fmt: skip
    for path in (ours_path, raw_path, int8_path, lean_path):
        shutil.rmtree(path, ignore_errors=True)
    return result


def bench_upkeep(
    path: Path, n: int, sentences: list[str], queries: list[tuple[str, Any]], counts: list[int]
) -> list[dict[str, Any]]:
    """The trade store.hnsw_min_unindexed makes. For each count c: a nightly writes c new
    points; until they are indexed each query scans them (dense and the default hybrid,
    p50 with them waiting), then indexing them costs once (and the p50 after it)."""
    store = EdgeStore(path, StoreMeta("bench-random", None), batch_size=BATCH)
    cfg = RagpipeConfig(store={"path": path})  # type: ignore[arg-type]
    retriever = Retriever(cfg, embedder=query_bench._NoEmbedder(DIM), store=store)

    def p50s() -> tuple[float, float]:
        dense, hybrid = [], []
        for text, vector in queries:
            started = time.perf_counter()
            store.query_dense(vector, 10)
            dense.append(time.perf_counter() - started)
            started = time.perf_counter()
            retriever._candidates(text, vector, 10, cfg.retrieve, None)
            hybrid.append(time.perf_counter() - started)
        return 1000 * statistics.median(dense), 1000 * statistics.median(hybrid)

    rows, total = [], n
    for count in counts:
        added = 0
        for batch in points(count, sentences, seed=99 + total):  # new ids after the others
            moved = [IndexPoint(str(uuid.UUID(int=total + added + i + 1)), p.dense,
                                p.sparse_indices, p.sparse_values, p.payload)
                     for i, p in enumerate(batch)]  # fmt: skip
            store.upsert(moved)
            added += len(moved)
        total += added
        p50s()  # warm-up
        dense_before, hybrid_before = p50s()
        built = store.build_index(count)
        assert built is not None and built.indexed == added, built
        dense_after, hybrid_after = p50s()
        print(f"  upkeep: {added} new points in a store of {total}: dense p50 "
              f"{dense_before:.2f} -> {dense_after:.2f} ms, hybrid p50 {hybrid_before:.2f} -> "
              f"{hybrid_after:.2f} ms (waiting -> indexed); indexing them took "
              f"{built.seconds:.1f}s", flush=True)  # fmt: skip
        rows.append({"points": added, "store_points": total,
                     "dense_p50_unindexed_ms": dense_before, "dense_p50_indexed_ms": dense_after,
                     "hybrid_p50_unindexed_ms": hybrid_before,
                     "hybrid_p50_indexed_ms": hybrid_after, "build_s": built.seconds})  # fmt: skip
    retriever.close()
    return rows


def bench_noop(files: int, tmp: Path, repeat: int) -> dict[str, Any]:
    corpus = tmp / f"files-{files}"
    for i in range(files):
        folder = corpus / f"d{i // 1000:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"note-{i:06d}.txt").write_text(
            f"Short note number {i} about topic {i % 37}.\n", encoding="utf-8"
        )
    cfg = RagpipeConfig(
        discover={"roots": [corpus]},  # type: ignore[arg-type]
        embed={"provider": "onnx", "batch_size": 64},  # type: ignore[arg-type]
        store={"path": tmp / f"store-{files}"},  # type: ignore[arg-type]
        paths={"work_dir": tmp / f"work-{files}"},  # type: ignore[arg-type]
    )
    started = time.perf_counter()
    first = run_ingest(cfg)
    initial = time.perf_counter() - started
    print(f"{files} files: first ingest {initial:.0f}s ({first.points_total} points)", flush=True)

    def walk_and_hash() -> None:
        for dirpath, _, names in os.walk(corpus):
            for name in names:
                with open(os.path.join(dirpath, name), "rb") as fh:
                    hashlib.file_digest(fh, "sha256").hexdigest()

    hash_s, noop_s = [], []
    for _ in range(repeat):
        started = time.perf_counter()
        walk_and_hash()
        hash_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        summary = run_ingest(cfg)
        noop_s.append(time.perf_counter() - started)
        assert summary.chunks_written == 0 and summary.skipped_unchanged == files
    h, n = statistics.median(hash_s), statistics.median(noop_s)
    print(f"  no-op re-index {n:.2f}s, walk + hash {h:.2f}s: ratio {n / h:.2f} (target <= 3)",
          flush=True)  # fmt: skip
    return {"files": files, "first_ingest_s": initial, "noop_s": n, "walk_hash_s": h,
            "ratio": n / h}  # fmt: skip


def plot(results: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["chunks"] for r in results["sizes"]]
    if not sizes:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = {
        "upsert, s (ours)": [r["chunks"] / r["upsert"]["ours_pps"] for r in results["sizes"]],
        "HNSW build, s": [r["hnsw_build"]["ours_s"] for r in results["sizes"]],
        "hybrid p50, ms": [r["query"]["hybrid"]["ours"]["p50_ms"] for r in results["sizes"]],
        "dense p50, ms": [r["query"]["dense"]["ours"]["p50_ms"] for r in results["sizes"]],
        "query RSS, 100 MB": [r["memory"]["plain"]["rss_mb"] / 100 for r in results["sizes"]],
    }
    for label, ys in series.items():
        ax.plot(sizes, ys, marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("chunks in the index")
    ax.set_title("ragpipe on one machine: cost vs index size (log-log)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(out, bbox_inches="tight")
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--sizes", default="100000,300000,1000000")
    parser.add_argument("--files", default="20000,100000")
    parser.add_argument(
        "--upkeep",
        default="10000,30000,100000",
        help="new points written (then indexed) in turn after the store is built, to weigh "
        "store.hnsw_min_unindexed",
    )
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--recall-queries", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "scale.json")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    files = [int(f) for f in args.files.split(",") if f and int(f) > 0]
    threshold = RagpipeConfig().store.hnsw_min_unindexed
    if any(n < threshold for n in sizes):
        parser.error(f"--sizes: each at least {threshold} (store.hnsw_min_unindexed), or "
                     "ingest's upkeep would leave the store unindexed")  # fmt: skip
    sentences = query_bench.sentence_pool()
    results: dict[str, Any] = {"sizes": [], "noop": [], "machine": {"cpus": os.cpu_count()}}
    args.json.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every size: a long run that stops keeps what it measured
        args.json.write_text(json.dumps(results, indent=2))
        plot(results, args.json.with_suffix(".svg"))

    with tempfile.TemporaryDirectory(prefix="ragpipe-bench-scale-") as tmp:
        for n in sizes:
            results["sizes"].append(bench_size(n, Path(tmp), sentences, args))
            save()
        for f in files:
            results["noop"].append(bench_noop(f, Path(tmp), args.repeat))
            save()
    print(f"wrote {args.json} and {args.json.with_suffix('.svg')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
