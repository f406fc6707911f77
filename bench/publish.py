"""What publishing an Edge index costs, against the raw copy it is made of, in one run.

A store of N random points (384 dimensions, BM25 text, HNSW built) is written once;
then, R times each, alternating:

* raw: ``cp -R --reflink=auto --sparse=always`` of the shard into a new folder (what
  any publish must do, and all it did before versions were synced);
* publish: ``published._materialize``: the same copy, every file and folder of it
  fsynced (a power cut cannot leave ``CURRENT`` naming files that were never written),
  each file's size recorded, the version file written and the folder renamed in.

Printed: each path's median seconds and the ratio publish / raw. On a file system that
reflinks, the copy shares blocks and syncing costs little; elsewhere the sync writes
the copy to the disk, which the kernel would do anyway within seconds.

Usage: python bench/publish.py [--points N] [--repeats R] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from ragpipe.config import StoreConfig  # noqa: E402
from ragpipe.store import IndexPoint, SparseEncoder, open_store, published  # noqa: E402

DIM = 384
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "engine",
    "wing",
    "river",
    "stone",
    "garden",
    "bread",
    "oven",
    "yeast",
]


def build(path: Path, n: int) -> None:
    store = open_store(StoreConfig(path=path), "bench-random", DIM)
    assert store is not None
    rng = np.random.default_rng(0)
    sparse = SparseEncoder()
    for start in range(0, n, 2000):
        points = []
        for i in range(start, min(n, start + 2000)):
            vector = rng.normal(size=DIM).astype(np.float32)
            text = " ".join(rng.choice(WORDS, 12))
            indices, values = sparse.document(text)
            payload = {"text": text, "file_path": f"f{i // 10}.md", "source_sha": "s",
                       "config_fingerprint": "f", "chunk_index": i % 10, "chunk_total": 10,
                       "heading_path": []}  # fmt: skip
            points.append(IndexPoint(str(uuid.UUID(int=i + 1)), vector / np.linalg.norm(vector),
                                     indices, values, payload))  # fmt: skip
        store.upsert(points)
    store.close()


def raw_copy(source: Path, target: Path) -> None:
    cp = ["cp", "-R", "--reflink=auto", "--sparse=always", str(source), str(target)]
    subprocess.run(cp, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=REPO / "bench") as tmp:
        root = Path(tmp)
        store = root / "store"
        started = time.perf_counter()
        build(store, args.points)
        size = sum(p.stat().st_size for p in store.rglob("*") if p.is_file())
        print(f"store: {args.points} points, {size / 1e6:.1f} MB, built in "
              f"{time.perf_counter() - started:.1f} s")  # fmt: skip
        raw: list[float] = []
        synced: list[float] = []
        for i in range(args.repeats):
            target = root / f"raw-{i}"
            started = time.perf_counter()
            raw_copy(store, target)
            raw.append(time.perf_counter() - started)
            shutil.rmtree(target)
            generation = f"g{i:04d}"
            started = time.perf_counter()
            published._materialize(store, generation, args.points, args.points // 10, "f")
            synced.append(time.perf_counter() - started)
            shutil.rmtree(published.root(store) / generation)
        result = {
            "points": args.points,
            "megabytes": round(size / 1e6, 1),
            "raw_copy_s": round(statistics.median(raw), 4),
            "publish_s": round(statistics.median(synced), 4),
        }
        result["ratio"] = round(result["publish_s"] / result["raw_copy_s"], 2)
        print(f"raw cp: {result['raw_copy_s']:.3f} s   publish (copy + fsync + records): "
              f"{result['publish_s']:.3f} s   ratio {result['ratio']:.2f}x")  # fmt: skip
        if args.json:
            args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
