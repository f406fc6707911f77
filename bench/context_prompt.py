"""Which prompt context precision should ask about a context (issue 32).

On 2026-12-02 `eval rag --sample 20` scored context precision 0.0 on faq-5.2, faq-7.10 and
faq-7.42, whose first context is the golden target's own section: the judge, asked
ragas's prompt (a reason, then the verdict), called the chunk the reference answer was
written from "not useful". This asks pairs whose truth is known by construction
(``calibration.build_context_pairs``, the probe's context pairs), each a question, its
reference answer and one passage:

- ``useful_context``: the target chunk sharing the most words with the answer (truth 1);
- ``unrelated_context``: a chunk of another file (truth 0);
- ``neighbour_context``: a chunk of the same file outside the target's sections (truth 0;
  a few may share a fact with the target, so this kind's truth is the least certain).

``--set r-faq`` (default) takes the R-FAQ dev set over the sample index and its
``expected_answer``s; ``--set debfaq`` indexes the Debian FAQ (BEIR) under ``--home``,
and, having no expected answers, takes the useful chunk's first two sentences as the
answer. Each pair is asked each way of ``--ways`` with the default judge (the packaged
1.5B), and each way's accuracy, Cohen's kappa and seconds per pair are printed:

- ``short``: ``calibration.CONTEXT_PROMPT`` (does the passage state any fact of the
  answer?), the question and answer, then the passage, ``{"verdict": 0|1}`` only, as
  ``eval.judge_verdicts: statement`` asks (the default);
- ``ragas``: ragas's ContextPrecisionPrompt (question, context, answer; a reason of at
  most 160 characters, then the verdict), as ``eval.judge_verdicts: ragas`` asks;
- ``ragas0``: the same with the reason bounded at 0 characters;
- ``useful``: ``USEFUL_PROMPT`` (was the passage useful for the answer?), a bare verdict;
- ``whole``: the statement prompt, the answer as one statement, the context as passage;
- ``any``: the statement prompt about each sentence of the answer: useful when one is
  supported.

Usage: python bench/context_prompt.py [--set r-faq|debfaq] [--items 16] [--ways short,ragas]
       [--json bench/results/context_prompt.json]
Needs the sample index (``ragpipe ingest``) for r-faq.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ragpipe.config import load_config
from ragpipe.evaluation import calibration, rag
from ragpipe.evaluation.agreement import agreement
from ragpipe.evaluation.check import IndexView
from ragpipe.evaluation.golden import load_golden
from ragpipe.models.embedders import make_embedder
from ragpipe.models.llm import LlamaCppLLM
from ragpipe.query.retrieve import Retriever

# The first short prompt tried (2026-12-02): "useful", the word ragas's prompt uses, with a
# bare verdict; rejected, it called 15 of 16 unrelated r-faq passages useful.
USEFUL_PROMPT = """Was the passage useful for arriving at the answer to the question?
Answer 1 if the passage gives some of the information in the answer; answer 0 if it \
gives none of it.

Question: {question}

Answer: {answer}

Passage:
{passage}

Reply with JSON only: {{"verdict": 1}} or {{"verdict": 0}}."""


def ask(model: LlamaCppLLM, pair: calibration.ProbePair, way: str) -> tuple[int | None, str]:
    """One way's verdict on a context pair."""
    if way == "useful":
        prompt = USEFUL_PROMPT.format(question=pair.question, answer=pair.answer,
                                       passage=pair.passage)  # fmt: skip
        return calibration._bare_verdict(model, [{"role": "user", "content": prompt}])
    if way == "short":
        return calibration.ask_context(model, pair.question, pair.answer, pair.passage,
                                       "statement", 1536)  # fmt: skip
    if way in ("ragas", "ragas0"):  # ragas0: the reason bounded at 0 characters
        rag.REASON_MAX_CHARS = 0 if way == "ragas0" else 160
        try:
            return calibration.ask_context(model, pair.question, pair.answer, pair.passage,
                                           "ragas", 1536)  # fmt: skip
        finally:
            rag.REASON_MAX_CHARS = 160
    if way == "whole":  # the reference as one statement, the context as passage
        return calibration.ask_statement(model, pair.passage, pair.answer)
    # "any": useful when the context supports a sentence of the reference
    texts = []
    for sentence in rag.reference_sentences(pair.answer):
        verdict, text = calibration.ask_statement(model, pair.passage, sentence)
        texts.append(text)
        if verdict != 0:
            return verdict, text
    return 0, " ".join(texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=16, help="golden items asked about "
                        "(each gives one useful pair and one of the two false kinds)")  # fmt: skip
    parser.add_argument("--ways", default="short,ragas",
                        help="of short, ragas, ragas0, useful, whole, any")  # fmt: skip
    parser.add_argument("--set", choices=["r-faq", "debfaq"], default="r-faq")
    parser.add_argument("--home", type=Path, default=Path("/tmp/ragpipe-bench-context"),
                        help="where --set debfaq is indexed")  # fmt: skip
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.set == "debfaq":  # the BEIR set, indexed into --home (no expected answers: each
        # pair's answer is the opening of its useful chunk)
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from bench.retrieval_quality import build

        dev = next(d for d in build(args.home) if d.name == "debfaq")
        config, golden = dev.config, dev.golden
    else:
        config = load_config(None)
        golden = load_golden(Path("eval/golden/r-faq-dev.yaml"))
    retriever = Retriever(config, embedder=make_embedder(config.embed, query_side=True))
    view = IndexView(retriever.store)
    pairs = calibration.build_context_pairs(golden, view, args.items * 2, config.eval.seed)
    truth = [p.truth for p in pairs]
    print(f"{len(pairs)} context pairs ({sum(truth)} useful)")
    model = LlamaCppLLM()
    model.chat([{"role": "user", "content": "Hi"}], max_tokens=1)  # loaded before timing
    results: dict[str, Any] = {}
    for way in args.ways.split(","):
        verdicts: list[int | None] = []
        started = time.perf_counter()
        for pair in pairs:
            try:
                verdict, text = ask(model, pair, way)
                if verdict is None:
                    print(f"  {way} {pair.item_id}: no verdict in {text[:80]!r}")
            except Exception as exc:  # a failed verdict counts as none
                print(f"  {way} {pair.item_id}: {type(exc).__name__}: {exc}")
                verdict = None
            verdicts.append(verdict)
        seconds = time.perf_counter() - started
        measured = agreement(truth, verdicts, 1000, 0)
        answered = list(zip(pairs, verdicts, strict=True))
        by_kind = {
            kind: f"{sum(v == p.truth for p, v in answered if p.kind == kind)}"
            f"/{sum(p.kind == kind for p in pairs)}"
            for kind in dict.fromkeys(p.kind for p in pairs)
        }
        results[way] = {**measured.as_dict(), "seconds_per_pair": round(seconds / len(pairs), 2),
                        "correct_by_kind": by_kind, "verdicts": verdicts}  # fmt: skip
        print(f"{way:>6}: accuracy {measured.accuracy:.3f}, kappa {measured.kappa:.2f} "
              f"[{measured.kappa_low:.2f}, {measured.kappa_high:.2f}], "
              f"{seconds / len(pairs):.1f} s a pair, correct by kind {by_kind}")  # fmt: skip
    if args.json:
        report = {"pairs": [{"kind": p.kind, "item_id": p.item_id, "truth": p.truth,
                             "passage": p.passage[:120]} for p in pairs],
                  "model": model.name, "ways": results}  # fmt: skip
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
