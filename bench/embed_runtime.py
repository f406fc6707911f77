"""The ingest side's embedding runtime: sentence-transformers (torch) vs the same model's
verified ONNX graph (onnxruntime) on batches of real chunks, in one run (issue 34).

Indexes nothing: chunks the sample corpus (``data/sample``) once under ``--work``
(default bench/.cache/embed_runtime), then embeds every chunk text, in the ingest's
batches (``embed.batch_size``, 32), with each runtime in turn, ``--rounds`` times
interleaved; prints chunks/s (median round) and the ratio to torch, and the lowest
cosine between the runtimes' vectors. onnxruntime runs with 1 and with 2 intra-op
threads (the query side uses 1). Results: bench/results/embed_runtime.json.

Usage: python bench/embed_runtime.py [--work DIR] [--rounds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from ragpipe.config import RagpipeConfig  # noqa: E402
from ragpipe.ingest.pipeline import run_ingest  # noqa: E402
from ragpipe.models.embedders import LocalEmbedder, _packaged_minilm  # noqa: E402
from ragpipe.models.onnx_query import OnnxQueryEmbedder, export, verified_graph  # noqa: E402


def chunk_texts(work: Path) -> list[str]:
    chunks = work / "work" / "chunk" / "chunks.parquet"
    if not chunks.exists():
        config = {
            "discover": {"roots": [str(REPO / "data" / "sample")]},
            "store": {"path": str(work / "store")},
            "paths": {"work_dir": str(work / "work")},
        }
        print(run_ingest(RagpipeConfig.model_validate(config)).line(), flush=True)
    return [str(t) for t in pq.read_table(chunks, columns=["text"]).column("text").to_pylist()]


def onnx_embedder(threads: int) -> OnnxQueryEmbedder:
    import onnxruntime as ort

    model_dir = _packaged_minilm()
    graph, verdict = verified_graph(model_dir)
    if graph is None:
        export(model_dir)
        graph, verdict = verified_graph(model_dir)
    if graph is None:
        raise SystemExit(f"no verified ONNX graph: {verdict}")
    embedder = OnnxQueryEmbedder(model_dir, graph, "all-MiniLM-L6-v2")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    embedder._session = ort.InferenceSession(
        str(graph), options, providers=["CPUExecutionProvider"]
    )
    return embedder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=REPO / "bench" / ".cache" / "embed_runtime")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--json", type=Path, default=REPO / "bench" / "results" / "embed_runtime.json"
    )
    args = parser.parse_args()
    texts = chunk_texts(args.work.resolve())
    runtimes: dict[str, Any] = {
        "torch (sentence-transformers)": LocalEmbedder(batch_size=32),
        "onnxruntime, 1 thread": onnx_embedder(1),
        "onnxruntime, 2 threads": onnx_embedder(2),
    }
    for embedder in runtimes.values():  # warm up: first calls allocate
        embedder.embed_documents(texts[:64])
    seconds: dict[str, list[float]] = {name: [] for name in runtimes}
    vectors: dict[str, Any] = {}
    for _ in range(args.rounds):
        for name, embedder in runtimes.items():
            started = time.perf_counter()
            vectors[name] = embedder.embed_documents(texts)
            seconds[name].append(time.perf_counter() - started)
    reference = vectors["torch (sentence-transformers)"]
    torch_rate = len(texts) / statistics.median(seconds["torch (sentence-transformers)"])
    results: dict[str, Any] = {"chunks": len(texts), "rounds": args.rounds, "runtimes": {}}
    print(f"\n{len(texts)} sample chunks, batches of 32, median of {args.rounds} rounds")
    print(f"{'runtime':32s} {'chunks/s':>9s} {'÷ torch':>8s} {'min cosine vs torch':>20s}")
    for name in runtimes:
        rate = len(texts) / statistics.median(seconds[name])
        cosine = float(np.min(np.sum(vectors[name] * reference, axis=1)))
        results["runtimes"][name] = {
            "chunks_per_s": rate,
            "ratio_to_torch": rate / torch_rate,
            "min_cosine": cosine,
        }
        print(f"{name:32s} {rate:9.1f} {rate / torch_rate:8.2f} {cosine:20.6f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
