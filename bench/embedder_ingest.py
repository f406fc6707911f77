"""Ingest of the sample corpus with the default embedder (all-MiniLM-L6-v2) and the quality
profile's (all-mpnet-base-v2), each into a fresh index, per-stage seconds.

Conversion runs first once (untimed), so both timed runs find the same warm caches of the
operating system and of Docling's imports; the comparison is the embed stage's seconds.

Results: bench/results/embedder_sample_ingest.json.

Usage: python bench/embedder_ingest.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

PROFILES = {
    "all-MiniLM-L6-v2": {},
    "all-mpnet-base-v2": {
        "embed": {"model": "all-mpnet-base-v2"},
        "chunk": {"tokenizer": "all-mpnet-base-v2", "max_tokens": 384},
    },
}


def main() -> None:
    from ragpipe.config import RagpipeConfig
    from ragpipe.ingest.pipeline import run_ingest

    def config(home: Path, extra: dict[str, dict[str, object]]) -> RagpipeConfig:
        return RagpipeConfig.model_validate({
            "discover": {"roots": [str(REPO / "data" / "sample")]},
            "store": {"path": str(home / "store")},
            "paths": {"work_dir": str(home / "work")},
            **extra,
        })  # fmt: skip

    with tempfile.TemporaryDirectory() as warm:
        run_ingest(config(Path(warm), {}))  # warm-up, untimed
    out = {}
    for name, extra in PROFILES.items():
        with tempfile.TemporaryDirectory() as home:
            started = time.perf_counter()
            summary = run_ingest(config(Path(home), extra))
            total = time.perf_counter() - started
        out[name] = {
            "total_s": round(total, 1),
            "stages_s": {k: round(v, 1) for k, v in summary.seconds.items()},
            "chunks": summary.chunks,
        }
        print(name, json.dumps(out[name]), flush=True)
    ratio = (
        out["all-mpnet-base-v2"]["stages_s"]["embed"] / out["all-MiniLM-L6-v2"]["stages_s"]["embed"]
    )
    out["embed_ratio"] = round(ratio, 1)
    print(f"embed stage: mpnet / MiniLM = {ratio:.1f}")
    path = REPO / "bench" / "results" / "embedder_sample_ingest.json"
    path.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
