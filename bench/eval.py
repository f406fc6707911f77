"""Evaluation overhead: time in metrics + bootstrap CIs vs time in search, 300 queries.

Indexes the sample corpus (default embedder) and evaluates 300 queries: the
75 R-FAQ dev questions in four phrasings (as written, lower case, without
the question mark, as "Question: ..."), one variant and a two-variant
compare (paired bootstrap + 10,000-permutation test per metric). Target:
metrics + CIs ≤ 0.1 × search time.

Usage: python bench/eval.py [--json OUT]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ragpipe.config import RagpipeConfig  # noqa: E402
from ragpipe.evaluation.golden import GoldenSet, load_golden  # noqa: E402
from ragpipe.evaluation.retrieval import Variant, run_retrieval_eval  # noqa: E402
from ragpipe.ingest.pipeline import run_ingest  # noqa: E402
from ragpipe.query.retrieve import Retriever  # noqa: E402

PHRASINGS = {
    "": lambda q: q,
    "-lower": str.lower,
    "-noq": lambda q: q.rstrip("?"),
    "-prefixed": lambda q: f"Question: {q}",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "eval.json")
    args = parser.parse_args()
    dev = load_golden(REPO / "eval" / "golden" / "r-faq-dev.yaml")
    items = [
        dataclasses.replace(item, id=item.id + suffix, query=phrase(item.query))
        for suffix, phrase in PHRASINGS.items()
        for item in dev.items
    ]
    golden = GoldenSet("bench-300", items)
    results = {}
    with tempfile.TemporaryDirectory(prefix="ragpipe-bench-eval-") as tmp:
        cfg = RagpipeConfig(
            discover={"roots": [REPO / "data" / "sample"]},  # type: ignore[arg-type]
            store={"path": Path(tmp) / "store"},  # type: ignore[arg-type]
            paths={"work_dir": Path(tmp) / "work"},  # type: ignore[arg-type]
        )
        run_ingest(cfg)
        with Retriever(cfg) as retriever:
            retriever.search("warm up")
            for label, variants in {
                "retrieval": [Variant("hybrid")],
                "compare": [Variant("dense", {"mode": "dense"}), Variant("hybrid")],
            }.items():
                result = run_retrieval_eval(cfg, golden, variants, retriever=retriever)
                ratio = result.stats_seconds / result.search_seconds
                results[label] = {
                    "queries": len(items),
                    "variants": len(variants),
                    "search_s": result.search_seconds,
                    "metrics_and_ci_s": result.stats_seconds,
                    "ratio": ratio,
                }
                print(
                    f"{label}: {len(items)} queries x {len(variants)} variant(s): search "
                    f"{result.search_seconds:.2f}s, metrics + CIs {result.stats_seconds:.3f}s, "
                    f"ratio {ratio:.3f} (target <= 0.1)",
                    flush=True,
                )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
