"""RAG evaluation: retrieve → generate → judge with RAGAS, over a golden set.

The judge is the ``ragas`` library's own metrics (faithfulness, answer
relevancy, context precision, context recall) driven by ragpipe's ``LLM`` and
``Embedder`` through ragas's custom-LLM interface. Context recall needs a
reference answer: items without ``expected_answer`` record it as not
applicable, and context precision then uses ragas's reference-free variant
(recorded per row). A judge failure (timeout, unparseable output, NaN) is
recorded as null with its reason, never as 0.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, TypeVar

from ragpipe.config import RagpipeConfig
from ragpipe.evaluation.golden import GoldenItem, GoldenSet
from ragpipe.evaluation.metrics import Interval, bootstrap_ci
from ragpipe.models.embedders import Embedder, make_embedder
from ragpipe.models.llm import LLM, make_llm
from ragpipe.query.generate import answer
from ragpipe.query.retrieve import Retriever

os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")  # else ~15 s of telemetry DNS per run

RAG_METRICS = ("faithfulness", "answer_relevancy", "context_precision", "context_recall")
# What each metric can score. Outside it, the judge's output broke the metric's arithmetic
# (a small model's context-precision verdicts of 2 or -1 instead of 0/1 gave 5e14).
# Answer relevancy is a mean cosine similarity.
SCORE_RANGE = {"answer_relevancy": (-1.0, 1.0)}
OK, FAILED, NOT_APPLICABLE = "ok", "failed", "not_applicable"

M = TypeVar("M")


@dataclass
class Judged:
    """One metric of one query: a score, or null with the reason."""

    value: float | None
    status: str
    reason: str | None = None


@dataclass
class RagRow:
    item_id: str
    query: str
    answer: str
    not_found: bool
    contexts: list[str]
    cited: int
    invalid_citations: list[int]
    tokens_in: int
    tokens_out: int
    generation_seconds: float
    judged: dict[str, Judged] = field(default_factory=dict)
    context_precision_kind: str = ""


@dataclass
class RagEvalResult:
    name: str
    golden: GoldenSet
    rows: list[RagRow]
    summary: dict[str, Interval]
    counts: dict[str, dict[str, int]]
    judge: dict[str, Any]
    generator: str
    warnings: list[str]
    resamples: int
    seed: int


def _adapters(llm: LLM, embedder: Embedder, max_tokens: int) -> tuple[Any, Any]:
    """ragpipe's LLM and Embedder behind ragas's InstructorBaseRagasLLM / BaseRagasEmbedding."""
    from ragas.embeddings.base import BaseRagasEmbedding
    from ragas.llms import InstructorBaseRagasLLM

    class JudgeLLM(InstructorBaseRagasLLM):
        def generate(self, prompt: str, response_model: type[M]) -> M:
            schema = response_model.model_json_schema()  # type: ignore[attr-defined]
            reply = llm.chat([{"role": "user", "content": prompt}], schema=schema,
                             max_tokens=max_tokens)  # fmt: skip
            parsed: M = response_model.model_validate_json(reply.text)  # type: ignore[attr-defined]
            return parsed

        async def agenerate(self, prompt: str, response_model: type[M]) -> M:
            return await asyncio.to_thread(self.generate, prompt, response_model)

    class JudgeEmbeddings(BaseRagasEmbedding):
        def embed_text(self, text: str, **kwargs: Any) -> list[float]:
            return [float(x) for x in embedder.embed_query(text)]

        async def aembed_text(self, text: str, **kwargs: Any) -> list[float]:
            return self.embed_text(text)

    return JudgeLLM(), JudgeEmbeddings()


class Judge:
    """The four RAGAS metrics on one (question, answer, contexts, reference)."""

    def __init__(self, llm: LLM, embedder: Embedder, timeout_s: float, max_tokens: int) -> None:
        from ragas.metrics.collections import (
            AnswerRelevancy,
            ContextPrecision,
            ContextPrecisionWithoutReference,
            ContextRecall,
            Faithfulness,
        )

        judge_llm, judge_embeddings = _adapters(llm, embedder, max_tokens)
        self.timeout_s = timeout_s
        self.faithfulness = Faithfulness(llm=judge_llm)
        self.answer_relevancy = AnswerRelevancy(llm=judge_llm, embeddings=judge_embeddings)
        self.context_precision = ContextPrecision(llm=judge_llm)
        self.context_precision_free = ContextPrecisionWithoutReference(llm=judge_llm)
        self.context_recall = ContextRecall(llm=judge_llm)
        metrics = (
            self.faithfulness,
            self.answer_relevancy,
            self.context_precision,
            self.context_precision_free,
            self.context_recall,
        )
        self.classes = [type(m).__name__ for m in metrics]

    async def _one(self, metric: Any, name: str, **kwargs: Any) -> Judged:
        try:
            result = await asyncio.wait_for(metric.ascore(**kwargs), self.timeout_s)
        except TimeoutError:
            return Judged(None, FAILED, f"timeout after {self.timeout_s:.0f}s")
        except Exception as exc:  # unparseable judge output, validation errors
            return Judged(None, FAILED, f"{type(exc).__name__}: {str(exc)[:300]}")
        value = getattr(result, "value", result)
        try:
            score = float(value)
        except (TypeError, ValueError):
            return Judged(None, FAILED, f"non-numeric score {value!r}")
        if math.isnan(score):
            return Judged(None, FAILED, "the judge produced no score (NaN)")
        low, high = SCORE_RANGE.get(name, (0.0, 1.0))
        if not low - 1e-9 <= score <= high + 1e-9:
            return Judged(
                None, FAILED, f"score {score:g} outside [{low:g}, {high:g}]: malformed verdicts"
            )
        return Judged(score, OK)

    async def judge(self, row: RagRow, item: GoldenItem) -> None:
        q, a, ctx, ref = item.query, row.answer, row.contexts, item.expected_answer
        if not ctx:
            reason = "nothing was retrieved"
            row.judged = {m: Judged(None, NOT_APPLICABLE, reason) for m in RAG_METRICS}
            return
        if row.not_found:
            row.judged["faithfulness"] = Judged(None, NOT_APPLICABLE, "'not found' makes no claim")
        else:
            row.judged["faithfulness"] = await self._one(
                self.faithfulness, "faithfulness", user_input=q, response=a, retrieved_contexts=ctx
            )
        row.judged["answer_relevancy"] = await self._one(
            self.answer_relevancy, "answer_relevancy", user_input=q, response=a
        )
        if ref:
            row.context_precision_kind = "with_reference"
            row.judged["context_precision"] = await self._one(
                self.context_precision,
                "context_precision",
                user_input=q,
                reference=ref,
                retrieved_contexts=ctx,
            )
            row.judged["context_recall"] = await self._one(
                self.context_recall,
                "context_recall",
                user_input=q,
                retrieved_contexts=ctx,
                reference=ref,
            )
        else:
            row.context_precision_kind = "without_reference"
            row.judged["context_precision"] = await self._one(
                self.context_precision_free,
                "context_precision",
                user_input=q,
                response=a,
                retrieved_contexts=ctx,
            )
            row.judged["context_recall"] = Judged(None, NOT_APPLICABLE, "no expected_answer")


def run_rag_eval(
    config: RagpipeConfig,
    golden: GoldenSet,
    *,
    name: str | None = None,
    limit: int | None = None,
    retriever: Retriever | None = None,
    generator: LLM | None = None,
    judge_llm: LLM | None = None,
    embedder: Embedder | None = None,
    progress: Callable[[int], None] | None = None,
) -> RagEvalResult:
    """Retrieve, answer and judge the first ``limit`` golden items (all when None)."""
    items: Sequence[GoldenItem] = golden.items[:limit] if limit else golden.items
    embedder = embedder or make_embedder(config.embed)
    own = retriever is None
    retriever = retriever or Retriever(config, embedder=embedder, llm=generator)
    generator = generator or retriever.llm
    judge_config = config.eval.judge
    judge_model = judge_llm or (make_llm(judge_config) if judge_config else generator)
    judge = Judge(judge_model, embedder, config.eval.judge_timeout_s, config.eval.judge_max_tokens)
    rows: list[RagRow] = []
    try:
        for item in items:
            hits = retriever.search(item.query).hits
            started = time.perf_counter()
            reply = answer(item.query, hits, generator, config.generate.context_tokens)
            row = RagRow(
                item.id,
                item.query,
                reply.text,
                reply.not_found,
                [s.text for s in reply.sources],
                len(reply.cited),
                reply.invalid_citations,
                reply.tokens_in,
                reply.tokens_out,
                time.perf_counter() - started,
            )
            asyncio.run(judge.judge(row, item))
            rows.append(row)
            if progress is not None:
                progress(1)
    finally:
        if own:
            retriever.close()
    summary: dict[str, Interval] = {}
    counts: dict[str, dict[str, int]] = {}
    for m in RAG_METRICS:
        scored = [r.judged[m].value for r in rows if r.judged[m].status == OK]
        summary[m] = bootstrap_ci(
            [v for v in scored if v is not None], config.eval.resamples, config.eval.seed
        )
        counts[m] = {s: sum(1 for r in rows if r.judged[m].status == s)
                     for s in (OK, FAILED, NOT_APPLICABLE)}  # fmt: skip
    warnings = []
    if len(rows) < 50:
        warnings.append(f"only {len(rows)} queries (< 50): confidence intervals are wide")
    failed = sum(c[FAILED] for c in counts.values())
    if failed:
        warnings.append(f"{failed} judge call(s) failed; they are null, not 0 (see per_query)")
    judge_info = {
        "model": judge_model.name,
        "temperature": (judge_config or config.llm).temperature,
        "ragas": metadata.version("ragas"),
        "metric_classes": judge.classes,
        "timeout_s": config.eval.judge_timeout_s,
        "max_tokens": config.eval.judge_max_tokens,
        "counts": counts,
    }
    return RagEvalResult(
        name=name or f"{golden.name}-rag",
        golden=golden,
        rows=rows,
        summary=summary,
        counts=counts,
        judge=judge_info,
        generator=generator.name,
        warnings=warnings,
        resamples=config.eval.resamples,
        seed=config.eval.seed,
    )
