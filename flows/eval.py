"""Evaluation flows: replay the golden set through the retrieval stack, report.

``eval-retrieval`` scores one configuration; ``eval-rag`` answers and judges
with RAGAS; ``eval-compare`` scores several retrieval settings over the same
queries with paired deltas against a baseline, and can gate on a metric;
``eval-tune`` searches the retrieval settings on part of the golden set and
confirms the pick on the rest. All write ``eval/reports/<timestamp>-<name>/``
and publish Prefect artifacts (keys ``eval-retrieval-*``, ``eval-rag-*``,
``eval-compare-*``, ``eval-tune-summary``).

Each comes twice under one flow name: the deployed flow (``*_flow``) takes a
small typed form whose empty fields keep the configured value (see
``ragpipe.evaluation.forms``); the CLI and library callers hand a ready configuration to
the twin (``evaluate_retrieval``, ``evaluate_rag``, ``compare_retrieval``,
``tune_retrieval``).
"""

from __future__ import annotations

from typing import Annotated, Any

from prefect import flow
from pydantic import BeforeValidator, Field

from flows.events import emit_eval_gate_failed
from flows.logs import library_logs
from ragpipe.config import (
    DEFAULT_CONFIG_FILE,
    FusionMethod,
    RagpipeConfig,
    RetrievalMode,
)
from ragpipe.errors import ConfigError, GateFailed
from ragpipe.evaluation.forms import (
    CURRENT,
    Alpha,
    Count,
    Granularity,
    MetricName,
    Number,
    VariantForm,
    Weight,
    form_config,
    refuse_bool,
)
from ragpipe.evaluation.names import DEEPEST_CUTOFF
from ragpipe.evaluation.retrieval import Gate, Variant
from ragpipe.evaluation.run import RunSummary
from ragpipe.evaluation.tune import TuneSummary
from tasks.eval import (
    publish_eval_task,
    publish_tune_task,
    rag_eval_task,
    retrieval_eval_task,
    tune_task,
)

# A boolean is refused where a number goes (pydantic reads true as 1): see refuse_bool.
Share = Annotated[float, Field(gt=0, lt=1), BeforeValidator(refuse_bool)]
# Results ranked per query: the deepest metric cutoff (recall@10, NDCG@10) or more.
Depth = Annotated[int, Field(ge=DEEPEST_CUTOFF), BeforeValidator(refuse_bool)]


def _from_form(config_path: str | None, **values: Any) -> RagpipeConfig:
    library_logs()  # first, so that the configuration's sources reach the run's log
    return form_config(config_path, values)


@flow(name="eval-retrieval", log_prints=False)
def evaluate_retrieval(config: RagpipeConfig, name: str | None = None) -> RunSummary:
    """Score the retrieval stack in ``config.retrieve`` on ``config.eval.golden``.

    Returns the run's summary (summary.json's content, and ``report_dir``).
    """
    library_logs()
    summary = retrieval_eval_task(config, None, name)
    publish_eval_task(config, summary, "eval-retrieval")
    return summary


@flow(name="eval-retrieval", log_prints=False)
def eval_retrieval_flow(
    golden: str | None = None,
    mode: RetrievalMode | None = None,
    fusion_method: FusionMethod | None = None,
    alpha: Alpha | None = None,
    dense_weight: Weight | None = None,
    sparse_weight: Weight | None = None,
    depth: Depth | None = None,
    rerank: bool | None = None,
    granularity: Granularity | None = None,
    skip_unmatched: bool | None = None,
    name: str | None = None,
    config_path: str | None = None,
) -> RunSummary:
    """Score the retrieval stack on a golden set and write the report.

    Empty fields keep the configured value. The base is the config file; RAGPIPE_*
    variables on the worker override it; the fields here override both.

    Args:
        golden: Golden set YAML to replay, e.g. eval/golden/r-faq-dev.yaml (eval.golden).
        mode: dense, sparse (BM25) or hybrid (retrieve.mode).
        fusion_method: How hybrid fuses the dense and BM25 lists (retrieve.fusion_method).
        alpha: Dense share of a convex fusion, 0 to 1 (retrieve.alpha).
        dense_weight: Weight of the dense list in rrf/dbsf fusion (retrieve.dense_weight).
        sparse_weight: Weight of the BM25 list in rrf/dbsf fusion (retrieve.sparse_weight).
        depth: Results retrieved and scored per query (eval.depth, default 10).
        rerank: Rerank with retrieve.reranker (a cross-encoder, or llm).
        granularity: chunk scores the golden set's chunk targets; file de-duplicates by file.
        skip_unmatched: Leave out golden items whose targets cannot be scored on the index
            (the report counts them) instead of failing the run (eval.skip_unmatched).
        name: Run name, the report folder's suffix (default: the golden set's name).
        config_path: YAML config used as the base (default: ragpipe.yaml in the worker's
            directory, RAGPIPE_HOME).
    """
    config = _from_form(
        config_path, golden=golden, mode=mode, fusion_method=fusion_method, alpha=alpha,
        dense_weight=dense_weight, sparse_weight=sparse_weight, depth=depth, rerank=rerank,
        granularity=granularity, skip_unmatched=skip_unmatched,
    )  # fmt: skip
    return evaluate_retrieval.fn(config, name)


@flow(name="eval-rag", log_prints=False)
def evaluate_rag(config: RagpipeConfig, name: str | None = None) -> RunSummary:
    """Retrieve → generate → judge (RAGAS) on ``config.eval.golden``; write the report.

    The judge is ``config.eval.judge`` (default: the generator, ``config.llm``);
    ``config.eval.rag_limit`` bounds the number of questions.
    """
    library_logs()
    summary = rag_eval_task(config, name)
    publish_eval_task(config, summary, "eval-rag")
    return summary


@flow(name="eval-rag", log_prints=False)
def eval_rag_flow(
    golden: str | None = None,
    sample: Count | None = None,
    mode: RetrievalMode | None = None,
    fusion_method: FusionMethod | None = None,
    dense_weight: Weight | None = None,
    sparse_weight: Weight | None = None,
    top_k: Count | None = None,
    rerank: bool | None = None,
    skip_unmatched: bool | None = None,
    labels: str | None = None,
    name: str | None = None,
    config_path: str | None = None,
) -> RunSummary:
    """Answer the golden questions with cited sources, score them, and judge them.

    Empty fields keep the configured value. The base is the config file; RAGPIPE_*
    variables on the worker override it; the fields here override both. The
    generator and the judge are the config's llm and eval.judge sections.

    Args:
        golden: Golden set YAML, e.g. eval/golden/r-faq-dev.yaml (eval.golden).
        sample: Judge a sample of N questions (every one equally likely, strata in
            proportion), the same for the same seed (eval.rag_sample). The run logs its
            expected duration after the judge's probe.
        mode: dense, sparse (BM25) or hybrid (retrieve.mode).
        fusion_method: How hybrid fuses the dense and BM25 lists (retrieve.fusion_method).
        dense_weight: Weight of the dense list in rrf/dbsf fusion (retrieve.dense_weight).
        sparse_weight: Weight of the BM25 list in rrf/dbsf fusion (retrieve.sparse_weight).
        top_k: Chunks handed to the generator as numbered sources (retrieve.top_k).
        rerank: Rerank with retrieve.reranker (a cross-encoder, or llm).
        skip_unmatched: Leave out golden items whose targets cannot be scored on the index
            (the report counts them) instead of failing the run (eval.skip_unmatched).
        labels: Human labels file (CSV item_id,metric,value) for prediction-powered
            estimates of the judged metrics (eval.labels).
        name: Run name, the report folder's suffix (default: the golden set's name).
        config_path: YAML config used as the base (default: ragpipe.yaml in the worker's
            directory, RAGPIPE_HOME).
    """
    config = _from_form(
        config_path, golden=golden, sample=sample, mode=mode,
        fusion_method=fusion_method,
        dense_weight=dense_weight, sparse_weight=sparse_weight, top_k=top_k, rerank=rerank,
        skip_unmatched=skip_unmatched, labels=labels,
    )  # fmt: skip
    return evaluate_rag.fn(config, name)


@flow(name="eval-compare", log_prints=False)
def compare_retrieval(
    config: RagpipeConfig,
    variants: list[Variant],
    name: str | None = None,
    gate: Gate | None = None,
) -> RunSummary:
    """Score several retrieval settings over the same queries; the first is the baseline.

    Raises:
        GateFailed: ``gate`` is set and a variant's delta CI of its metric lies
            entirely below its threshold (with no CI: every paired query's equal delta
            is below it, or fewer than 10 queries were paired). The report and
            artifacts are written first; the flow run ends Failed.
    """
    library_logs()
    if len(variants) < 2:
        raise ConfigError("eval-compare needs a baseline and at least one other variant")
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ConfigError(f"eval-compare: variant names must differ, got {names}")
    summary = retrieval_eval_task(config, variants, name, gate)
    publish_eval_task(config, summary, "eval-compare")
    if summary.gate is not None and not summary.gate.passed:
        emit_eval_gate_failed(config, summary.gate.failures, summary.report_dir)
        raise GateFailed("; ".join(summary.gate.failures))
    return summary


@flow(name="eval-compare", log_prints=False)
def eval_compare_flow(
    variants: list[VariantForm],
    baseline: VariantForm = CURRENT,
    golden: str | None = None,
    granularity: Granularity | None = None,
    depth: Depth | None = None,
    gate_metric: MetricName | None = None,
    gate_threshold: Number = 0.0,
    skip_unmatched: bool | None = None,
    name: str = "compare",
    config_path: str | None = None,
) -> RunSummary:
    """Compare retrieval settings with the baseline on the same queries.

    Paired deltas (variant minus baseline) with bootstrap 95% CIs and permutation
    p-values. With a gate metric, the run ends Failed when a variant is worse
    than the baseline beyond the threshold, so an automation can notify.

    Args:
        variants: The settings to compare with the baseline, in report order; each has a
            name and the retrieve settings it changes, e.g. name hybrid, mode hybrid.
        baseline: What every variant is compared with; the default, named current, is
            the configuration unchanged.
        golden: Golden set YAML, e.g. eval/golden/r-faq-dev.yaml (eval.golden).
        granularity: chunk scores the golden set's chunk targets; file de-duplicates by file.
        depth: Results retrieved and scored per query (eval.depth, default 10).
        gate_metric: Fail the run when this metric's delta CI lies entirely below
            gate_threshold for any variant (with no CI: when every query's equal
            delta is below it, or fewer than 10 queries are paired). Empty: no gate.
        gate_threshold: The gate's bound on the delta, e.g. -0.02 tolerates a small loss.
        skip_unmatched: Leave out golden items whose targets cannot be scored on the index
            (the report counts them) instead of failing the run (eval.skip_unmatched).
        name: Run name, the report folder's suffix.
        config_path: YAML config used as the base (default: ragpipe.yaml in the worker's
            directory, RAGPIPE_HOME).
    """
    config = _from_form(
        config_path, golden=golden, granularity=granularity, depth=depth,
        skip_unmatched=skip_unmatched,
    )  # fmt: skip
    chosen = [Variant(v.name, v.overrides()) for v in (baseline, *variants)]
    gate = Gate(gate_metric, gate_threshold) if gate_metric else None
    return compare_retrieval.fn(config, chosen, name, gate)


@flow(name="eval-tune", log_prints=False)
def tune_retrieval(
    config: RagpipeConfig,
    config_path: str | None = None,
    name: str | None = None,
    metric: str = "ndcg@10",
    share: float = 0.5,
    write_config: str | None = None,
    llm_options: bool = False,
    ingest_options: bool = False,
) -> TuneSummary:
    """Tune ``retrieve.*`` on ``config.eval.golden`` with a seeded hold-out.

    Args:
        config_path: The config file ``config`` came from; tuned.yaml keeps its other
            sections.
        metric: What the search maximises on the tuning queries, and what the
            held-out verdict is about (one of ragpipe's metric names).
        share: Share of the golden queries that tune (seed ``eval.seed``); the
            rest only confirm.
        write_config: Also write the tuned config YAML here when the verdict is
            ``recommend`` (it is in the run directory as tuned.yaml too; a ``recommend,
            not significant`` pick is kept there only, as tuned-not-significant.yaml).
        llm_options: Also try the settings that call the LLM per query (LLM rerank,
            adaptive HyDE): seconds per candidate on a CPU.
        ingest_options: Also try the chunk settings (``chunk.whole_sections``), each on
            a second index of the sources built in ``<work_dir>.tune/``.

    Returns the tune run's summary (tune.json's content, and ``report_dir``): the
    decision (recommend; recommend, not significant; refused; no change), the changed
    settings, and the held-out deltas.
    """
    library_logs()
    summary = tune_task(
        config, metric, share, name, config_path, write_config, llm_options, ingest_options
    )
    publish_tune_task(config, summary)
    return summary


@flow(name="eval-tune", log_prints=False)
def eval_tune_flow(
    golden: str | None = None,
    granularity: Granularity | None = None,
    metric: MetricName = "ndcg@10",
    share: Share = 0.5,
    write_config: str | None = None,
    skip_unmatched: bool | None = None,
    name: str | None = None,
    config_path: str | None = None,
    llm_options: bool = False,
    ingest_options: bool = False,
) -> TuneSummary:
    """Tune the retrieve settings on a golden set, with an honest hold-out.

    A seeded split: the search picks settings on the tuning share only, then the pick
    and the current settings are scored on the held-out queries. Verdict: recommend
    (tuned.yaml written), recommend, not significant (kept in the run folder as
    tuned-not-significant.yaml, not written to write_config), refused, or no change. A
    golden set that would hold out fewer than 6 queries (the sign-flip test cannot reach
    p < 0.05 on them) is refused first.

    Args:
        golden: Golden set YAML, e.g. eval/golden/r-faq-dev.yaml (eval.golden).
        granularity: chunk scores the golden set's chunk targets; file de-duplicates by file.
        metric: What the search maximises and the held-out verdict is about.
        share: Share of the golden queries that tune (0 to 1); the rest only confirm.
        write_config: Also write the tuned config YAML to this path when the verdict is
            recommend (it is in the run folder as tuned.yaml too; a recommend, not
            significant pick stays in the run folder only, as tuned-not-significant.yaml).
        skip_unmatched: Leave out golden items whose targets cannot be scored on the index
            (the report counts them) instead of failing the run (eval.skip_unmatched).
        name: Run name, the report folder's suffix (default: the golden set's name + -tune).
        config_path: YAML config used as the base (default: ragpipe.yaml in the worker's
            directory, RAGPIPE_HOME).
        llm_options: Also try LLM rerank and adaptive HyDE (LLM calls per query).
        ingest_options: Also try chunk.whole_sections, on a second index of the sources
            that the run builds (every chunk embedded again; conversions reused).
    """
    config = _from_form(
        config_path, golden=golden, granularity=granularity, skip_unmatched=skip_unmatched
    )
    base = config_path or (str(DEFAULT_CONFIG_FILE) if DEFAULT_CONFIG_FILE.is_file() else None)
    return tune_retrieval.fn(
        config, base, name, metric, share, write_config, llm_options, ingest_options
    )
