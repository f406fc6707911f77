"""What the embedded judge's time goes to, and two llama.cpp features tried to cut it (issue 32).

`eval rag --sample 20` with the packaged 1.5B as generator and judge took 43 min on
2 cores against a 30 min target. This replays the RAG eval's own ``Judge`` (the
ragas metrics) on the first N answerable R-FAQ dev questions of the stratified
sample, over the shipped sample index, and records every model call (seconds,
prompt tokens, those taken from llama.cpp's prompt cache, output tokens, the reply)
under one of three llama.cpp settings:

- ``none``: today's setting (one slot, greedy, llama.cpp's prompt cache);
- ``ngram``: prompt-lookup speculative decoding (llama.cpp's ``ngram-simple``):
  RAGAS's verdicts copy statements from the prompt, so drafts should often hit;
- ``par``: four slots with a unified KV cache and the four metrics judged
  concurrently (batched decoding), in case decoding is bound by memory, not compute.

``--verdicts`` chooses how faithfulness's verdicts are asked: ``statement`` (the
default since 2026-12-02: one short call a statement, a bare verdict), ``prefilled``
(ragas's prompt, each statement prefilled, 2026-11-29 to 12-01) or ``one-reply``
(ragas's prompt, the verdicts written in one reply, in groups of ``judge_max_tokens`` /
150 statements since 2026-12-02; before 2026-11-29 all in one). ``--questions 3``
asks answer relevancy 3 questions, as before 2026-11-29 (one question three times at
temperature 0); ``--reason-chars 0`` forbids the rationale before each ragas verdict.

``--claims generated`` judges ragas's statements, as every mode recorded before the
answer's own sentences became the default (later on 2026-12-02).

Usage: python bench/judge_speed.py {none,ngram,par} [N] [--verdicts {statement,prefilled,one-reply}]
       [--claims {sentences,generated}]
       [--questions N] [--reason-chars N] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import xllamacpp as xlc

from ragpipe.config import load_config
from ragpipe.evaluation import rag
from ragpipe.evaluation.golden import load_golden, stratified_sample
from ragpipe.models import llm as llm_module
from ragpipe.models.embedders import make_embedder
from ragpipe.query.generate import answer
from ragpipe.query.retrieve import Retriever

SLOTS = 4


class Timed:
    """llama.cpp's server core, keeping the last reply's ``timings`` (``cache_n``: prompt
    tokens taken from the prompt cache instead of being read again)."""

    last: ClassVar[dict[str, Any]] = {}

    def __init__(self, server: Any) -> None:
        self.server = server

    def handle_chat_completions(self, request: Any, *rest: Any) -> Any:
        reply = self.server.handle_chat_completions(request, *rest)
        if isinstance(reply, dict):
            Timed.last = reply.get("timings") or {}
        return reply


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["none", "ngram", "par"])
    parser.add_argument("n", type=int, nargs="?", default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--ngram-n", type=int, default=12, help="ngram: lookup n-gram length")
    parser.add_argument("--ngram-m", type=int, default=48, help="ngram: drafted m-gram length")
    parser.add_argument("--draft-max", type=int, default=None, help="ngram: most tokens drafted")
    parser.add_argument(
        "--verdicts", choices=["statement", "prefilled", "one-reply"], default="statement",
        help="faithfulness's verdicts: one short call per statement for a bare verdict (the "
        "default since 2026-12-02, eval.judge_verdicts: statement); ragas's prompt with one "
        "prefilled call per statement (2026-11-29 to 12-01); or ragas's prompt, all in one "
        "reply, the statements written again by the model",
    )  # fmt: skip
    parser.add_argument(
        "--claims", choices=["sentences", "generated"], default="sentences",
        help="what faithfulness judges: the answer's sentences (the default since later on "
        "2026-12-02, eval.faithfulness_claims) or ragas's generated statements (every run "
        "recorded before)",
    )  # fmt: skip
    parser.add_argument(
        "--reason-chars", type=int, default=None,
        help="longest rationale the judge may write before a verdict (default: the eval's)",
    )  # fmt: skip
    parser.add_argument(
        "--questions", type=int, default=None,
        help="answer relevancy's generated questions (default: the Judge's, 1 at "
        "temperature 0; 3 before 2026-11-29)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.reason_chars is not None:
        rag.REASON_MAX_CHARS = args.reason_chars
    par = args.mode == "par"

    def load(path: str, context: int, threads: int | None) -> tuple[Any, Any]:
        params = xlc.CommonParams()
        params.model.path = path
        params.n_ctx = context * (SLOTS if par else 1)
        params.n_parallel = SLOTS if par else 1
        params.kv_unified = True
        params.warmup = False
        params.verbosity = -1
        if args.mode == "ngram":
            ngram = xlc.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE
            params.speculative.types = [ngram]
            params.speculative.ngram_simple.size_n = args.ngram_n
            params.speculative.ngram_simple.size_m = args.ngram_m
            if args.draft_max is not None:
                params.speculative.draft.n_max = args.draft_max
        return Timed(xlc.Server(params)), threading.Semaphore(SLOTS if par else 1)

    llm_module._load_gguf = load  # type: ignore[assignment]
    config = load_config(None)
    golden = load_golden(Path("eval/golden/r-faq-dev.yaml"))
    items = [i for i in stratified_sample(golden.items, 20, config.eval.seed)
             if i.answerable and i.expected_answer][: args.n]  # fmt: skip
    embedder = make_embedder(config.embed)
    model = llm_module.LlamaCppLLM()
    calls: list[dict[str, Any]] = []
    chat = model.chat

    def recorded(messages: Any, **kwargs: Any) -> Any:
        reply = chat(messages, **kwargs)
        cached = Timed.last.get("cache_n")  # prompt tokens llama.cpp did not read again
        calls.append({"seconds": round(reply.seconds, 2), "tokens_in": reply.tokens_in,
                      "tokens_cached": cached, "tokens_out": reply.tokens_out,
                      "text": reply.text})  # fmt: skip
        return reply

    model.chat = recorded  # type: ignore[method-assign]
    judge = rag.Judge(model, embedder, 600, config.eval.judge_max_tokens,
                      verdicts="statement" if args.verdicts == "statement" else "ragas",
                      claims=args.claims, prefill=args.verdicts == "prefilled",
                      questions=args.questions)  # fmt: skip
    if par:

        async def concurrent(row: rag.RagRow, item: Any) -> None:
            q, a, ctx, ref = item.query, row.answer, row.contexts, item.expected_answer
            judged = await asyncio.gather(
                judge._one(judge.faithfulness, "faithfulness", user_input=q, response=a,
                           retrieved_contexts=ctx),
                judge._one(judge.answer_relevancy, "answer_relevancy", user_input=q, response=a),
                judge._one(judge.context_precision, "context_precision", user_input=q,
                           reference=ref, retrieved_contexts=ctx),
                judge._one(judge.context_recall, "context_recall", user_input=q,
                           retrieved_contexts=ctx, reference=ref),
            )  # fmt: skip
            names = ("faithfulness", "answer_relevancy", "context_precision", "context_recall")
            row.judged.update(zip(names, judged, strict=True))

        judge.judge = concurrent  # type: ignore[method-assign]
    retriever = Retriever(config, embedder=embedder, llm=model)
    results: list[dict[str, Any]] = []
    for item in items:
        hits = retriever.search(item.query).hits
        reply = answer(item.query, hits, model, config.generate.context_tokens, cite_grammar=True)
        contexts = [s.text for s in reply.sources]
        refused = rag.is_refusal(reply.text)
        row = rag.RagRow(item.id, item.query, reply.text, refused, contexts, 0, [], 0, 0, 0.0,
                         answerable=True)  # fmt: skip
        started, first = time.perf_counter(), len(calls)
        asyncio.run(judge.judge(row, item))
        took = round(time.perf_counter() - started, 1)
        scores = {m: j.value for m, j in row.judged.items()}
        results.append({"id": item.id, "judge_seconds": took, "scores": scores,
                        "calls": calls[first:]})  # fmt: skip
        read = sum(c["tokens_in"] for c in calls[first:])
        cached = sum(c["tokens_cached"] or 0 for c in calls[first:])
        print(
            f"{item.id}: judged in {took} s, {len(calls) - first} calls, {cached} of {read} "
            f"prompt tokens from the cache, {scores}",
            flush=True,
        )
    retriever.close()
    total = sum(r["judge_seconds"] for r in results)
    print(f"{args.mode}: {total:.0f} s judging {len(results)} answers")
    if args.json:
        args.json.write_text(json.dumps({"mode": args.mode, "verdicts": args.verdicts,
                                         "claims": args.claims,
                                         "reason_chars": rag.REASON_MAX_CHARS,
                                         "questions": judge.questions, "results": results},
                                        indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
