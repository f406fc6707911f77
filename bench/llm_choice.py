"""The embedded generator and judge, chosen by measurement (issue 32).

Each packaged GGUF model answers the same questions over the same index (the
shipped sample corpus, default embedder and retrieval), through ragpipe's own
``answer()`` and scored by the RAG eval's own judge-free metrics
(``score_answer``):

- **R-FAQ dev**: every ``--stride``-th question of ``eval/golden/r-faq-dev.yaml``
  (chunk targets and expected answers from each question's section):
  citation precision, false refusals (where a given source holds the target),
  answer token F1 against the expected answer, degenerate (looping) answers;
- **out of corpus**: questions the sample corpus cannot answer (``answerable:
  false``): correct refusals;
- **judge**: Cohen's kappa on the calibration probe the RAG eval builds from the
  golden set and the index (statement and answer pairs with known truth);
- **speed**: seconds per answer and time to the first token.

It also records, for every question of both sets, the top hit's dense cosine,
so that a relevance floor (``generate.min_relevance``) can be read off.

Usage: python bench/llm_choice.py [--models smollm2-135m,qwen2.5-coder-0.5b,...]
       [--stride 6] [--probe 12] [--json bench/results/llm_choice.json]
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
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ragpipe.config import RagpipeConfig  # noqa: E402
from ragpipe.evaluation.calibration import build_probe, calibrate  # noqa: E402
from ragpipe.evaluation.check import IndexView  # noqa: E402
from ragpipe.evaluation.golden import GoldenItem, GoldenSet, load_golden  # noqa: E402
from ragpipe.evaluation.rag import score_answer  # noqa: E402
from ragpipe.ingest.pipeline import run_ingest  # noqa: E402
from ragpipe.models.llm import LlamaCppLLM  # noqa: E402
from ragpipe.query.generate import answer, best_relevance  # noqa: E402
from ragpipe.query.generate import relevance_floor as generate_floor  # noqa: E402
from ragpipe.query.retrieve import Retriever  # noqa: E402

MODELS = ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]

# Nothing in the sample corpus (R manuals, Docling's test PDFs, an aviation handbook
# excerpt) answers these; some are general knowledge a model may "know".
OUT_OF_CORPUS = [
    "What is the capital of France?",
    "Who won the 2018 FIFA World Cup?",
    "How do I bake sourdough bread?",
    "What is the population of Tokyo?",
    "How do I reset a forgotten Wi-Fi router password?",
    "Who painted the Mona Lisa?",
    "What is the tallest mountain in Africa?",
    "How do I configure an ingress controller in Kubernetes?",
    "When did the Berlin Wall fall?",
    "How many moons does Jupiter have?",
    "What is the boiling point of water in Fahrenheit?",
    "How do I replace a bicycle chain?",
    "Which planet is closest to the Sun?",
    "How do I make a cappuccino at home?",
    "Who wrote the novel War and Peace?",
    "What is the speed limit on German autobahns?",
    "How do I install PostgreSQL on Ubuntu?",
    "What year did the Titanic sink?",
    "How long should I boil an egg for a soft yolk?",
    "What currency is used in Japan?",
]


def _config(home: Path) -> RagpipeConfig:
    return RagpipeConfig.model_validate(
        {
            "discover": {"roots": [str(REPO / "data" / "sample")]},
            "store": {"path": str(home / "store")},
            "paths": {"work_dir": str(home / "work")},
        }
    )


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 3) if values else None


def measure(
    model: str,
    cfg: RagpipeConfig,
    retrieved: list[tuple[GoldenItem, Any]],
    golden: GoldenSet,
    probe_size: int,
    grammar: bool,
    floor: float | None,
) -> dict[str, Any]:
    llm = LlamaCppLLM(model, cfg.llm.context_size, None, cfg.llm.max_tokens, 0.0, 0)
    rows = []
    for item, result in retrieved:
        first: list[float] = []
        started = time.perf_counter()

        def on_token(piece: str, started: float = started, first: list[float] = first) -> None:
            if not first:
                first.append(time.perf_counter() - started)

        # The model answers every question (no floor), so its own refusals are measured;
        # the pipeline's refusal is the floor's or the model's.
        reply = answer(item.query, result.hits, llm, cfg.generate.context_tokens, on_token,
                       cite_grammar=grammar)  # fmt: skip
        scores, _, _, _ = score_answer(item, reply, result.hits, None)
        relevance = best_relevance(result.hits)
        floored = floor is not None and relevance is not None and relevance < floor
        rows.append(
            {
                "id": item.id,
                "answerable": item.answerable,
                "answer": reply.text,
                "seconds": round(reply.seconds, 2),
                "ttft": round(first[0], 2) if first else None,
                "tokens_in": reply.tokens_in,
                "tokens_out": reply.tokens_out,
                "flags": reply.flags,
                "best_relevance": relevance,
                "below_floor": floored,
                **{m: j.value for m, j in scores.items()},
            }
        )
        print(f"  {model} {item.id}: {reply.seconds:5.1f}s {reply.text[:70]!r}", flush=True)

    def values(metric: str, answerable: bool) -> list[float]:
        return [r[metric] for r in rows if r["answerable"] == answerable and r[metric] is not None]

    with Retriever(cfg) as retriever:
        probe = build_probe(golden, IndexView(retriever.store), probe_size, 0)
    started = time.perf_counter()
    calibration = calibrate(llm, probe, min_kappa=0.6, timeout_s=300, resamples=500)
    outside = [r for r in rows if not r["answerable"]]
    return {
        "model": model,
        "cite_grammar": grammar,
        "file": llm.name,
        "rfaq": {
            "n": sum(r["answerable"] for r in rows),
            "citation_precision": _mean(values("citation_precision", True)),
            "cited_answers": len(values("citation_precision", True)),
            "uncited": _mean([float("uncited" in r["flags"]) for r in rows if r["answerable"]]),
            "false_refusal": _mean(values("false_refusal", True)),
            "answer_f1": _mean(values("answer_f1", True)),
            "degenerate": _mean(values("degenerate", True)),
        },
        "out_of_corpus": {
            "n": sum(not r["answerable"] for r in rows),
            "correct_refusal": _mean(values("correct_refusal", False)),
            "pipeline_correct_refusal": _mean(
                [float(r["below_floor"] or r["correct_refusal"] == 1.0) for r in outside]
            ),
            "below_floor": sum(r["below_floor"] for r in outside),
            "degenerate": _mean(values("degenerate", False)),
        },
        "judge": {
            "kappa": calibration.agreement.kappa,
            "n": len(probe),
            "unparsed": sum(v is None for v in calibration.verdicts),
            "seconds": round(time.perf_counter() - started, 1),
        },
        "seconds_per_answer": _mean([r["seconds"] for r in rows]),
        "ttft": _mean([r["ttft"] for r in rows if r["ttft"] is not None]),
        "rows": rows,
    }


def relevance_floor(
    home: Path, cfg: RagpipeConfig, golden: GoldenSet, outside: list[GoldenItem]
) -> dict[str, Any]:
    """The best hit's own cosine (what generate.min_relevance reads) for every question of
    both dev sets over their indexes and for the out-of-corpus questions over the sample."""
    from bench.retrieval_quality import build

    debfaq = next(dev for dev in build(home / "floor") if dev.name == "debfaq")
    values: dict[str, list[float]] = {}
    for name, config, items in (
        ("rfaq", cfg, golden.items),
        ("debfaq", debfaq.config, debfaq.golden.items),
        ("out_of_corpus", cfg, outside),
    ):
        with Retriever(config) as retriever:
            values[name] = [
                round(best_relevance(retriever.search(item.query).hits) or 0.0, 4) for item in items
            ]
    summary = {
        name: {"n": len(v), "min": min(v), "p05": sorted(v)[len(v) // 20], "median":
               statistics.median(v), "max": max(v)}
        for name, v in values.items()
    }  # fmt: skip
    return {"values": values, "summary": summary}


def relevance_floor_for(cfg: RagpipeConfig) -> float | None:
    from ragpipe.models.embedders import embedder_name

    return generate_floor(cfg.generate, embedder_name(cfg.embed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--stride", type=int, default=6, help="every N-th R-FAQ question")
    parser.add_argument("--ooc", type=int, default=20, help="out-of-corpus questions")
    parser.add_argument("--no-grammar", action="store_true", help="generate.cite_grammar: false")
    parser.add_argument("--probe", type=int, default=12, help="judge calibration pairs")
    parser.add_argument("--floor-only", action="store_true", help="only the relevance floor")
    parser.add_argument("--home", type=Path, default=Path("/tmp/ragpipe-bench-llm"))
    parser.add_argument("--json", type=Path, default=REPO / "bench/results/llm_choice.json")
    args = parser.parse_args()
    cfg = _config(args.home)
    print("indexing the sample corpus…", flush=True)
    run_ingest(cfg)
    golden = load_golden(REPO / "eval/golden/r-faq-dev.yaml")
    chosen = golden.items[:: args.stride]
    outside = [GoldenItem(f"ooc-{i}", q, {}, answerable=False)
               for i, q in enumerate(OUT_OF_CORPUS)]  # fmt: skip
    floor = relevance_floor(args.home, cfg, golden, outside)
    print(json.dumps(floor["summary"], indent=1), flush=True)
    if args.floor_only:
        args.json.write_text(json.dumps({"floor": floor}, indent=1) + "\n", encoding="utf-8")
        return
    retrieved = []
    with Retriever(cfg) as retriever:
        for item in [*chosen, *outside[: args.ooc]]:
            retrieved.append((item, retriever.search(item.query)))
    results = []
    floor_value = relevance_floor_for(cfg)
    for model in args.models.split(","):
        print(f"{model}:", flush=True)
        results.append(measure(model, cfg, retrieved, GoldenSet(golden.name, chosen),
                               args.probe, not args.no_grammar, floor_value))  # fmt: skip
        results[-1]["questions"] = {"rfaq": len(chosen), "out_of_corpus": args.ooc}
        summary = {k: v for k, v in results[-1].items() if k != "rows"}
        print(json.dumps(summary, indent=1), flush=True)
    # Runs of other models (or the same model with the other grammar setting) are kept.
    earlier = json.loads(args.json.read_text("utf-8"))["models"] if args.json.is_file() else []
    ran = {(r["model"], r["cite_grammar"]) for r in results}
    kept = [r for r in earlier if (r["model"], r.get("cite_grammar", False)) not in ran]
    out = {"floor": floor, "models": [*kept, *results]}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print("table:")
    print("| model | cite grammar | citation precision (cited/n) | uncited | false refusal | "
          "answer F1 | degenerate | OOC refusal: model / with floor | judge kappa | s/answer "
          "| TTFT s |")  # fmt: skip
    for r in out["models"]:
        q, o = r["rfaq"], r["out_of_corpus"]
        print(f"| {r['model']} | {r.get('cite_grammar', False)} | {q['citation_precision']} "
              f"({q['cited_answers']}/{q['n']}) | {q.get('uncited')} | {q['false_refusal']} | "
              f"{q['answer_f1']} | {q['degenerate']} | {o['correct_refusal']} / "
              f"{o.get('pipeline_correct_refusal')} (n={o['n']}) | {r['judge']['kappa']} | "
              f"{r['seconds_per_answer']} | {r['ttft']} |")  # fmt: skip


if __name__ == "__main__":
    main()
