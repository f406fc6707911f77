"""Evaluation overhead: time in metrics + bootstrap CIs vs time in search, 300 queries.

Indexes the sample corpus (default embedder) and evaluates 300 queries: the
75 R-FAQ dev questions in four phrasings (as written, lower case, without
the question mark, as "Question: ..."), one variant and a two-variant
compare (paired bootstrap + 10,000-permutation test per metric). Target:
metrics + CIs ≤ 0.1 × search time.

Also the checks issue 30 added in front of and beside the scores: checking the
300-item golden set against the index (every target matched, as `eval
retrieval` does before any query; target ≤ 0.1 × the search time of the same
300 queries), and the judge-free answer metrics (token F1, ROUGE-L, the
embedder's cosine, citations, refusal, degenerate) of 300 answers, against
what each of them follows in a RAG run: generating the answer with the
packaged SmolLM2 through llama.cpp (5 answers of at most 64 tokens, timed in
the same run; target ≤ 0.05 × one generation).

Each variant's search is timed with an empty query-vector cache (the
retriever embeds each query once per run, so a second pass over the same
queries would time the search without the embedding).

Usage: python bench/eval.py [--json OUT]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ragpipe.config import RagpipeConfig  # noqa: E402
from ragpipe.evaluation.check import IndexView, golden_for_index  # noqa: E402
from ragpipe.evaluation.golden import GoldenSet, load_golden  # noqa: E402
from ragpipe.evaluation.rag import score_answer  # noqa: E402
from ragpipe.evaluation.retrieval import Variant, run_retrieval_eval  # noqa: E402
from ragpipe.ingest.pipeline import run_ingest  # noqa: E402
from ragpipe.models.llm import LlamaCppLLM  # noqa: E402
from ragpipe.query.generate import Answer, answer, select_sources  # noqa: E402
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
                retriever._query_vectors.clear()  # time the search with its embedding
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
            search_s = results["retrieval"]["search_s"]
            started = time.perf_counter()
            view = IndexView(retriever.store)
            _, check = golden_for_index(golden, view, skip_unmatched=False, origin="bench")
            check_s = time.perf_counter() - started
            results["golden_check"] = {
                "items": check.items,
                "targets": check.targets,
                "check_s": check_s,
                "ratio_to_search": check_s / search_s,
            }
            print(
                f"golden check: {check.targets} targets of {check.items} items against "
                f"{check.index_files} files in {check_s:.3f}s, ratio to the search time "
                f"{check_s / search_s:.3f} (target <= 0.1)",
                flush=True,
            )
            # Answers: each item answered with another item's expected answer and cited [1],
            # over the hits its own question retrieves (the hits are searched first, untimed).
            hits = {item.id: retriever.search(item.query).hits for item in items}
            replies = []
            for n, item in enumerate(items):
                sources, _ = select_sources(hits[item.id], 2800, lambda t: len(t) // 4)
                other = items[(n + 1) % len(items)].expected_answer or ""
                replies.append(Answer(item.query, other + " [1]", sources, sources[:1], [], False))
            started = time.perf_counter()
            for item, reply in zip(items, replies, strict=True):
                score_answer(item, reply, hits[item.id], retriever.embedder)
            answers_s = time.perf_counter() - started
            llm = LlamaCppLLM(max_tokens=64)
            llm.chat([{"role": "user", "content": "warm up"}], max_tokens=4)
            started = time.perf_counter()
            for item in items[:5]:
                answer(item.query, hits[item.id], llm, 2800)
            per_generation = (time.perf_counter() - started) / 5
            per_answer = answers_s / len(items)
            results["answer_metrics"] = {
                "answers": len(items),
                "answer_metrics_s": answers_s,
                "ms_per_answer": 1000 * per_answer,
                "generation_s": per_generation,
                "ratio_to_one_generation": per_answer / per_generation,
            }
            print(
                f"answer metrics: {len(items)} answers in {answers_s:.3f}s "
                f"({1000 * per_answer:.1f} ms each); one SmolLM2 answer {per_generation:.2f}s; "
                f"ratio {per_answer / per_generation:.4f} (target <= 0.05)",
                flush=True,
            )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
