"""Which retrieval mode to ship by default: a measurement, not a habit.

Indexes the sample corpus (``data/sample``, default embedder) and asks the
R FAQ's own numbered questions (the section headings found in R-FAQ.pdf,
number stripped). A question's relevant chunks are the chunks under its own
section. Prints, per retrieval configuration, Hit@1, Success@5 and MRR@10
over all questions (a question with no relevant chunk retrieved scores 0).

Caveat: each question stands verbatim in the PDF as its heading, so this set
favours lexical matching. The eval issue's compare flow over the full R
manuals and other golden sets supersedes these numbers.

Usage: python bench/modes.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ragpipe.config import RagpipeConfig  # noqa: E402
from ragpipe.ingest.pipeline import run_ingest  # noqa: E402
from ragpipe.query.retrieve import Retriever  # noqa: E402

QUESTION = re.compile(r"^(\d+\.\d+)\s+(.+\?)$")

CONFIGS: dict[str, dict[str, Any]] = {
    "dense": {"mode": "dense"},
    "sparse (Qdrant BM25)": {"mode": "sparse"},
    "sparse (rank-bm25)": {"mode": "sparse", "sparse_engine": "rank_bm25"},
    "hybrid (default: convex + document signal)": {"mode": "hybrid"},
    "hybrid DBSF (Qdrant)": {"mode": "hybrid", "fusion_method": "dbsf", "doc_weight": 0.0},
    "hybrid RRF (Qdrant)": {"mode": "hybrid", "fusion_method": "rrf", "doc_weight": 0.0},
    "hybrid RRF dense x2": {"mode": "hybrid", "fusion_method": "rrf", "dense_weight": 2.0},
    "hybrid RRF sparse x2": {"mode": "hybrid", "fusion_method": "rrf", "sparse_weight": 2.0},
    "hybrid, no fragment split": {"mode": "hybrid", "split_fragments": False},
}


def golden(retriever: Retriever) -> list[tuple[str, str]]:
    """(question, heading) for every numbered FAQ question among the stored headings."""
    headings = set()
    for hit in retriever.store.scroll(fields=["file_path", "heading_path"]):
        if str(hit.payload.get("file_path", "")).endswith("R-FAQ.pdf"):
            for heading in hit.payload.get("heading_path") or []:
                text = heading.lstrip("# ").strip()
                if QUESTION.match(text):
                    headings.add(text)
    return sorted((QUESTION.match(h).group(2), h) for h in headings)  # type: ignore[union-attr]


def relevant(hit: Any, heading: str) -> bool:
    path = [h.lstrip("# ").strip() for h in hit.payload.get("heading_path") or []]
    return bool(path) and path[-1] == heading


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "modes.json")
    parser.add_argument("--embedder", default="local", help="local (default) or onnx")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ragpipe-modes-") as tmp:
        cfg = RagpipeConfig(
            discover={"roots": [REPO / "data" / "sample"]},  # type: ignore[arg-type]
            embed={"provider": args.embedder},  # type: ignore[arg-type]
            store={"path": Path(tmp) / "store"},  # type: ignore[arg-type]
            paths={"work_dir": Path(tmp) / "work"},  # type: ignore[arg-type]
        )
        print(run_ingest(cfg).line(), flush=True)
        results: dict[str, Any] = {}
        with Retriever(cfg) as retriever:
            questions = golden(retriever)
            print(f"{len(questions)} R-FAQ questions; embedder {cfg.embed.provider.value}")
            for name, overrides in CONFIGS.items():
                hit1 = success5 = rr = 0.0
                for question, heading in questions:
                    hits = retriever.search(question, top_k=10, **overrides).hits
                    ranks = [i for i, h in enumerate(hits, start=1) if relevant(h, heading)]
                    first = ranks[0] if ranks else None
                    hit1 += first == 1
                    success5 += first is not None and first <= 5
                    rr += 1 / first if first else 0.0
                n = len(questions)
                results[name] = {"hit@1": hit1 / n, "success@5": success5 / n, "mrr@10": rr / n}
                r = results[name]
                print(
                    f"  {name:28s} Hit@1 {r['hit@1']:.3f}  Success@5 {r['success@5']:.3f}  "
                    f"MRR@10 {r['mrr@10']:.3f}",
                    flush=True,
                )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"questions": len(questions), "results": results}, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
