"""Where a default hybrid query's time goes, on a store that bench/scale.py built.

``bench/scale.py --keep DIR`` leaves its stores in DIR/<size>/<store>; this
opens one and times, query by query, every part of ragpipe's default hybrid
search (convex fusion of a dense and a BM25 leg, with the document signal)
beside the raw engine's queries on the same store:

* ``hybrid (ours)``: ``Retriever._candidates``, what a search runs;
* ``dense leg (ours)``: the dense prefetch plus the document signal;
* ``dense prefetch``: the engine's dense query of ``retrieve.prefetch`` with
  payloads, as the leg makes it;
* ``lead query``: the document signal's exact query over the leads of the
  documents among the hits;
* ``sparse leg (ours)``: the BM25 query of ``retrieve.prefetch``, without
  payloads, as the leg makes it (and, to compare, ``sparse leg, payloads``);
* raw engine: a dense and a BM25 query of 10 with payloads, and the
  one-request in-engine RRF;

and derives the rest (the hybrid less its three engine queries): fusion in
Python and fetching, by id, the payloads of kept hits only BM25 found.
The parts run in a shuffled order for each query, so no part always finds the
caches the previous one warmed. The timed queries are new to the store
process: the warm-up runs other queries. ``--cache warm`` (the default)
first reads the store's files once, as a server's page cache holds them after
a while when memory allows; ``--cache cold`` evicts them first, as after a
reboot or a new published copy.

With ``--curve N`` it first runs the default hybrid alone over N queries the
process has never seen, and prints its p50 per 500: a new process is slower
at first (each new query touches memory no query touched before), and the
bench's repeated queries see only the end of that curve.

Usage: python bench/query_parts.py DIR/<size>/<store> [--queries 300] [--warm-up 100]
       [--cache warm|cold] [--curve N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import query as query_bench  # noqa: E402  (bench/query.py: sentences, percentiles)
import scale  # noqa: E402  (bench/scale.py: the query vectors its stores were built for)

from ragpipe.config import RagpipeConfig  # noqa: E402
from ragpipe.query.retrieve import Retriever  # noqa: E402
from ragpipe.store import DENSE, EdgeStore, StoreMeta, Where  # noqa: E402


def read_all(path: Path) -> int:
    """Read every file of the store once, into the page cache; bytes read."""
    total = 0
    for f in path.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                while chunk := fh.read(1 << 24):
                    total += len(chunk)
    return total


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("store", type=Path, help="a store bench/scale.py --keep left")
    parser.add_argument("--queries", type=int, default=300, help="timed queries")
    parser.add_argument("--warm-up", type=int, default=100, help="other queries run first")
    parser.add_argument("--cache", choices=["warm", "cold"], default="warm")
    parser.add_argument(
        "--curve",
        type=int,
        default=0,
        metavar="N",
        help="first, the default hybrid alone over N never-seen queries, its p50 per 500: "
        "how a new process warms up (0: skip)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if not args.store.is_dir() or not any(args.store.iterdir()):
        parser.error(f"store: {args.store} holds no store; run bench/scale.py --keep DIR")
    if args.cache == "warm":
        started = time.perf_counter()
        size = read_all(args.store)
        print(f"read the store's {size / 1e6:.0f} MB into the page cache in "
              f"{time.perf_counter() - started:.1f}s", flush=True)  # fmt: skip
    else:
        scale.evict(args.store)
    store = EdgeStore(args.store, StoreMeta("bench-random", None))
    qe = store._qe
    cfg = RagpipeConfig(store={"path": args.store})  # type: ignore[arg-type]
    retrieve = cfg.retrieve
    retriever = Retriever(cfg, embedder=query_bench._NoEmbedder(scale.DIM), store=store)
    sentences = query_bench.sentence_pool()
    rng = random.Random(11)
    # seed 11: not the queries bench/scale.py timed (seed 1) nor its probe's (seed 7)
    everything = [(rng.choice(sentences), v) for v in
                  scale.query_vectors(args.warm_up + args.queries, seed=11)]  # fmt: skip
    legs = retrieve.prefetch

    def leads_of(vector: Any) -> list[str]:
        hits = store.query_dense(vector, legs)
        own = {str(h.payload["doc_id"]) for h in hits if h.payload.get("chunk_index") == 0}
        return sorted({str(h.payload["doc_id"]) for h in hits} - own)

    def raw(request: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
        return lambda text, vector: store._shard.query(request(text, vector))

    def dense_request(limit: int) -> Callable[[str, Any], Any]:
        return lambda text, vector: qe.QueryRequest(
            limit=limit,
            query=qe.Query.Nearest(vector.tolist(), using=DENSE),
            with_payload=True,
            params=store._dense_params(),
        )

    def rrf(text: str, vector: Any) -> Any:
        dense = qe.Query.Nearest(vector.tolist(), using=DENSE)
        return qe.QueryRequest(
            limit=10,
            prefetches=[
                qe.Prefetch(limit=legs, query=dense, params=store._dense_params()),
                qe.Prefetch(limit=legs, query=store._sparse_query(text)),
            ],
            query=qe.Fusion.Rrf(k=retrieve.rrf_k + 1),
            with_payload=True,
        )

    result: dict[str, Any] = {"store": str(args.store), "cache": args.cache, "parts": {}}
    if args.curve:
        # seed 12: queries that neither the parts below nor bench/scale.py run
        fresh = [(rng.choice(sentences), v) for v in scale.query_vectors(args.curve, seed=12)]
        result["curve_p50_ms"] = curve = []
        times_all = []
        for text, vector in fresh:
            started = time.perf_counter()
            retriever._candidates(text, vector, 10, max(retrieve.prefetch, 10), retrieve, None)
            times_all.append(time.perf_counter() - started)
        for start in range(0, len(times_all), 500):
            curve.append(1000 * statistics.median(times_all[start : start + 500]))
        print("  hybrid alone, never-seen queries, p50 per 500: "
              + ", ".join(f"{ms:.1f}" for ms in curve) + " ms", flush=True)  # fmt: skip
    lead_docs: dict[int, list[str]] = {}

    def lead_query(text: str, vector: Any) -> Any:
        docs = lead_docs[id(vector)]
        where = Where(must={"doc_id": docs, "chunk_index": 0})
        return store.query_dense(vector, len(docs), where, exact=True) if docs else []

    def raw_sparse(text: str, vector: Any) -> Any:
        return qe.QueryRequest(limit=10, query=store._sparse_query(text), with_payload=True)

    parts: dict[str, Callable[[str, Any], Any]] = {
        "hybrid (ours)": lambda t, v: retriever._candidates(
            t, v, 10, max(retrieve.prefetch, 10), retrieve, None
        ),
        "dense leg (ours)": lambda t, v: retriever._dense(v, legs, retrieve, None),
        "dense prefetch": lambda t, v: store.query_dense(v, legs),
        "lead query": lead_query,
        "sparse leg (ours)": lambda t, v: store.query_sparse(t, legs, payload=False),
        "sparse leg, payloads": lambda t, v: store.query_sparse(t, legs),
        "raw dense, 10": raw(dense_request(10)),
        "raw sparse, 10": raw(raw_sparse),
        "raw in-engine RRF": raw(rrf),
    }
    times: dict[str, list[float]] = {name: [] for name in parts}
    # Which leads each query's lead query scores, looked up before any timing: looked up
    # just before its parts, it would warm the dense path for them.
    for _, vector in everything:
        lead_docs[id(vector)] = leads_of(vector)
    for i, (text, vector) in enumerate(everything):
        order = list(parts.items())
        random.Random(i).shuffle(order)
        for name, run in order:
            started = time.perf_counter()
            run(text, vector)
            if i >= args.warm_up:
                times[name].append(time.perf_counter() - started)
    retriever.close()
    for name, xs in times.items():
        result["parts"][name] = query_bench.percentiles(xs)
    p50 = {name: r["p50_ms"] for name, r in result["parts"].items()}
    engine = p50["dense prefetch"] + p50["lead query"] + p50["sparse leg (ours)"]
    result["python_ms"] = p50["hybrid (ours)"] - engine
    for name, r in result["parts"].items():
        print(f"  {name:20s} p50 {r['p50_ms']:6.2f} ms  p95 {r['p95_ms']:6.2f} ms", flush=True)
    print(f"  hybrid less its three engine queries (fusion, payloads by id): "
          f"{result['python_ms']:.2f} ms "
          f"(leads to score per query: median "
          f"{statistics.median(len(d) for d in lead_docs.values())})", flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
