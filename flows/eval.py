"""Evaluation flows: replay the golden set through the retrieval stack, report.

``eval-retrieval`` scores one configuration; ``eval-rag`` answers and judges
with RAGAS; ``eval-compare`` scores several
over the same queries with paired deltas against the first, and can gate on
a metric; ``eval-tune`` searches the retrieval settings on part of the golden
set and confirms the pick on the rest. All write
``eval/reports/<timestamp>-<name>/`` and publish Prefect artifacts (keys
``eval-retrieval-*``, ``eval-rag-*``, ``eval-compare-*``, ``eval-tune-summary``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from flows.logs import library_logs
from ragpipe.config import RagpipeConfig, load_config
from ragpipe.errors import GateFailed
from ragpipe.evaluate import Gate, Variant
from tasks.eval import (
    publish_eval_task,
    publish_tune_task,
    rag_eval_task,
    retrieval_eval_task,
    tune_task,
)


def _config(config: RagpipeConfig | None, config_path: str | None) -> RagpipeConfig:
    return config if config is not None else load_config(Path(config_path) if config_path else None)


@flow(name="eval-retrieval", log_prints=False)
def eval_retrieval_flow(
    config: RagpipeConfig | None = None,
    config_path: str | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """Score the retrieval stack in ``config.retrieve`` on ``config.eval.golden``.

    Returns summary.json's content plus ``report_dir``.
    """
    library_logs()
    summary = retrieval_eval_task(_config(config, config_path), None, name)
    publish_eval_task(summary, "eval-retrieval")
    return summary


@flow(name="eval-rag", log_prints=False)
def eval_rag_flow(
    config: RagpipeConfig | None = None,
    config_path: str | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """Retrieve → generate → judge (RAGAS) on ``config.eval.golden``; write the report.

    The judge is ``config.eval.judge`` (default: the generator, ``config.llm``);
    ``config.eval.rag_limit`` bounds the number of questions.
    """
    library_logs()
    summary = rag_eval_task(_config(config, config_path), name)
    publish_eval_task(summary, "eval-rag")
    return summary


@flow(name="eval-compare", log_prints=False)
def eval_compare_flow(
    variants: dict[str, dict[str, Any]],
    config: RagpipeConfig | None = None,
    config_path: str | None = None,
    name: str | None = None,
    gate_metric: str | None = None,
    gate_threshold: float = 0.0,
) -> dict[str, Any]:
    """Score several retrieval settings over the same queries; the first is the baseline.

    Args:
        variants: name -> ``retrieve.*`` overrides, e.g.
            ``{"dense": {"mode": "dense"}, "hybrid": {"mode": "hybrid"}}``.
        gate_metric: Fail the run (after the report is written) when this
            metric's delta CI lies entirely below ``gate_threshold`` for any variant.
    """
    library_logs()
    if len(variants) < 2:
        raise ValueError("eval-compare needs at least two variants")
    gate = Gate(gate_metric, gate_threshold) if gate_metric else None
    chosen = [Variant(k, dict(v)) for k, v in variants.items()]
    summary = retrieval_eval_task(_config(config, config_path), chosen, name, gate)
    publish_eval_task(summary, "eval-compare")
    if summary["gate"] and not summary["gate"]["passed"]:
        raise GateFailed("; ".join(summary["gate"]["failures"]))
    return summary


@flow(name="eval-tune", log_prints=False)
def eval_tune_flow(
    config: RagpipeConfig | None = None,
    config_path: str | None = None,
    name: str | None = None,
    metric: str = "ndcg@10",
    share: float = 0.5,
    write_config: str | None = None,
) -> dict[str, Any]:
    """Tune ``retrieve.*`` on ``config.eval.golden`` with a seeded hold-out.

    Args:
        metric: What the search maximises on the tuning queries, and what the
            held-out verdict is about (one of ragpipe's metric names).
        share: Share of the golden queries that tune (seed ``eval.seed``); the
            rest only confirm.
        write_config: Also write the tuned config YAML here when the verdict is
            ``recommend`` (it is always in the run directory as tuned.yaml).

    Returns tune.json's content plus ``report_dir``: the decision (recommend,
    refused, no change), the changed settings, and the held-out deltas.
    """
    library_logs()
    summary = tune_task(
        _config(config, config_path), metric, share, name, config_path, write_config
    )
    publish_tune_task(summary)
    return summary
