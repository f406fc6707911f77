"""Retrieval evaluation end to end on the real index: per-query rows, exact metric
values, compare with paired deltas and a gate, reports, history, flows, CLI."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from ragpipe.config import RagpipeConfig
from ragpipe.errors import ConfigError
from ragpipe.evaluation.golden import load_golden
from ragpipe.evaluation.metrics import METRICS, query_metrics
from ragpipe.evaluation.retrieval import (
    Gate,
    Granularity,
    Variant,
    judged_hits,
    parse_variant,
    run_retrieval_eval,
)
from ragpipe.evaluation.run import (
    RETRIEVAL_QUERY_SCHEMA,
    RunSummary,
    read_history,
    run_retrieval,
)
from ragpipe.query.retrieve import Retriever

pytestmark = pytest.mark.integration

GOLDEN = """
name: query-corpus
items:
  - id: calvin
    query: How does the Calvin cycle fix carbon dioxide?
    relevance: {photosynthesis.md: 3}
    chunks: [{file: science/photosynthesis.md, heading: Calvin cycle, grade: 3}]
  - id: lovelace
    query: Who wrote the first program for the Analytical Engine?
    relevance: {history/computing.md: 2}
    chunks: [{file: computing.md, contains: Analytical Engine, grade: 2}]
  - id: restore
    query: How do I restore the database from a backup?
    relevance: {ops/backups.md: 3, ops/backups-copy.md: 1}
    chunks: [{file: ops/backups.md, heading: Restore, grade: 3}]
  - id: oven
    query: How hot should the oven be for bread?
    relevance: {bread.md: 3}
    chunks: [{file: bread.md, heading: Oven, grade: 3}]
"""


@pytest.fixture
def eval_config(indexed_edge: RagpipeConfig, tmp_path: Path) -> RagpipeConfig:
    golden = tmp_path / "golden.yaml"
    golden.write_text(GOLDEN, encoding="utf-8")
    return indexed_edge.model_copy(
        update={
            "eval": indexed_edge.eval.model_copy(
                update={"golden": golden, "reports_dir": tmp_path / "reports", "resamples": 200}
            )
        }
    )


def test_rows_and_metric_values_follow_the_retrieved_ranks(eval_config: RagpipeConfig) -> None:
    golden = load_golden(eval_config.eval.golden)
    variants = [Variant("dense", {"mode": "dense"}),
                Variant("nothing", {"mode": "dense", "filter_file": "no/such.md"})]  # fmt: skip
    with Retriever(eval_config) as r:
        with pytest.raises(ConfigError, match=r"depth 5 .* is below 10, the deepest cutoff"):
            run_retrieval_eval(eval_config, golden, variants, depth=5, retriever=r)  # @10 of 5
        result = run_retrieval_eval(eval_config, golden, variants, depth=10, retriever=r)
        for row in (x for x in result.rows if x.variant == "dense"):
            item = next(i for i in golden.items if i.id == row.item_id)
            hits = r.search(item.query, mode="dense", top_k=10).hits
            target = item.chunks[0]
            ranks = [n for n, h in enumerate(hits, start=1) if target.matches(h.payload)]
            assert row.retrieved[ranks[0] - 1] == target.key  # the target counts once, first
            assert row.metrics["mrr"] == 1 / ranks[0]
            assert row.metrics == query_metrics(row.retrieved, {target.key: target.grade})
    assert len(result.rows) == 2 * len(golden.items)  # every query, every variant
    empty = [x for x in result.rows if x.variant == "nothing"]
    assert all(x.retrieved == [] and set(x.metrics.values()) == {0.0} for x in empty)
    dense = result.summary["dense"]
    assert set(dense) == set(METRICS) and dense["mrr"].n == 4
    assert dense["mrr"].mean == pytest.approx(
        sum(x.metrics["mrr"] for x in result.rows if x.variant == "dense") / 4
    )
    assert result.warnings and "only 4 queries" in result.warnings[0]
    # A filter scores every item outside it 0 whatever the ranking: said (it was not).
    assert result.warnings[1] == (
        "nothing: searches only what filter_file='no/such.md' lets through; an item whose "
        "targets lie outside it scores 0, whatever the ranking (a filter set for one team's "
        "search is no setting to evaluate the index with)"
    )
    _agrees_with_trec_eval(result.rows)


def _agrees_with_trec_eval(rows: list[Any]) -> None:
    """The run's own per-query numbers, recomputed by trec_eval (pytrec_eval)."""
    import pytrec_eval

    names = {"recall@5": "recall_5", "recall@10": "recall_10", "precision@5": "P_5",
             "mrr": "recip_rank", "map": "map", "ndcg@10": "ndcg_cut_10"}  # fmt: skip
    key = {id(r): f"{r.variant}/{r.item_id}" for r in rows}
    qrels = {key[id(r)]: r.relevant for r in rows}
    run = {key[id(r)]: {d: float(100 - i) for i, d in enumerate(r.retrieved)} for r in rows}
    trec = pytrec_eval.RelevanceEvaluator(qrels, set(names.values())).evaluate(
        {q: docs for q, docs in run.items() if docs}
    )
    for r in rows:
        for ours, theirs in names.items():
            expected = trec[key[id(r)]][theirs] if r.retrieved else 0.0
            assert r.metrics[ours] == pytest.approx(expected, abs=1e-9)


def test_at_5_scores_what_a_search_for_top_k_returns(
    eval_config: RagpipeConfig, tiny_cross_encoder: Path
) -> None:
    """The eval searches 10 deep, yet its first top_k are the variant's own search for
    top_k: a reranked, diversified or boosted pool follows from the settings (a search
    asked for 10 used to rerank 40 candidates where the configured search reranks 8)."""
    golden = load_golden(eval_config.eval.golden)
    reranker = {"rerank": True, "reranker": str(tiny_cross_encoder), "top_k": 2}
    variants = [Variant("rerank", reranker),
                Variant("mmr", {"mmr": True, "mmr_lambda": 0.3, "top_k": 2})]  # fmt: skip
    with Retriever(eval_config) as r:
        result = run_retrieval_eval(eval_config, golden, variants, depth=10, retriever=r)
        for row in result.rows:
            item = next(i for i in golden.items if i.id == row.item_id)
            overrides = next(v.overrides for v in variants if v.name == row.variant)
            own = r.search(item.query, **overrides).hits
            # Searched past top_k: every one of the corpus's nine chunks, the depth being 10.
            assert len(own) == 2 and len(row.retrieved) == 9
            assert row.retrieved[:2] == judged_hits(own, item, Granularity.CHUNK)[0]
    # The settings reported are the variant's, the depth apart.
    assert result.settings["rerank"]["top_k"] == 2 and result.depth == 10
    # Legs of 5 (prefetch 5): the search ranks no deeper, and the run says so.
    narrow = run_retrieval_eval(eval_config, golden, [Variant("narrow", {
        "mode": "dense", "prefetch": 5})], depth=10)  # fmt: skip
    assert all(len(row.retrieved) == 5 for row in narrow.rows)
    assert any("narrow: its legs hold 5 candidates" in w for w in narrow.warnings)
    assert not any("legs hold" in w for w in result.warnings)


def test_file_granularity_deduplicates_by_file(eval_config: RagpipeConfig) -> None:
    golden = load_golden(eval_config.eval.golden)
    result = run_retrieval_eval(eval_config, golden, granularity=Granularity.FILE, depth=10)
    for row in result.rows:
        assert len(row.retrieved) == len(set(row.retrieved))
    _agrees_with_trec_eval(result.rows)
    restore = next(x for x in result.rows if x.item_id == "restore")
    assert set(restore.retrieved[:2]) == {"ops/backups.md", "ops/backups-copy.md"}
    assert restore.metrics["recall@5"] == 1.0  # both graded files found


@pytest.fixture(scope="module")
def long_file(tmp_path_factory: pytest.TempPathFactory) -> RagpipeConfig:
    """Twelve files, one of 24 install sections; prefetch 10; a golden set of 12 install
    questions, each targeting one short install page (gadget.md, widget.md)."""
    from ragpipe.ingest.pipeline import run_ingest
    from tests.support.corpora import INSTALL_QUERIES, long_file_project

    base = tmp_path_factory.mktemp("long-file")
    cfg = long_file_project(base)
    assert run_ingest(cfg).failed == 0
    items = [
        {"id": f"q{i:02d}", "query": q, "relevance": {"widget.md" if i % 2 else "gadget.md": 1}}
        for i, q in enumerate(INSTALL_QUERIES)
    ]
    golden = base / "install.yaml"
    golden.write_text(yaml.safe_dump({"name": "install", "items": items}), encoding="utf-8")
    evaluation = {"golden": golden, "reports_dir": base / "reports", "resamples": 200,
                  "granularity": "file"}  # fmt: skip
    return cfg.model_copy(update={"eval": cfg.eval.model_copy(update=evaluation)})


def test_a_long_file_filling_the_candidates_leaves_ten_files_ranked_all_the_same(
    long_file: RagpipeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review: a file whose chunks fill the search's candidates (prefetch=40, a file of 60
    install sections) ranked that file alone; recall@10 was 0.125 over one file, nothing said
    so, and prefetch 80 scored 1.0 with the user's top 5 unchanged."""
    golden = load_golden(long_file.eval.golden)
    variants = [Variant("p10"), Variant("p20", {"prefetch": 20}),
                Variant("p40", {"prefetch": 40}), Variant("bm25", {"mode": "sparse"})]  # fmt: skip
    with Retriever(long_file) as r:
        result = run_retrieval_eval(
            long_file, golden, variants, granularity=Granularity.FILE, resamples=200, retriever=r
        )
        own = {i.query: r.search(i.query, depth=10).hits for i in golden.items}
        deep = {i.query: r.search(i.query, depth=40, prefetch=40).hits for i in golden.items}
    rows = {(x.variant, x.item_id): x for x in result.rows}
    for item in golden.items:
        # The variant's own ten candidates: long.md's chunks, all but one query's.
        held = {h.file_path for h in own[item.query]}
        assert held == {next(h.file_path for h in own[item.query])} or item.id == "q10"
        row = rows["p10", item.id]
        # Ten files, its own first, then in the order of the same settings searched deeper.
        order: list[str] = []
        for h in [*own[item.query], *deep[item.query]]:
            key = next((k for k in item.relevance if h.file_path.endswith("/" + k)), h.file_path)
            order += [key] if key not in order else []
        assert row.retrieved == order[:10] and len(row.retrieved) == 10
        assert row.metrics["recall@10"] == 1.0  # it scored 0: only long.md was ranked
        # A larger prefetch ranks the same files: it cannot win by letting more in.
        assert rows["p20", item.id].retrieved == rows["p40", item.id].retrieved == row.retrieved
        assert row.pool is not None and row.pool.first_files == len(held)
        assert (row.pool.first_chunks, row.pool.chunks, row.pool.prefetch) == (10, 40, 40)
        assert rows["bm25", item.id].pool.files == 3  # type: ignore[union-attr]
    # gadget.md third, widget.md second (by hand, from the rankings above): 1/3 and 1/2.
    assert result.summary["p10"]["mrr"].mean == pytest.approx(5 / 12)
    assert all(d.interval.mean == 0 for d in result.deltas["p40"].values())
    assert result.warnings[1:] == [
        "p10: 12 of 12 queries' candidates (10 chunks, prefetch=10) held fewer than 10 files "
        "(fewest: 1): several chunks of one file rank one file. The files after them were "
        "ranked by the same settings searched deeper (prefetch up to 40); a user's search "
        "sees only the first files",
        "p20: 12 of 12 queries' candidates (20 chunks, prefetch=20) held fewer than 10 files "
        "(fewest: 1): several chunks of one file rank one file. The files after them were "
        "ranked by the same settings searched deeper (prefetch up to 40); a user's search "
        "sees only the first files",
        "bm25: 12 of 12 queries' candidates (10 chunks) held fewer than 10 files (fewest: 1): "
        "several chunks of one file rank one file. The files after them were ranked by the "
        "same settings searched deeper (depth up to 40); a user's search sees only the first "
        "files",
        # BM25 reaches only the three files with an install word; p40 reached every chunk.
        "bm25: 12 of 12 queries ranked fewer than 10 files (fewest: 3; the first search's "
        "candidates held 1): their search reaches no other file (BM25 alone ranks only chunks "
        "that share a word with the query). Their metrics are over fewer than 10 files",
    ]
    # The same warnings in the summary and the report (the CLI prints the summary's).
    _, run = run_retrieval(long_file, variants[:1])
    assert run.warnings == result.warnings[:2]
    assert (
        f"> **warning:** {result.warnings[1]}" in (Path(run.report_dir) / "report.md").read_text()
    )
    # The deeper searches are bounded (FILE_POOL_LIMIT, 2560 chunks): one that stops there
    # ranks fewer files, and says why.
    monkeypatch.setattr("ragpipe.evaluation.retrieval.FILE_POOL_LIMIT", 20)
    bounded = run_retrieval_eval(long_file, golden, variants[:1], granularity=Granularity.FILE)
    pools = [x.pool for x in bounded.rows]
    assert [(p.chunks, p.exhausted) for p in pools if p] == [(20, False)] * 12
    assert bounded.warnings[-1] == (
        "p10: 12 of 12 queries ranked fewer than 10 files (fewest: 1; the first search's "
        "candidates held 1): 12 stopped at the bound of 20 chunks. Their metrics are over "
        "fewer than 10 files"
    )


def test_compare_gate_and_report_files(eval_config: RagpipeConfig) -> None:
    broken = {"mode": "dense", "filter_file": "kitchen/bread.md"}
    variants = [Variant("dense", {"mode": "dense"}), Variant("broken", broken)]
    result, run = run_retrieval(eval_config, variants, name="gate test", gate=Gate("mrr", -0.1))
    out = Path(run.report_dir)
    # 4 paired queries: too few for a CI (the review: 2 chance deltas' "CI" failed a gate).
    assert not result.passed and result.gate_failures == [
        "broken: mrr delta has no CI (4 paired queries): the gate cannot hold on fewer than 10"
    ]
    delta = result.deltas["broken"]["mrr"]
    assert delta.interval.mean < -0.1 and not delta.interval.has_ci and 0 < delta.p_value <= 1
    table = pq.read_table(out / "per_query.parquet")
    assert table.num_rows == 8 and table.schema.equals(RETRIEVAL_QUERY_SCHEMA)
    summary = json.loads((out / "summary.json").read_text())
    # The typed summary the run returns is what summary.json holds.
    assert RunSummary.from_json(summary, str(out)) == run and run.gate_failed
    assert summary["gate"]["passed"] is False and summary["baseline"] == "dense"
    assert summary["statistics"]["resamples"] == 200 and summary["corpus"]["files"] == 5
    assert summary["versions"]["qdrant-edge-py"] and summary["models"]["embedder"]
    assert summary["deltas"]["broken"]["mrr"]["ci_high"] is None  # 4 queries: no CI
    page = (out / "report.html").read_text()
    assert page.count("<svg") == 3 and "Deltas vs baseline" in page
    # The drill-down: the worst questions first (by the baseline's ndcg@10), each with
    # what was expected and both variants' ranked lists, hits marked.
    rows = [r for r in table.to_pylist() if r["variant"] == "dense"]
    worst = min(rows, key=lambda r: (r["ndcg@10"], r["mrr"], r["item_id"]))
    drill = page[page.index("<h2>Worst 4 of 4 questions (by ndcg@10 of dense)</h2>") :]
    assert drill.count("<details>") == 4
    assert drill.index(html.escape(worst["query"])) < drill.index("</details>")
    first = drill[: drill.index("</details>")]
    assert "expected:" in first and "<b>dense</b> retrieved" in first
    assert "<b>broken</b> retrieved" in first
    # Every rank reads as file, heading path and snippet, never as a point id; the
    # per-query table keeps them per rank.
    assert len(worst["retrieved_files"]) == len(worst["retrieved"]) > 0
    for key, file, heading, snippet in zip(
        worst["retrieved"], worst["retrieved_files"], worst["retrieved_headings"],
        worst["retrieved_snippets"], strict=True,
    ):  # fmt: skip
        if key not in json.loads(worst["relevant"]):
            assert key not in first  # a miss's id is a point UUID: not shown
        assert f"<b>{html.escape(file)}</b>" in first and html.escape(snippet) in first
        assert not heading or f" › {html.escape(heading)}" in first
    hit_row = next(r for r in rows if r["ndcg@10"] > 0)
    relevant = json.loads(hit_row["relevant"])
    hit_rank = next(i for i, k in enumerate(hit_row["retrieved"]) if k in relevant)
    assert hit_row["retrieved_files"][hit_rank].endswith(
        next(iter(relevant)).split("#")[0].split("/")[-1]
    )
    assert "✓ relevant, grade" in page
    assert "| mrr |" in (out / "report.md").read_text()
    history = read_history(eval_config.eval.reports_dir)
    assert {(r["variant"], r["metric"]) for r in history} == {
        (v, m) for v in ("dense", "broken") for m in METRICS
    }


def test_bad_variants_fail_before_any_search(eval_config: RagpipeConfig) -> None:
    golden = load_golden(eval_config.eval.golden)
    with pytest.raises(ConfigError, match="variant 'w'"):
        run_retrieval_eval(eval_config, golden, [Variant("w", {"fusion": "qdrant", "alpha": 0.3})])
    with pytest.raises(ConfigError, match=r"not retrieve\.KEY=VALUE"):
        parse_variant("x:colour=red")
    # A "|" split the reports' table columns: numbers under the wrong variant's heading.
    with pytest.raises(ConfigError, match=r"holds a '\|' .* name it e\.g\. sparse-bm25"):
        parse_variant("sparse|bm25:mode=sparse")
    assert parse_variant("h:mode=hybrid,fusion=client,dense_weight=2,hyde=off") == Variant(
        "h", {"mode": "hybrid", "fusion": "client", "dense_weight": 2, "hyde": False}
    )
    with pytest.raises(ConfigError, match="gate metric 'f1'"):
        run_retrieval_eval(eval_config, golden, gate=Gate("f1", 0))


@pytest.mark.slow
def test_flows_publish_artifacts_and_cli_reports(
    prefect_harness: None, eval_config: RagpipeConfig, tmp_path: Path
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.eval import eval_compare_flow, eval_retrieval_flow
    from ragpipe.config import RetrievalMode
    from ragpipe.errors import GateFailed
    from ragpipe.evaluation.forms import VariantForm

    # The deployed forms: the file is the base, the form's fields win over it.
    base = tmp_path / "base.yaml"
    settings = eval_config.model_dump(mode="json")
    settings["retrieve"]["mode"] = "sparse"
    base.write_text(yaml.safe_dump(settings), encoding="utf-8")
    summary = eval_retrieval_flow(
        config_path=str(base), mode=RetrievalMode.DENSE, depth=12, name="flow run"
    )
    assert Path(summary.report_dir, "report.html").is_file()
    assert summary.depth == 12 and summary.variants["default"]["mode"] == "dense"
    from prefect.artifacts import Artifact

    link = Artifact.get("eval-retrieval-report")
    out = Path(summary.report_dir)  # link artifacts are stored as a Markdown link
    assert link is not None and link.data == (
        f"[{out.name}/report.html]({(out / 'report.html').resolve().as_uri()})"
    )
    settings["eval"]["reports_url"] = "https://reports.example.org/rag/"
    base.write_text(yaml.safe_dump(settings), encoding="utf-8")
    kept = eval_retrieval_flow(config_path=str(base), name="from file")
    assert kept.depth == 10 and kept.variants["default"]["mode"] == "sparse"
    link = Artifact.get("eval-retrieval-report")
    url = f"https://reports.example.org/rag/{kept.run_id}/report.html"
    assert link is not None and link.data == f"[{kept.run_id}/report.html]({url})"
    summary_artifact = Artifact.get("eval-retrieval-summary")
    assert summary_artifact is not None and f"({url})" in str(summary_artifact.data)
    # The gate: "same" equals the baseline, so its delta (0) lies below a threshold of 0.5.
    with pytest.raises(GateFailed, match="same: mrr"):
        eval_compare_flow(
            [VariantForm(name="same", mode=RetrievalMode.SPARSE)],
            baseline=VariantForm(name="sparse", mode=RetrievalMode.SPARSE),
            config_path=str(base),
            gate_metric="mrr",
            gate_threshold=0.5,
        )

    async def keys() -> set[str]:
        async with get_client() as client:
            found = await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_="eval-"))
            )
        return {a.key for a in found if a.key}

    import asyncio

    assert {"eval-retrieval-summary", "eval-retrieval-metrics", "eval-retrieval-report",
            "eval-compare-summary", "eval-compare-metrics",
            "eval-compare-report"} <= asyncio.run(keys())  # fmt: skip

    runner = CliRunner()
    shown = runner.invoke(app, ["report", "--reports-dir", str(eval_config.eval.reports_dir),
                                "--metric", "ndcg@10"])  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert "flow run" in shown.output or "flow-run" in shown.output
    assert "trend of ndcg@10" in shown.output
    # --last counts runs, not variants: of the runs at depth 10, "from file" and the
    # 2-variant compare. The first run looked 12 deep: its mrr counts hits that depth 10
    # does not, so it is never on their trend (it has its own table).
    history = read_history(eval_config.eval.reports_dir)
    runs = list(dict.fromkeys(r["run_id"] for r in history))
    latest = runner.invoke(app, ["report", "--reports-dir", str(eval_config.eval.reports_dir),
                                 "--last", "1", "--metric", "mrr"], terminal_width=200)  # fmt: skip
    assert latest.exit_code == 0, latest.output
    text = " ".join(latest.output.split())
    questions = f"questions {runs and history[0]['scope'].rsplit(' ', 1)[-1]}"
    assert f"all 4 items, depth 10, {questions}: latest 1 of 2 runs" in text
    assert f"all 4 items, depth 12, {questions}: latest 1 of 1 runs" in text
    for run_id in (runs[0], runs[-1]):  # whole headers, folded rather than cut
        stamp, _, name = run_id.partition("-")
        assert stamp in latest.output and name in latest.output
    assert "…" not in latest.output
    assert runs[1].partition("-")[0] not in latest.output.split("trend of")[0]  # not the last
    two = runner.invoke(app, ["report", "--reports-dir", str(eval_config.eval.reports_dir),
                              "--last", "2", "--metric", "mrr"], terminal_width=200)  # fmt: skip
    assert f"all 4 items, depth 10, {questions}: latest 2 of 2 runs" in " ".join(two.output.split())
    # Trend bars span the shown range, so the lowest gets 1 block and the highest 40 (a
    # table of one run: 40).
    bars = {line.count("█") for line in two.output.splitlines()
            if line.startswith("  ") and "█" in line}  # fmt: skip
    means = {r["mean"] for r in history if r["metric"] == "mrr" and r["run_id"] != runs[0]}
    assert (min(bars), max(bars)) == ((1, 40) if len(means) > 1 else (40, 40))
    empty = runner.invoke(app, ["report", "--reports-dir", str(tmp_path / "none")])
    assert "no evaluation runs" in empty.output


def _cli(eval_config: RagpipeConfig, *args: str) -> Any:
    return CliRunner().invoke(
        app,
        [*args, "--golden", str(eval_config.eval.golden), "--store-path",
         str(eval_config.store.path), "--embedder", "onnx", "--reports-dir",
         str(eval_config.eval.reports_dir)],
    )  # fmt: skip


def test_a_gate_on_equal_deltas_shows_no_interval(eval_config: RagpipeConfig) -> None:
    """Two identical variants: every query's delta is 0, so there is no CI to show, and a
    gate asking for +0.05 fails on the mean, saying so."""
    variants = [Variant("dense", {"mode": "dense"}), Variant("same", {"mode": "dense"})]
    result, _ = run_retrieval(eval_config, variants, name="same", gate=Gate("mrr", 0.05))
    assert not result.passed
    n = result.deltas["same"]["mrr"].interval.n
    assert n == len(load_golden(eval_config.eval.golden).answerable) and n >= 2
    assert result.gate_failures == [
        f"same: mrr delta is +0.0000 on every one of the {n} paired queries (no CI: every "
        "delta equal), below +0.0500 (baseline dense)"
    ]


@pytest.mark.slow
def test_cli_eval_commands(prefect_harness: None, eval_config: RagpipeConfig) -> None:
    from prefect.artifacts import Artifact

    ok = _cli(eval_config, "eval", "retrieval", "--mode", "dense", "--name", "cli")
    assert ok.exit_code == 0, ok.output
    assert "report: " in ok.output and "report.html" in ok.output
    # in-process by default (no flow run, no artifact); --flow publishes the artifacts
    published = Artifact.get("eval-retrieval-report")
    assert published is None or "-cli/" not in str(published.data)
    flowed = _cli(eval_config, "eval", "retrieval", "--flow", "--name", "cli-flow")
    assert flowed.exit_code == 0, flowed.output
    published = Artifact.get("eval-retrieval-report")
    assert published is not None and "-cli-flow/report.html" in str(published.data)
    gated = _cli(eval_config, "eval", "compare", "--variant", "dense:mode=dense", "--variant",
                 "broken:filter_file=kitchen/bread.md", "--gate-metric", "mrr",
                 "--gate-threshold", "-0.1")  # fmt: skip
    assert gated.exit_code == 4 and "gate failed" in gated.output
    one = _cli(eval_config, "eval", "compare", "--variant", "dense:mode=dense")
    assert one.exit_code == 2 and "at least two" in one.output


def test_secrets_never_reach_reports(eval_config: RagpipeConfig) -> None:
    secret = "sk-very-secret-4242"
    cfg = eval_config.model_copy(
        update={
            "llm": eval_config.llm.model_copy(update={"api_key": secret}),
            "embed": eval_config.embed.model_copy(update={"ollama_api_key": secret}),
        }
    )
    cfg = RagpipeConfig.model_validate(cfg.model_dump() | {"store": {
        **cfg.store.model_dump(), "api_key": secret}})  # fmt: skip
    _, run = run_retrieval(cfg, [Variant("dense", {"mode": "dense"})], name="secrets")
    out = Path(run.report_dir)
    for path in [*out.iterdir(), cfg.eval.reports_dir / "history.parquet"]:
        assert secret.encode() not in path.read_bytes(), path
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["llm"]["api_key"] == "**********"


def test_names_with_markup_are_shown_as_written_and_escaped_in_html(
    eval_config: RagpipeConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    """A variant name went into report.html raw in the worst-questions list (stored XSS,
    served by `serve /reports/`); in the terminal Rich read "faq [v2]" as markup (shown
    "faq ") and "dense[/old]" raised MarkupError after the report was written, and every
    later `ragpipe report` too."""
    from flows.cli_eval import _print_eval, _print_history

    variants = [parse_variant("base"), parse_variant("<b>dense</b>:mode=dense"),
                parse_variant("dense[/old]:mode=dense")]  # fmt: skip
    _, summary = run_retrieval(eval_config, variants, name="faq [v2]")
    page = (Path(summary.report_dir) / "report.html").read_text(encoding="utf-8")
    assert "<b>dense</b>" not in page and "&lt;b&gt;dense&lt;/b&gt; " in page
    _print_eval(summary)
    _print_history(read_history(eval_config.eval.reports_dir), 5, "ndcg@10", "retrieval")
    shown = capsys.readouterr().out
    assert "faq [v2]" in shown and "dense[/old]" in shown


def test_a_long_run_name_is_a_bounded_folder_name_and_kept_whole_in_the_summary(
    eval_config: RagpipeConfig,
) -> None:
    """The review: `--name` of 60 times 評価 (360 bytes of UTF-8) ended in "OSError: File
    name too long" when the run folder was made, after all the scoring (eval rag: hours).
    The folder takes 100 bytes at most: the name cut at a character, then 8 hex digits of
    the whole name's SHA-256; summary.json and the history keep the whole name."""
    import hashlib
    import re

    name = "評価" * 60
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    assert digest == "01a107cb"
    _, summary = run_retrieval(eval_config, [parse_variant("base")], name=name)
    # 100 - 9 bytes for "-01a107cb" = 91: 30 whole characters of 3 bytes each.
    assert re.fullmatch(r"\d{8}T\d{6}Z-" + "評価" * 15 + "-01a107cb", summary.run_id)
    out = Path(summary.report_dir)
    assert out.name == summary.run_id and (out / "report.html").is_file()
    assert len(out.name.encode()) == 17 + 90 + 9
    stored = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert stored["name"] == name and stored["run_id"] == summary.run_id
    assert {r["name"] for r in read_history(eval_config.eval.reports_dir)} == {name}
    # Another long name with the same start is another folder.
    _, other = run_retrieval(eval_config, [parse_variant("base")], name=name + "!")
    assert other.run_id.endswith("評価-" + hashlib.sha256((name + "!").encode()).hexdigest()[:8])


def test_an_edited_golden_set_starts_a_new_trend_line_and_says_which_items(
    eval_config: RagpipeConfig,
) -> None:
    """Runs were joined by the set's name alone: an edited query or target moved the trend
    by -0.06 on an unchanged index, read as a regression."""
    from ragpipe.evaluation.report import trend_series

    golden = Path(eval_config.eval.golden)
    _, first = run_retrieval(eval_config, [Variant("dense", {"mode": "dense"})])
    edit = GOLDEN.replace("How hot should the oven be for bread?", "What bakes bread?")
    golden.write_text(edit, encoding="utf-8")
    _, edited = run_retrieval(eval_config, [Variant("dense", {"mode": "dense"})])
    _, again = run_retrieval(eval_config, [Variant("dense", {"mode": "dense"})])
    assert not any("questions of" in w for w in first.warnings + again.warnings)
    (said,) = [w for w in edited.warnings if "questions of" in w]
    assert said.startswith(
        f"the questions of 'query-corpus' changed since its last run ({first.run_id}): edited oven."
    )
    lines = {r["run_id"]: trend_series(r) for r in read_history(eval_config.eval.reports_dir)}
    assert lines[first.run_id] != lines[edited.run_id] == lines[again.run_id]
    assert first.golden.digest and first.golden.digest in lines[first.run_id]


def test_a_run_that_scores_drafts_still_names_the_questions_added(tmp_path: Path) -> None:
    """The drafts mark in the selection made the run read as scoring part of the set, so an
    added or removed question went unsaid (the review)."""
    from types import SimpleNamespace

    from ragpipe.evaluation.run import GoldenInfo, _warn_edited

    (tmp_path / "r1").mkdir()
    before = {"golden": {"items": {"a": "1", "b": "2"}, "selection": "all 2 items"}}
    (tmp_path / "r1" / "summary.json").write_text(json.dumps(before), encoding="utf-8")
    now = GoldenInfo("g", "g.yaml", 3, "all 3 items (1 unreviewed drafts)",
                     {"a": "1", "b": "2", "c": "3"})  # fmt: skip
    summary = SimpleNamespace(golden=now, warnings=[])
    _warn_edited(summary, tmp_path, "r1")  # type: ignore[arg-type]
    assert summary.warnings == [
        "the questions of 'g' changed since its last run (r1): added c. Its numbers are not "
        "comparable with that run's: the trend starts a new line"
    ]
