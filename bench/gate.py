"""What the index gate costs a nightly, on both stores, in one run.

For each store (Qdrant Edge; qdrant-client's local mode standing in for a Qdrant
server: a collection per version behind an alias) the shipped sample corpus is
indexed twice side by side, with and without ``index.gate`` (the R-FAQ dev set,
75 items); then one Markdown file changes and each index runs its nightly.
Printed: each nightly's time and the ratio gated / ungated, and for the qdrant
backend the staging copy (every point with its vectors into the version's
collection) against a raw qdrant-client scroll + upsert copy of the same
collection, timed in the same run.

The test embedder (paraphrase-MiniLM-L3-v2, ONNX) keeps it short; the gate's
cost is retrieval and copying, not embedding.

Usage: python bench/gate.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ragpipe.config import RagpipeConfig  # noqa: E402
from ragpipe.ingest.pipeline import run_ingest  # noqa: E402

GOLDEN = REPO / "eval" / "golden" / "r-faq-dev.yaml"


def _config(corpus: Path, root: Path, backend: str, gated: bool) -> RagpipeConfig:
    data: dict[str, Any] = {
        "discover": {"roots": [corpus]},
        "embed": {"provider": "onnx"},
        "store": {"backend": backend, "path": root / "store"},
        "paths": {"work_dir": root / "work"},
    }
    if gated:
        data["index"] = {"gate": {"golden": [GOLDEN], "max_drop": 0.05}}
    return RagpipeConfig(**data)


def _timed(cfg: RagpipeConfig) -> tuple[float, Any]:
    started = time.perf_counter()
    summary = run_ingest(cfg)
    return time.perf_counter() - started, summary


def _raw_copy(cfg: RagpipeConfig, source: str) -> float:
    """qdrant-client alone: scroll a collection with its vectors, upsert into a new one."""
    from qdrant_client import QdrantClient
    from qdrant_client.http import models as qm

    client = QdrantClient(path=str(cfg.store.path))
    try:
        info = client.get_collection(source)
        target = "raw-copy"
        started = time.perf_counter()
        client.create_collection(
            target,
            vectors_config=info.config.params.vectors,
            sparse_vectors_config=info.config.params.sparse_vectors,
        )
        offset: Any = None
        while True:
            records, offset = client.scroll(source, limit=cfg.store.batch_size, offset=offset,
                                            with_payload=True, with_vectors=True)  # fmt: skip
            points = [
                qm.PointStruct(id=r.id, vector=cast(Any, r.vector or {}), payload=r.payload)
                for r in records
            ]
            if points:
                client.upsert(target, points)
            if offset is None:
                break
        seconds = time.perf_counter() - started
        client.delete_collection(target)
        return seconds
    finally:
        client.close()


def bench(tmp: Path, backend: str) -> dict[str, Any]:
    corpus = tmp / backend / "corpus"
    shutil.copytree(REPO / "data" / "sample", corpus)
    gated = _config(corpus, tmp / backend / "gated", backend, True)
    plain = _config(corpus, tmp / backend / "plain", backend, False)
    first_gated, summary = _timed(gated)
    assert summary.gate["outcome"] == "promoted", summary.gate
    first_plain, _ = _timed(plain)
    note = corpus / "amt_handbook_sample.md"
    note.write_text(note.read_text(encoding="utf-8") + "\n\nA paragraph added tonight.\n",
                    encoding="utf-8")  # fmt: skip
    nightly_gated, summary = _timed(gated)
    assert summary.gate["outcome"] == "promoted", summary.gate
    nightly_plain, _ = _timed(plain)
    out = {
        "points": summary.points_total,
        "first_gated_s": first_gated,
        "first_plain_s": first_plain,
        "nightly_gated_s": nightly_gated,
        "nightly_plain_s": nightly_plain,
        "nightly_ratio": nightly_gated / nightly_plain,
    }
    if backend == "qdrant":
        from ragpipe.store import server_versions

        (live,) = [v for v in server_versions.list_versions(gated.store) if v.live]
        out["stage_copy_s"] = _stage_seconds(gated, live.generation)
        out["raw_copy_s"] = _raw_copy(gated, server_versions.working_collection(gated.store))
        out["copy_ratio"] = out["stage_copy_s"] / out["raw_copy_s"]
    return out


def _stage_seconds(cfg: RagpipeConfig, generation: str) -> float:
    from ragpipe.store import server_versions

    with server_versions._client(cfg.store) as client:
        version = server_versions._version(client, cfg.store, generation)
    assert version is not None
    return version.publish_seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)  # fmt: skip
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "gate.json")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ragpipe-bench-gate-") as name:
        for backend in ("edge", "qdrant"):
            r = results[backend] = bench(Path(name), backend)
            print(
                f"{backend}: {r['points']} points; first version gated {r['first_gated_s']:.1f}s "
                f"vs ungated {r['first_plain_s']:.1f}s; nightly with one changed file gated "
                f"{r['nightly_gated_s']:.1f}s vs ungated {r['nightly_plain_s']:.1f}s "
                f"(ratio {r['nightly_ratio']:.2f})",
                flush=True,
            )
            if backend == "qdrant":
                print(
                    f"qdrant: staging the version (copy of {r['points']} points) "
                    f"{r['stage_copy_s']:.2f}s vs raw qdrant-client scroll + upsert "
                    f"{r['raw_copy_s']:.2f}s (ratio {r['copy_ratio']:.2f})",
                    flush=True,
                )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
