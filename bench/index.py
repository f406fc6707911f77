"""Benchmark the second half of ingest against the raw engines, in one run.

1. Embed stage (``run_embed``: token counting, prefix fitting, length-sorted
   batches, Parquet parts) vs raw ``SentenceTransformer.encode`` of the same
   texts with the same batch size. Target ratio ≥ 0.9.
2. Upsert stage (``run_upsert``: reading checkpoints, building payloads and
   BM25 sparse vectors, batched upserts, stale-version deletes, flush) vs a
   raw Qdrant Edge upsert of the same, pre-built points. Target ≥ 0.8.
3. No-op re-index of N unchanged files (library, then the Prefect flow) vs
   just hashing them. Target ≤ 3× plus Prefect's fixed start-up.
4. Qdrant Edge vs qdrant-client local mode on the same points: upsert
   points/s, dense and hybrid query latency.

Ratios are throughput(ours) / throughput(raw), medians of interleaved
repeats: these machines are noisy, absolute times are not stable.

Usage: python bench/index.py [--repeat 3] [--files 2000] [--json OUT]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from ragpipe import checkpoint  # noqa: E402
from ragpipe.config import RagpipeConfig  # noqa: E402
from ragpipe.ingest.chunk import ChunkCounts  # noqa: E402
from ragpipe.ingest.embed import (  # noqa: E402
    EmbedCounts,
    EmbeddingRow,
    embeddings_table,
    read_embeddings,
    run_embed,
)
from ragpipe.ingest.pipeline import run_ingest, run_stages  # noqa: E402
from ragpipe.ingest.plan import index_fingerprint, point_id  # noqa: E402
from ragpipe.ingest.runner import StageSummary, WorkDir  # noqa: E402
from ragpipe.ingest.upsert import build_points, run_upsert  # noqa: E402
from ragpipe.models.embedders import LocalEmbedder, contextual_text  # noqa: E402
from ragpipe.schemas import Chunk, PlanEntry  # noqa: E402
from ragpipe.store import DENSE, SPARSE, IndexPoint  # noqa: E402


def _timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def prepare_chunks(work: Path, corpus: Path) -> RagpipeConfig:
    """Run discover → chunk once on ``corpus``; the stages below start from here."""
    cfg = RagpipeConfig(
        discover={"roots": [corpus]},  # type: ignore[arg-type]
        store={"path": work / "store"},  # type: ignore[arg-type]
        paths={"work_dir": work / "work"},  # type: ignore[arg-type]
    )
    run_stages(cfg, until="chunk")
    return cfg


def bench_embed(cfg: RagpipeConfig, repeat: int) -> dict[str, Any]:
    chunks = checkpoint.read_records(WorkDir.of(cfg).chunks, Chunk)
    chunked = StageSummary("chunk", "bench", ChunkCounts())
    embedder = LocalEmbedder(batch_size=cfg.embed.batch_size)
    # The raw side gets the texts ready-made (contextual prefix already applied).
    texts = [contextual_text(c.heading_path, c.text) for c in chunks]
    model = embedder._model
    model.encode(texts[:64], batch_size=cfg.embed.batch_size)  # warm-up

    def ours() -> None:
        shutil.rmtree(cfg.paths.work_dir / "embed", ignore_errors=True)
        run_embed(cfg, chunked)

    def raw() -> None:
        model.encode(texts, batch_size=cfg.embed.batch_size, normalize_embeddings=True)

    ours_s, raw_s = [], []
    for _ in range(repeat):
        raw_s.append(_timed(raw))
        ours_s.append(_timed(ours))
    n = len(chunks)
    return {
        "chunks": n,
        "batch_size": cfg.embed.batch_size,
        "raw_chunks_per_s": n / statistics.median(raw_s),
        "ours_chunks_per_s": n / statistics.median(ours_s),
        "ratio": statistics.median(raw_s) / statistics.median(ours_s),
    }


def synthetic_upsert_input(cfg: RagpipeConfig, copies: int) -> int:
    """Multiply the embedded chunks into ``copies`` fake files each (same vectors)."""
    chunks = checkpoint.read_records(WorkDir.of(cfg).chunks, Chunk)
    embedded = read_embeddings(cfg.paths.work_dir / "embed" / "embeddings.parquet")
    index_fp = index_fingerprint(cfg)
    many: list[Chunk] = []
    rows = []
    for copy in range(copies):
        for c in chunks:
            path = f"copy{copy:03d}/{c.file_path}"
            cid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{path}|{c.chunk_index}"))
            many.append(Chunk(**{**c.__dict__, "chunk_id": cid, "file_path": path}))
            pid = point_id(path, c.source_sha256, index_fp, c.chunk_index)
            e = embedded[c.chunk_id]
            rows.append(
                EmbeddingRow(cid, pid, e.prefix, e.vector, e.sparse_indices, e.sparse_values)
            )
    checkpoint.write_records(WorkDir.of(cfg).chunks, many, Chunk)
    checkpoint.write_table(
        cfg.paths.work_dir / "embed" / "embeddings.parquet",
        embeddings_table(rows, len(rows[0].vector), index_fp),
    )
    files = sorted({(c.file_path, c.source_sha256) for c in many})
    plan = [PlanEntry(path, "added", sha, 0) for path, sha in files]  # a first ingest
    checkpoint.write_records(cfg.paths.work_dir / "plan" / "plan.parquet", plan, PlanEntry)
    return len(many)


def stored_points(cfg: RagpipeConfig, limit: int | None = None) -> list[IndexPoint]:
    """The exact points run_upsert writes (vectors, BM25 weights, payloads)."""
    chunks = checkpoint.read_records(WorkDir.of(cfg).chunks, Chunk)
    embedded = read_embeddings(cfg.paths.work_dir / "embed" / "embeddings.parquet")
    return build_points(chunks[:limit], embedded, index_fingerprint(cfg))


def bench_upsert(cfg: RagpipeConfig, repeat: int) -> dict[str, Any]:
    """Ours: the whole stage from its checkpoints. Raw: the engine given the same data.

    The raw side starts from the finished vectors, BM25 weights and payloads in
    memory and does what the engine needs: build Points, create a shard with
    the same vectors and payload indexes, upsert in the same batches, flush.
    """
    import qdrant_edge as qe

    from ragpipe.store import KEYWORD_FIELDS

    data = stored_points(cfg)
    dim = len(data[0].dense)
    embedded = StageSummary("embed", "bench", EmbedCounts())
    store_dir = cfg.store.path

    def ours() -> None:
        shutil.rmtree(store_dir, ignore_errors=True)
        run_upsert(cfg, embedded)

    def raw() -> None:
        path = store_dir.parent / "raw-edge"
        shutil.rmtree(path, ignore_errors=True)
        config = qe.EdgeConfig(
            vectors={DENSE: qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine)},
            sparse_vectors={SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
        )
        shard = qe.EdgeShard.create(str(path), config)
        for name in KEYWORD_FIELDS:
            shard.update(qe.UpdateOperation.create_field_index(name, qe.PayloadSchemaType.Keyword))
        text_index = qe.TextIndexParams(tokenizer=qe.TokenizerType.Word, lowercase=True)
        shard.update(qe.UpdateOperation.create_field_index("text", text_index))
        size = cfg.store.batch_size
        for start in range(0, len(data), size):
            batch = [
                qe.Point(
                    uuid.UUID(p.point_id),
                    {
                        DENSE: p.dense.tolist(),
                        SPARSE: qe.SparseVector(p.sparse_indices, p.sparse_values),
                    },
                    p.payload,
                )
                for p in data[start : start + size]
            ]
            shard.update(qe.UpdateOperation.upsert_points(batch))
        shard.flush()
        shard.close()

    ours_s, raw_s = [], []
    for _ in range(repeat):
        raw_s.append(_timed(raw))
        ours_s.append(_timed(ours))
    n = len(data)
    return {
        "points": n,
        "raw_points_per_s": n / statistics.median(raw_s),
        "ours_points_per_s": n / statistics.median(ours_s),
        "ratio": statistics.median(raw_s) / statistics.median(ours_s),
    }


def bench_backends(cfg: RagpipeConfig, n_points: int, queries: int) -> dict[str, Any]:
    """Edge vs qdrant-client local mode: the same points, the same queries."""
    from ragpipe.config import StoreConfig
    from ragpipe.store import open_store

    points = stored_points(cfg, n_points)
    dim = len(points[0].dense)
    rng = np.random.default_rng(7)
    picks = rng.choice(len(points), size=min(queries, len(points)), replace=False)
    out: dict[str, Any] = {"points": len(points), "queries": len(picks)}
    for backend in ("edge", "qdrant"):
        store_cfg = StoreConfig(backend=backend, path=cfg.store.path.parent / f"cmp-{backend}")  # type: ignore[arg-type]
        shutil.rmtree(store_cfg.path, ignore_errors=True)
        store = open_store(store_cfg, "bench", dim)
        assert store is not None
        upsert_s = _timed(lambda s=store: s.upsert(points))
        dense_s = _timed(lambda s=store: [s.query_dense(points[i].dense, 10) for i in picks])
        hybrid_s = _timed(
            lambda s=store: [
                s.query_hybrid(points[i].dense, points[i].payload["text"][:80], 10, 50)
                for i in picks
            ]
        )
        store.close()
        out[backend] = {
            "upsert_points_per_s": len(points) / upsert_s,
            "dense_ms": 1000 * dense_s / len(picks),
            "hybrid_ms": 1000 * hybrid_s / len(picks),
        }
    out["upsert_speedup_edge_vs_local"] = (
        out["edge"]["upsert_points_per_s"] / out["qdrant"]["upsert_points_per_s"]
    )
    return out


def _cached_tasks(flow_state: Any) -> list[str]:
    """The tasks of a flow run that finished Cached."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    flow_run = FlowRunFilter(id=FlowRunFilterId(any_=[flow_state.state_details.flow_run_id]))
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=flow_run)
    return sorted(r.name.rsplit("-", 1)[0] for r in runs if r.state and r.state.name == "Cached")


def bench_noop(tmp: Path, n_files: int, repeat: int) -> dict[str, Any]:
    corpus = tmp / "many"
    corpus.mkdir()
    for i in range(n_files):
        (corpus / f"note-{i:05d}.md").write_text(
            f"# Note {i}\n\nShort note number {i} about topic {i % 37}.\n", encoding="utf-8"
        )
    cfg = RagpipeConfig(
        discover={"roots": [corpus]},  # type: ignore[arg-type]
        embed={"provider": "onnx", "batch_size": 64},  # type: ignore[arg-type]
        store={"path": tmp / "noop-store"},  # type: ignore[arg-type]
        paths={"work_dir": tmp / "noop-work"},  # type: ignore[arg-type]
    )
    started = time.perf_counter()
    first = run_ingest(cfg)
    initial_s = time.perf_counter() - started

    def hash_only() -> None:  # what any re-indexer must do: find the files and hash them
        for dirpath, _, names in os.walk(corpus):
            for name in names:
                with open(os.path.join(dirpath, name), "rb") as fh:
                    hashlib.file_digest(fh, "sha256").hexdigest()

    def noop() -> None:
        summary = run_ingest(cfg)
        assert summary.chunks_written == 0 and summary.skipped_unchanged == n_files

    from flows.ingest import ingest_flow

    cached: list[list[str]] = []

    def flow_noop() -> None:
        state = ingest_flow(config=cfg, return_state=True)
        summary = state.result()
        assert summary.chunks_written == 0
        cached.append(_cached_tasks(state))

    flow_first = _timed(flow_noop)  # starts the ephemeral Prefect server
    hash_s, noop_s, flow_s = [], [], []
    for _ in range(repeat):
        hash_s.append(_timed(hash_only))
        noop_s.append(_timed(noop))
        flow_s.append(_timed(flow_noop))
    h, n, f = (statistics.median(x) for x in (hash_s, noop_s, flow_s))
    return {
        "cached_stage_tasks_per_flow_run": [len(c) for c in cached],
        "cached_stage_tasks_last_run": cached[-1],
        "files": n_files,
        "initial_index_s": initial_s,
        "initial_points": first.points_total,
        "hash_s": h,
        "noop_library_s": n,
        "noop_flow_s": f,
        "noop_flow_first_s": flow_first,
        "ratio_library_vs_hash": n / h,
        "prefect_overhead_s": f - n,
    }


def _print_noop(n: dict[str, Any]) -> None:
    print(
        f"no-op re-index of {n['files']} unchanged files: walk + hash {n['hash_s']:.3f}s, "
        f"library {n['noop_library_s']:.3f}s ({n['ratio_library_vs_hash']:.1f}x hashing, "
        f"target <= 3x), Prefect flow {n['noop_flow_s']:.2f}s "
        f"({n['noop_flow_s'] / n['hash_s']:.1f}x hashing; Prefect's share "
        f"{n['prefect_overhead_s']:.2f}s; first flow run {n['noop_flow_first_s']:.1f}s incl. "
        "server start)",
        flush=True,
    )
    print(
        "stage tasks Cached per flow run (the first re-checks the store the initial index "
        f"wrote): {n['cached_stage_tasks_per_flow_run']}; last run: "
        f"{', '.join(n['cached_stage_tasks_last_run'])}",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=REPO / "data" / "sample")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--copies", type=int, default=20, help="upsert: fake files per chunk")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "index.json")
    parser.add_argument("--only", choices=["all", "noop"], default="all",
                        help="noop: only part 3 (the no-op re-index)")  # fmt: skip
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ragpipe-bench-") as tmp_name:
        tmp = Path(tmp_name)
        if args.only == "noop":
            results["noop"] = bench_noop(tmp, args.files, max(args.repeat, 7))
            _print_noop(results["noop"])
            args.json = args.json.with_name(args.json.stem + "-noop.json")
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=2))
            print(f"wrote {args.json}")
            return 0
        cfg = prepare_chunks(tmp, args.corpus)
        results["embed"] = bench_embed(cfg, args.repeat)
        e = results["embed"]
        print(
            f"embed: {e['chunks']} chunks, batch {e['batch_size']}: "
            f"ours {e['ours_chunks_per_s']:.1f} "
            f"chunks/s, raw encode {e['raw_chunks_per_s']:.1f} chunks/s, ratio {e['ratio']:.2f} "
            "(target >= 0.9)",
            flush=True,
        )
        results["backends"] = bench_backends(cfg, 200, 30)
        b = results["backends"]
        for name in ("edge", "qdrant"):
            r = b[name]
            print(
                f"{name}: upsert {r['upsert_points_per_s']:.0f} points/s, dense "
                f"{r['dense_ms']:.2f} ms, hybrid {r['hybrid_ms']:.2f} ms per query "
                f"({b['points']} points)",
                flush=True,
            )
        print(f"edge vs qdrant-client local upsert: {b['upsert_speedup_edge_vs_local']:.1f}x")
        results["upsert"] = {"copies": args.copies}
        synthetic_upsert_input(cfg, args.copies)
        results["upsert"].update(bench_upsert(cfg, max(args.repeat, 5)))
        u = results["upsert"]
        print(
            f"upsert: {u['points']} points: ours {u['ours_points_per_s']:.0f} points/s, raw Edge "
            f"{u['raw_points_per_s']:.0f} points/s, ratio {u['ratio']:.2f} (target >= 0.8)",
            flush=True,
        )
        results["noop"] = bench_noop(tmp, args.files, max(args.repeat, 7))
        _print_noop(results["noop"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
