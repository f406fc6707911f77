"""LLM reranking (``retrieve.rerank: llm``) on both dev sets: what it gains and what it costs.

The packaged generator (qwen2.5-coder-1.5b, through llama.cpp in-process) scores each of
the default's top ``top_k x candidate_mul`` candidates by its probability of answering
"yes" to "does the passage answer the question?"; the list is re-ordered by it
(``ragpipe.query.llm_rerank``). One model call reads the passage (the question's prefix
is reused from llama.cpp's prompt cache), so a query costs seconds on a CPU: the bench
runs a seeded stratified sample of each dev set's queries (``--queries``, the
``eval rag --sample`` sampler), the same queries for both rows.

Rows on each set: the shipped default, and the default with ``rerank: llm`` and
``rerank_depth: 10``: the default's top 10 chunks are judged and re-ordered, the rest
follow in retrieval order (at about 5 s a judgement on 2 cores, a deeper pool is minutes a
query; debfaq is scored by file, so its searches ask for 40 chunks). NDCG@10, MRR, Recall@10 from
pytrec_eval; the paired delta of NDCG@10 (bootstrap CI, permutation p-value); the cost
per query in seconds and as a ratio to the default's own search, measured in the same
run. The score cache is emptied first (``--keep-cache`` keeps it), so the cost is that of
a cold cache.

Indexes are those of ``bench/retrieval_quality.py`` (built under ``--work`` if missing).

Usage: python bench/llm_rerank.py [--queries 15] [--model qwen2.5-coder-1.5b]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "src"))

import pytrec_eval  # noqa: E402
from retrieval_quality import DevSet, build, ragpipe_runs, score  # noqa: E402

from ragpipe.evaluation.golden import GoldenSet, stratified_sample  # noqa: E402
from ragpipe.evaluation.metrics import paired_delta  # noqa: E402
from ragpipe.evaluation.retrieval import Variant  # noqa: E402
from ragpipe.query.retrieve import Retriever  # noqa: E402

DEFAULT = Variant("ragpipe default")
RERANKED = Variant(
    "ragpipe default + LLM rerank", {"rerank": "llm", "candidate_mul": 1, "rerank_depth": 10}
)


def sampled(dev: DevSet, n: int, seed: int) -> DevSet:
    items = stratified_sample(dev.golden.items, n, seed)
    golden = GoldenSet(f"{dev.golden.name}-sample", items, dev.golden.description)
    qrels = {item.id: dev.qrels[item.id] for item in items}
    return dataclasses.replace(dev, golden=golden, qrels=qrels)


def per_query_ndcg(
    run: dict[str, dict[str, float]], qrels: dict[str, dict[str, int]]
) -> list[float]:
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut_10"})
    scored = evaluator.evaluate(run)
    return [scored.get(q, {}).get("ndcg_cut_10", 0.0) for q in sorted(qrels)]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=REPO / "bench" / ".cache" / "quality")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "llm_rerank.json")
    parser.add_argument("--queries", type=int, default=15, help="queries per dev set")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="llm.model")
    parser.add_argument("--keep-cache", action="store_true", help="keep earlier scores")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "note": f"bench/llm_rerank.py, {args.queries} queries per dev set (seed {args.seed}), "
        f"{args.model} through llama.cpp in-process, {time.strftime('%Y-%m-%d')}",
        "sets": {},
    }
    for dev in build(args.work):
        dev = sampled(dev, args.queries, args.seed)
        llm = dev.config.llm.model_copy(update={"model": args.model})
        config = dev.config.model_copy(update={"llm": llm})
        dev = dataclasses.replace(dev, config=config)
        cache = config.paths.work_dir / "llm_rerank.sqlite"
        if not args.keep_cache:
            cache.unlink(missing_ok=True)
        runs, seconds = {}, {}
        with Retriever(config) as retriever:
            retriever.search(dev.golden.items[0].query)  # warm: the embedder and the store
            for variant in (DEFAULT, RERANKED):
                if variant is RERANKED:  # load the model outside the timed loop
                    retriever.llm.chat([{"role": "user", "content": "yes"}], max_tokens=1)
                started = time.perf_counter()
                runs.update(ragpipe_runs(dev, [variant], retriever))
                seconds[variant.name] = (time.perf_counter() - started) / len(dev.golden.items)
        rows = {name: score(run, dev.qrels) for name, run in runs.items()}
        delta = paired_delta(
            per_query_ndcg(runs[DEFAULT.name], dev.qrels),
            per_query_ndcg(runs[RERANKED.name], dev.qrels),
        )
        ratio = seconds[RERANKED.name] / seconds[DEFAULT.name]
        results["sets"][dev.name] = {
            "queries": len(dev.golden.items),
            "rows": rows,
            "ndcg_delta": delta.as_dict(),
            "seconds_per_query": seconds,
            "cost_ratio": ratio,
        }
        print(f"\n{dev.name} ({len(dev.golden.items)} sampled queries)")
        print(f"  {'':32s} {'NDCG@10':>8s} {'MRR':>8s} {'R@10':>8s} {'s/query':>8s}")
        for name, m in rows.items():
            print(
                f"  {name:32s} {m['ndcg@10']:8.4f} {m['mrr']:8.4f} {m['recall@10']:8.4f} "
                f"{seconds[name]:8.3f}"
            )
        ci = delta.interval
        print(
            f"  NDCG@10 delta {ci.mean:+.4f} [{ci.low:+.4f}, {ci.high:+.4f}], "
            f"p={delta.p_value:.3f}; LLM rerank costs {ratio:.0f}x the default's search",
            flush=True,
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
