"""Recall@10 and latency of an int8 store's dense search by rescoring oversampling.

An int8 store's HNSW search takes ``oversampling`` times the asked-for candidates
by their int8 scores, then rescores them with the full vectors (ragpipe's
``INT8_OVERSAMPLING``). This bench runs the raw engine on a store that
``bench/scale.py --keep DIR`` left behind (DIR/<size>/int8 or int8_on_disk),
with each oversampling in turn, on the bench's own queries, against the true
top 10 computed in numpy over the same vectors. It prints recall@10 and p50 of
a search of 10 and of a prefetch of 40 with payloads, per oversampling, after
50 warm-up queries each; list one value twice to see the page cache's share.

Usage: python bench/int8_recall.py DIR/1000000/int8_on_disk [--queries 300]
       [--oversampling 3,2,3,4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scale

from ragpipe.store import EdgeStore, StoreMeta
from ragpipe.store.base import DENSE


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("store", type=Path, help="an int8 store kept by bench/scale.py --keep")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--oversampling", default="3,2,3,4")
    args = parser.parse_args()
    if not (args.store / "ragpipe-store.json").is_file():
        parser.error(f"{args.store}: not a ragpipe store (no ragpipe-store.json)")
    store = EdgeStore(args.store, StoreMeta("bench-random", None))
    points = int(store._shard.info().points_count)
    if store.quantization.value != "int8":
        store.close()
        parser.error(f"{args.store}: not an int8 store")
    import qdrant_edge as qe

    queries = scale.query_vectors(args.queries)  # the bench's, seed 1
    # bench/scale.py keeps DIR/<n>/<store>, and its upkeep may add points after the first n:
    # the truth is over the first n.
    if not args.store.parent.name.isdigit() or int(args.store.parent.name) > points:
        parser.error(f"{args.store}: not a store kept by bench/scale.py (DIR/<size>/<store>)")
    n = int(args.store.parent.name)
    print(f"{args.store}: {points} points; true top 10 over the first {n} (numpy)", flush=True)
    truth = scale.exact_top10(n, queries)
    shard = store._shard
    for over in (float(x) for x in args.oversampling.split(",")):
        params = qe.SearchParams(
            quantization=qe.QuantizationSearchParams(rescore=True, oversampling=over)
        )

        def search(vector: object, limit: int, payload: bool, params: object = params) -> list[str]:
            nearest = qe.Query.Nearest(vector.tolist(), using=DENSE)  # type: ignore[attr-defined]
            request = qe.QueryRequest(
                limit=limit, query=nearest, params=params, with_payload=payload
            )
            return [str(p.id) for p in shard.query(request)]

        for vector in queries[:50]:
            search(vector, 40, True)
        found, ten, forty = [], [], []
        for vector, best in zip(queries, truth, strict=True):
            started = time.perf_counter()
            hits = search(vector, 10, False)
            ten.append(time.perf_counter() - started)
            found.append(len(best & set(hits)) / 10)
            started = time.perf_counter()
            search(vector, 40, True)
            forty.append(time.perf_counter() - started)
        print(
            f"  oversampling {over:g}: recall@10 {statistics.mean(found):.3f}; p50 "
            f"{1000 * statistics.median(ten):.2f} ms (10), "
            f"{1000 * statistics.median(forty):.2f} ms (40 with payloads)",
            flush=True,
        )
    store.close()


if __name__ == "__main__":
    main()
