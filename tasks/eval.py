"""Eval tasks: the library runs the evaluation; these publish it to Prefect."""

from __future__ import annotations

import socket
from pathlib import Path

from prefect import task
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_table_artifact,
)
from prefect.cache_policies import NO_CACHE

from ragpipe.config import RagpipeConfig
from ragpipe.evaluation.report import metric_rows, report_link
from ragpipe.evaluation.retrieval import Gate, Variant
from ragpipe.evaluation.run import RunSummary, run_rag, run_retrieval
from ragpipe.evaluation.sibling import INGEST_SPACE
from ragpipe.evaluation.tune import TuneSummary, search_space, tune_and_report


@task(name="retrieval-eval", cache_policy=NO_CACHE)
def retrieval_eval_task(
    config: RagpipeConfig,
    variants: list[Variant] | None = None,
    name: str | None = None,
    gate: Gate | None = None,
) -> RunSummary:
    """Run the evaluation and write the report; returns the run's summary."""
    return run_retrieval(config, variants, name=name, gate=gate)[1]


@task(name="rag-eval", cache_policy=NO_CACHE)
def rag_eval_task(config: RagpipeConfig, name: str | None = None) -> RunSummary:
    """Retrieve, generate and judge with RAGAS; returns the run's summary."""
    return run_rag(config, name=name)[1]


@task(name="tune-retrieval", cache_policy=NO_CACHE)
def tune_task(
    config: RagpipeConfig,
    metric: str,
    share: float,
    name: str | None,
    base_config: str | None,
    write_config: str | None,
    llm_options: bool = False,
    ingest_options: bool = False,
) -> TuneSummary:
    """Tune retrieve.* with a held-out confirmation; returns the tune run's summary."""
    return tune_and_report(
        config,
        metric=metric,
        share=share,
        name=name,
        base_config=Path(base_config) if base_config else None,
        write_config=Path(write_config) if write_config else None,
        space=search_space(llm_options),
        ingest_space=INGEST_SPACE if ingest_options else None,
    )[1]


def _link(config: RagpipeConfig, out: Path, file: str, key: str) -> str:
    """A link artifact to one of the run's report files; returns the link."""
    link = report_link(config, out, file)
    served = config.eval.reports_url or config.serve.public_url
    where = "" if served else f" on {socket.gethostname()}"
    create_link_artifact(
        key=key,
        link=link,
        link_text=f"{out.name}/{file}",
        description=f"The run's full report{where}",
    )
    return link


@task(name="publish-tune", cache_policy=NO_CACHE)
def publish_tune_task(config: RagpipeConfig, summary: TuneSummary) -> None:
    """The tune report as artifacts: ``eval-tune-summary`` (Markdown), ``eval-tune-report``
    (link to report.html)."""
    out = Path(summary.report_dir)
    link = _link(config, out, "report.html", "eval-tune-report")
    create_markdown_artifact(
        key="eval-tune-summary",
        markdown=(out / "report.md").read_text(encoding="utf-8") + f"\n\n[Report]({link})\n",
        description=f"{summary.golden['name']}: {summary.decision}",
    )


@task(name="publish-eval", cache_policy=NO_CACHE)
def publish_eval_task(config: RagpipeConfig, summary: RunSummary, key: str) -> None:
    """Artifacts with stable keys: ``<key>-summary`` (Markdown), ``<key>-metrics`` (table),
    ``<key>-report`` (a link to the HTML report with its drill-down into the worst queries)."""
    out = Path(summary.report_dir)
    link = _link(config, out, "report.html", f"{key}-report")
    create_markdown_artifact(
        key=f"{key}-summary",
        markdown=(out / "report.md").read_text(encoding="utf-8")
        + f"\n\n[HTML report with the worst questions]({link})\n",
        description=f"{summary.name}: {summary.kind} metrics with 95% CIs",
    )

    create_table_artifact(
        key=f"{key}-metrics", table=metric_rows(summary), description=summary.run_id
    )
