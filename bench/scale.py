"""How cost grows with the index: 100k, 300k and 1M chunks on one machine, ours ÷ raw Edge.

For each size N it builds, from the same points, the Qdrant Edge stores named
in ``--stores`` the way ingest does (ragpipe's EdgeStore: named dense + BM25
sparse vectors, payload indexes; random unit vectors clustered by topic, BM25
over real sentences, see bench/query.py): ``plain``, ``int8``
(``store.quantization: int8``, rescored) and ``int8_on_disk`` (also
``store.on_disk``). The first is timed against a raw ``EdgeShard`` created
with the same config, payload indexes and batches. It prints:

* upsert points/s, ours ÷ raw (target ≥ 0.8 at every size);
* HNSW build seconds of each store: ingest's own upkeep
  (``EdgeStore.build_index``, what the upsert stage runs past
  ``store.hnsw_min_unindexed``), and ÷ raw ``optimize()`` (``--no-raw-build``
  skips that build: at 1M it is about 6 minutes on 2 cores);
* dense / sparse / hybrid p50 and p95 after the build, ours (the Retriever's
  path) ÷ the raw engine's query on the same store, interleaved query by query;
  after a warm-up pass, ``--rounds`` rounds (default 3) with the order of the
  modes rotating, the median of the rounds' p50 (target at 1M: hybrid p50
  ≤ 10 ms);
* recall@10 of each store's dense search against exact search (≥ 0.95);
* resident memory and hybrid p50 of a fresh query process that opens each
  store and runs 400 queries (the last 300 timed; its own memory and mapped
  files), and again inside a memory cgroup of ``--memory-cap`` MB (default
  1024; needs root) with the store's files evicted from the page cache first,
  so the kernel holds the process to that much; and the store's size on disk;
* the upkeep trade (``--upkeep``, default 10k, 30k, 100k): that many new
  points written in turn into the first store; dense and hybrid p50 while they
  wait outside the index and after it is built, and the build's seconds;

and, for a corpus of F unchanged files (default 20k and 100k), the no-op
nightly re-index (``run_ingest``, library) ÷ walking and hashing the files
(target ≤ 3×; Prefect's fixed start comes on top, see bench/index.py). The
first ingest of those files uses the fast ONNX test embedder.

Results: bench/results/scale.json and a log-log plot bench/results/scale.svg
(written after each size, and before its upkeep). Not in CI: `make
bench-scale` (about 1.5 h on 2 cores). The runs in docs/explanation/benchmarks.md:
--sizes 100000,300000,1000000 --files "" --stores plain,int8,int8_on_disk
--upkeep 30000 --keep DIR, and --sizes 1000000 --stores plain,int8_on_disk
--no-raw-build; then bench/query_parts.py and bench/int8_recall.py on the
kept stores.

Usage: python bench/scale.py [--sizes 100000,300000,1000000] [--files 20000,100000]
       [--stores plain,int8,int8_on_disk] [--no-raw-build] [--memory-cap MB]
       [--upkeep 10000,30000,100000] [--queries 200] [--recall-queries 100]
       [--rounds 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
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
from collections.abc import Callable, Iterator
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
    SPARSE,
    EdgeStore,
    IndexPoint,
    SparseEncoder,
    StoreMeta,
)
from ragpipe.store.edge import (  # noqa: E402
    indexing_threshold_kb,
    payload_indexes,
    shard_config,
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


def raw_shard(path: Path, quantization: Quantization, on_disk: bool, threshold: int) -> Any:
    """A raw Edge shard with ragpipe's layout: the same config (vectors, quantisation, on-disk
    choices, indexing threshold) and payload indexes, so the engine's work is the same; no
    ragpipe code on the write path."""
    import qdrant_edge as qe

    config = shard_config(qe, DIM, quantization, on_disk, indexing_threshold_kb(threshold, DIM))
    shard = qe.EdgeShard.create(str(path), config)
    for name, params in payload_indexes(qe, on_disk):
        shard.update(qe.UpdateOperation.create_field_index(name, params))
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


def exact_top10(n: int, queries: list[Any], seed: int = 0) -> list[set[str]]:
    """The true top 10 of each query among the N points ``points`` writes, by brute force
    in numpy over the same vectors (regenerated: they come from their own generator), so
    the truth does not depend on the engine or the store's quantisation."""
    np_rng = np.random.default_rng(seed)
    centres = _centres()
    matrix = np.empty((n, DIM), np.float32)
    for i in range(n):
        matrix[i] = _near(centres[np_rng.integers(CLUSTERS)], np_rng)
    scores = np.stack(queries).astype(np.float32) @ matrix.T  # unit vectors: cosine
    best = np.argpartition(-scores, 10, axis=1)[:, :10]
    return [{str(uuid.UUID(int=int(i) + 1)) for i in row} for row in best]


def recall_at_10(store: EdgeStore, queries: list[Any], truth: list[set[str]]) -> float:
    """Share of the exact top 10 that the store's dense search (ragpipe's) returns."""
    found = []
    for vector, best in zip(queries, truth, strict=True):
        approx = store.query_dense(vector, 10)
        found.append(len(best & {h.point_id for h in approx}) / len(best))
    return statistics.mean(found)


# Which stores a size builds: the quantisation and store.on_disk each is created with.
VARIANTS: dict[str, tuple[Quantization, bool]] = {
    "plain": (Quantization.NONE, False),
    "int8": (Quantization.INT8, False),
    "int8_on_disk": (Quantization.INT8, True),
}

# A fresh process: open the store as a reader does, run the default hybrid search over the
# queries in argv[4] (the first 100 warm it up), report latency and resident memory.
RSS_PROBE = """
import json, os, statistics, sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, sys.argv[2])
from ragpipe.config import RagpipeConfig
from ragpipe.query.retrieve import Retriever
from ragpipe.store import EdgeStore, StoreMeta
sys.path.insert(0, sys.argv[3])
import query as q
store = EdgeStore(Path(sys.argv[1]), StoreMeta("bench-random", None))
cfg = RagpipeConfig(store={"path": sys.argv[1]})
retriever = Retriever(cfg, embedder=q._NoEmbedder(384), store=store)
data = np.load(sys.argv[4])
texts = json.loads(Path(sys.argv[5]).read_text())
times = []
for i, (text, vector) in enumerate(zip(texts, data)):
    started = time.perf_counter()
    retriever._candidates(text, vector, 10, max(cfg.retrieve.prefetch, 10), cfg.retrieve, None)
    if i >= 100:
        times.append(time.perf_counter() - started)
status = open("/proc/self/status").read().splitlines()
kb = lambda key: [int(x.split()[1]) for x in status if x.startswith(key + ":")][0]
# RssAnon: the process's own memory; RssFile: mapped files (libraries, memory-mapped store
# files) resident in the page cache, which the kernel can drop and read again.
# Which of the store's files the mapped share is: resident MB per part of a segment.
root = os.path.realpath(sys.argv[1]) + os.sep
store_mb, mapping = {}, None
for line in open("/proc/self/smaps"):
    head = line.split(maxsplit=5)
    if not head[0].endswith(":"):  # a mapping's header: range perms offset dev inode [path]
        mapping = head[5].strip() if len(head) == 6 else None
    elif head[0] == "Rss:" and mapping and mapping.startswith(root):
        rel = Path(mapping[len(root):]).parts
        part = rel[2] if rel[0] == "segments" and len(rel) >= 3 else rel[0]
        store_mb[part] = store_mb.get(part, 0.0) + int(head[1]) / 1024
p = q.percentiles(times)
print(json.dumps({"rss_mb": kb("VmRSS") / 1024, "peak_rss_mb": kb("VmHWM") / 1024,
                  "anon_mb": kb("RssAnon") / 1024, "file_mb": kb("RssFile") / 1024,
                  "store_mapped_mb": store_mb,
                  "hybrid_p50_ms": p["p50_ms"], "hybrid_p95_ms": p["p95_ms"]}))
"""


def memory_cgroup(limit_mb: int) -> Path | str:
    """A new memory cgroup limited to ``limit_mb`` (the kernel reclaims the page cache of
    mapped files inside it, and kills the process if its own memory passes the limit), or
    why there cannot be one here."""
    name = f"ragpipe-bench-{os.getpid()}-{limit_mb}"
    v1, root = Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")
    try:
        if v1.is_dir():
            group = v1 / name
            group.mkdir()
            (group / "memory.limit_in_bytes").write_text(str(limit_mb << 20))
        elif "memory" in (root / "cgroup.subtree_control").read_text().split():
            group = root / name
            group.mkdir()
            (group / "memory.max").write_text(str(limit_mb << 20))
        else:
            return "the memory cgroup controller is not enabled"
    except OSError as exc:
        return f"cannot create a memory cgroup ({exc}); run as root to measure under a cap"
    return group


def evict(path: Path) -> None:
    """Drop the store's files from the page cache (clean pages no process maps), so that a
    probe reads them itself and they count against its own memory cgroup."""
    for f in path.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def rss(path: Path, queries: tuple[Path, Path], cap_mb: int | None = None) -> dict[str, Any]:
    """Resident memory and hybrid latency of a fresh query process; with ``cap_mb``, run it
    inside a memory cgroup of that size, its store's files evicted from the page cache."""
    group: Path | None = None
    if cap_mb is not None:
        made = memory_cgroup(cap_mb)
        if isinstance(made, str):
            return {"cap_mb": cap_mb, "skipped": made}
        group = made
        evict(path)
    procs = group / "cgroup.procs" if group else None

    def join() -> None:  # in the child, before it runs Python: join the cgroup
        if procs is not None:
            procs.write_text(str(os.getpid()))

    try:
        out = subprocess.run(
            [sys.executable, "-c", RSS_PROBE, str(path), str(REPO / "src"), str(REPO / "bench"),
             str(queries[0]), str(queries[1])],
            capture_output=True, text=True, preexec_fn=join,
        )  # fmt: skip
    finally:
        if group is not None:
            time.sleep(0.5)
            group.rmdir()
    if out.returncode != 0:
        if cap_mb is not None and out.returncode == -9:
            return {"cap_mb": cap_mb, "killed": True}
        raise RuntimeError(f"query probe failed ({out.returncode}): {out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if cap_mb is not None:
        result["cap_mb"] = cap_mb
    return result


def bench_size(
    n: int,
    tmp: Path,
    sentences: list[str],
    args: argparse.Namespace,
    save: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """One size: every store in --stores written from the same points; the first one is
    timed against a raw Edge shard created the same way (upsert, and its queries against
    the raw engine on the same shard)."""
    names: list[str] = args.stores
    primary = names[0]
    meta = StoreMeta("bench-random", DIM)
    tmp.mkdir(parents=True, exist_ok=True)
    paths = {name: tmp / name for name in names}
    stores = {
        name: EdgeStore(
            paths[name],
            meta,
            batch_size=BATCH,
            quantization=q,
            on_disk=d,
            hnsw_min_unindexed=args.engine_threshold,
        )
        for name, (q, d) in ((name, VARIANTS[name]) for name in names)
    }
    ours = stores[primary]
    raw_path = tmp / "raw"
    shard = raw_shard(raw_path, *VARIANTS[primary], args.engine_threshold)
    ours_s = raw_s = 0.0
    written = 0
    for i, batch in enumerate(points(n, sentences)):
        # Alternate who writes first: the second finds the page cache warm.
        order = [("raw", lambda b: raw_upsert(shard, b)), ("ours", ours.upsert)]
        # (ours flushes at the end of each upsert call, durable when it returns; raw
        # flushes too, so both pay for durability)
        for who, write in order if i % 2 == 0 else order[::-1]:
            started = time.perf_counter()
            write(batch)
            if who == "ours":
                ours_s += time.perf_counter() - started
            else:
                raw_s += time.perf_counter() - started
        for name in names[1:]:
            stores[name].upsert(batch)
        written += len(batch)
        if written % 100_000 == 0:
            print(f"  written {written}/{n}", flush=True)
    result: dict[str, Any] = {
        "chunks": n,
        "stores": names,
        "primary": primary,
        "upsert": {"ours_pps": n / ours_s, "raw_pps": n / raw_s, "ratio": raw_s / ours_s},
    }
    print(f"{n} chunks: upsert ({primary}) ours {n / ours_s:.0f} pts/s, raw {n / raw_s:.0f} "
          f"pts/s, ours/raw {raw_s / ours_s:.2f}", flush=True)  # fmt: skip
    builds: dict[str, Any] = {"raw_s": None}
    if args.raw_build:
        started = time.perf_counter()
        shard.optimize()
        builds["raw_s"] = time.perf_counter() - started
    shard.close()
    shutil.rmtree(raw_path, ignore_errors=True)  # its disk for the stores' builds
    threshold = RagpipeConfig().store.hnsw_min_unindexed
    for name in names:
        print(f"  building the HNSW index of the {name} store …", flush=True)
        built = stores[name].build_index(threshold)  # what the upsert stage runs
        assert built is not None and built.indexed == n, built
        builds[f"{name}_s"] = built.seconds
    builds["ours_s"] = builds[f"{primary}_s"]
    builds["ratio"] = builds["ours_s"] / builds["raw_s"] if builds["raw_s"] else None
    result["hnsw_build"] = builds
    raw_note = f", raw optimize {builds['raw_s']:.1f}s" if builds["raw_s"] else ""
    print("  HNSW build: " + ", ".join(f"{name} {builds[f'{name}_s']:.1f}s" for name in names)
          + raw_note, flush=True)  # fmt: skip
    rng = random.Random(1)
    queries = [(rng.choice(sentences), v) for v in query_vectors(args.queries)]
    vectors = [v for _, v in queries[: args.recall_queries]]
    truth = exact_top10(n, vectors)
    result["recall_at_10"] = {name: recall_at_10(stores[name], vectors, truth) for name in names}
    print("  recall@10 vs exact: " + ", ".join(f"{name} {r:.3f}" for name, r in
          result["recall_at_10"].items()), flush=True)  # fmt: skip
    modes = ["dense", "sparse", "hybrid", "hybrid-rrf-in-engine"]
    result["query"] = {}
    for name in names:
        cfg = RagpipeConfig(store={"path": paths[name]})  # type: ignore[arg-type]
        retriever = Retriever(cfg, embedder=query_bench._NoEmbedder(DIM), store=stores[name])
        measured = modes if name == primary else ["dense", "hybrid"]
        result["query"][name] = measure_rounds(retriever, queries, measured, args.rounds)
        retriever.close()
        for mode in measured:
            r = result["query"][name][mode]
            print(f"  {name:12s} {mode:22s} ours p50 {r['ours']['p50_ms']:.2f} ms p95 "
                  f"{r['ours']['p95_ms']:.2f} ms | raw engine, same store, p50 "
                  f"{r['raw']['p50_ms']:.2f} ms | ours/raw {r['ratio_p50']:.2f}",
                  flush=True)  # fmt: skip
    result["disk_mb"] = {name: du(paths[name]) / 1e6 for name in names}
    save_queries = (tmp / "probe-vectors.npy", tmp / "probe-texts.json")
    probe_rng = random.Random(7)
    np.save(save_queries[0], np.stack(query_vectors(400, seed=7)))
    save_queries[1].write_text(json.dumps([probe_rng.choice(sentences) for _ in range(400)]))
    result["memory"] = {}
    for name in names:
        result["memory"][name] = rss(paths[name], save_queries)
        if args.memory_cap:
            result["memory"][f"{name}_capped"] = rss(paths[name], save_queries, args.memory_cap)
        for key in (name, f"{name}_capped"):
            m = result["memory"].get(key)
            if m is None:
                continue
            if "skipped" in m or "killed" in m:
                why = m.get("skipped") or "killed: its own memory passed the cap"
                print(f"  query process, {key} ({m['cap_mb']} MB cap): {why}", flush=True)
                continue
            cap = f" under a {m['cap_mb']} MB cap" if "cap_mb" in m else ""
            print(f"  query process{cap}, {name}: RSS {m['rss_mb']:.0f} MB (own memory "
                  f"{m['anon_mb']:.0f}, mapped files {m['file_mb']:.0f}; peak "
                  f"{m['peak_rss_mb']:.0f}); hybrid p50 {m['hybrid_p50_ms']:.2f} ms p95 "
                  f"{m['hybrid_p95_ms']:.2f} ms; disk {result['disk_mb'][name]:.0f} MB",
                  flush=True)  # fmt: skip
            parts = sorted(m.get("store_mapped_mb", {}).items(), key=lambda kv: -kv[1])
            print(
                "    its store's mapped files, MB: "
                + ", ".join(f"{part} {mb:.0f}" for part, mb in parts if mb >= 1),
                flush=True,
            )
    save(result)  # the upkeep below may take long at 1M: keep what is measured
    counts = [int(c) for c in args.upkeep.split(",") if c]
    result["upkeep"] = bench_upkeep(paths[primary], n, sentences, queries, counts)
    if args.keep is None:
        for path in paths.values():
            shutil.rmtree(path, ignore_errors=True)
    return result


def measure_rounds(
    retriever: Retriever, queries: list[tuple[str, Any]], modes: list[str], rounds: int
) -> dict[str, Any]:
    """Each mode's p50/p95, ours and raw, as the median over ``rounds`` rounds of every
    query, the order of the modes rotating from round to round, after a warm-up pass of
    every query in every mode: no mode is always first after a cold start or always after
    the same other mode."""
    query_bench.measure(retriever, queries, modes, 10)  # warm-up
    runs = []
    for r in range(rounds):
        order = modes[r % len(modes) :] + modes[: r % len(modes)]
        runs.append(query_bench.measure(retriever, queries, order, 10))
    out: dict[str, Any] = {}
    for mode in modes:
        sides = {
            side: {
                key: statistics.median(run[mode][side][key] for run in runs)
                for key in ("p50_ms", "p95_ms")
            }
            for side in ("ours", "raw")
        }
        out[mode] = {
            **sides,
            "ratio_p50": sides["ours"]["p50_ms"] / sides["raw"]["p50_ms"],
            "settings": runs[0][mode]["settings"],
            "rounds_ours_p50_ms": [run[mode]["ours"]["p50_ms"] for run in runs],
        }
    return out


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
            retriever._candidates(
                text, vector, 10, max(cfg.retrieve.prefetch, 10), cfg.retrieve, None
            )
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

    rows = results["sizes"]
    sizes = [r["chunks"] for r in rows]
    if not sizes:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = {
        "upsert, s (ours)": [r["chunks"] / r["upsert"]["ours_pps"] for r in rows],
        "HNSW build, s": [r["hnsw_build"]["ours_s"] for r in rows],
        "hybrid p50, ms": [r["query"][r["primary"]]["hybrid"]["ours"]["p50_ms"] for r in rows],
        "dense p50, ms": [r["query"][r["primary"]]["dense"]["ours"]["p50_ms"] for r in rows],
        "query RSS, 100 MB": [r["memory"][r["primary"]]["rss_mb"] / 100 for r in rows],
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
    parser.add_argument(
        "--stores",
        default="plain,int8,int8_on_disk",
        help="the stores each size builds, from: " + ", ".join(VARIANTS) + ". The first is "
        "timed against a raw Edge shard created the same way, and its upkeep measured; at 1M "
        "each costs an HNSW build of 4-6 minutes on 2 cores",
    )
    parser.add_argument(
        "--raw-build",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also build the raw shard's HNSW index, for the build ratio (one more build)",
    )
    parser.add_argument(
        "--memory-cap",
        type=int,
        default=1024,
        metavar="MB",
        help="also run each query process inside a memory cgroup of this many MB (needs "
        "root; 0: do not)",
    )
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--recall-queries", type=int, default=100)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of the query measurement, modes rotating (p50: the rounds' median)",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="build the stores in DIR (new or empty) and leave them there, to profile or "
        "query afterwards (default: a temporary directory, removed)",
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "scale.json")
    args = parser.parse_args()
    args.stores = [name for name in args.stores.split(",") if name]
    unknown = [name for name in args.stores if name not in VARIANTS]
    if unknown or not args.stores:
        parser.error(f"--stores: {', '.join(unknown) or 'none given'}; choose from "
                     f"{', '.join(VARIANTS)}")  # fmt: skip
    sizes = [int(s) for s in args.sizes.split(",") if s]
    files = [int(f) for f in args.files.split(",") if f and int(f) > 0]
    threshold = RagpipeConfig().store.hnsw_min_unindexed
    if any(n < threshold for n in sizes):
        parser.error(f"--sizes: each at least {threshold} (store.hnsw_min_unindexed), or "
                     "ingest's upkeep would leave the store unindexed")  # fmt: skip
    # The stores index a segment past a threshold fixed at creation: low enough for the
    # smallest upkeep count, or the engine would not index those points when asked.
    args.engine_threshold = min([threshold, *(int(c) for c in args.upkeep.split(",") if c)])
    sentences = query_bench.sentence_pool()
    results: dict[str, Any] = {"sizes": [], "noop": [], "machine": {"cpus": os.cpu_count()}}
    args.json.parent.mkdir(parents=True, exist_ok=True)

    def save(partial: dict[str, Any] | None = None) -> None:
        # after every size, and within one: a long run that stops keeps what it measured
        done = {**results, "sizes": results["sizes"] + ([partial] if partial else [])}
        args.json.write_text(json.dumps(done, indent=2))
        plot(done, args.json.with_suffix(".svg"))

    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        parser.error(f"--keep: {args.keep} is not empty; name a new or empty directory")
    with contextlib.ExitStack() as scope:
        if args.keep is None:
            tmp = Path(scope.enter_context(tempfile.TemporaryDirectory(prefix="ragpipe-scale-")))
        else:
            tmp = args.keep
            tmp.mkdir(parents=True, exist_ok=True)
        for n in sizes:
            results["sizes"].append(bench_size(n, tmp / str(n), sentences, args, save))
            save()
        for f in files:
            results["noop"].append(bench_noop(f, tmp, args.repeat))
            save()
    if args.keep is not None:
        print(f"the stores are in {args.keep}/<size>/<store>", flush=True)
    print(f"wrote {args.json} and {args.json.with_suffix('.svg')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
