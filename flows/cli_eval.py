"""`ragpipe eval ...` and `ragpipe report`: golden-set evaluations and their history."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from flows.cli_common import (
    ConfigOption,
    EmbedderOption,
    KOption,
    ModeOption,
    RerankOption,
    RichReporter,
    StorePathOption,
    console,
    fail,
    index_overrides,
    interruptible,
    plain_env,
    prefect_env,
)
from ragpipe.config import (
    DEFAULT_CONFIG_FILE,
    LLMConfig,
    LLMProvider,
    RagpipeConfig,
    load_config,
)
from ragpipe.errors import ConfigError, GateFailed, RagpipeError
from ragpipe.progress import set_reporter

if TYPE_CHECKING:
    from ragpipe.evaluation.run import RunSummary
    from ragpipe.evaluation.tune import TuneSummary

eval_app = typer.Typer(
    help="Evaluate retrieval on a golden set: metrics with bootstrap 95% CIs, reports.",
    no_args_is_help=True,
)

GoldenOption = Annotated[
    Path | None,
    typer.Option(help="Golden set YAML (eval.golden; default eval/golden/r-faq-dev.yaml)."),
]
GranularityOption = Annotated[
    str | None,
    typer.Option(help="chunk (the golden set's chunk targets) or file (de-duplicated by file)."),
]
NameOption = Annotated[
    str | None, typer.Option(help="Run name (report directory suffix; default: the set's name).")
]
ReportsOption = Annotated[
    Path | None, typer.Option(help="eval.reports_dir (default eval/reports).")
]
AllowDraftOption = Annotated[
    bool,
    typer.Option(
        "--allow-draft",
        help="Evaluate golden items still marked 'draft: true' (from `ragpipe golden draft`, "
        "not reviewed); without it such a set stops the run, exit 2 (eval.allow_draft).",
    ),
]
SkipUnmatchedOption = Annotated[
    bool | None,
    typer.Option(
        "--skip-unmatched/--no-skip-unmatched",
        help="Golden items whose targets cannot be scored on the index (they match nothing, or "
        "name several files): leave them out (the "
        "report counts and names them) instead of stopping with exit 2 (eval.skip_unmatched).",
        show_default=False,
    ),
]


def _eval_config(
    config: Path | None,
    store_path: Path | None,
    embedder: EmbedderOption,
    retrieve: dict[str, Any],
    evaluation: dict[str, Any],
) -> RagpipeConfig:
    overrides: dict[str, Any] = {
        "retrieve": {k: v for k, v in retrieve.items() if v is not None},
        "eval": {k: str(v) if isinstance(v, Path) else v
                 for k, v in evaluation.items() if v is not None},
    }  # fmt: skip
    overrides.update(index_overrides(store_path, embedder))
    return load_config(config, overrides)


def _stopped(
    reports_dir: Path, what: str, unwritten: str, out: Path | None = None
) -> Callable[[], str]:
    """What an evaluation stopped by Ctrl-C or SIGTERM kept, said when it stops: nothing
    (a run takes its report directory back when interrupted while writing it), or its
    whole report when the signal came after it was recorded (a flow still publishing its
    Prefect artifacts): the one this process wrote, never another run's in the same
    reports_dir. ``out``: a file written after the report (tune's --out), said too."""
    from ragpipe.evaluation.run import WRITTEN_RUN_DIRS

    before = len(WRITTEN_RUN_DIRS)
    out_before = _identity(out)

    def kept() -> str:
        new = WRITTEN_RUN_DIRS[before:]
        if not new:
            return f"the {what} stopped; {unwritten}"
        line = f"the {what} stopped after writing its report ({new[-1]})"
        picked = (new[-1] / "tuned.yaml").is_file()  # a recommend: --out was to be written
        if out is not None and picked and _identity(out) == out_before:
            line += f"; {out} was not written (the report's directory has the same file)"
        return line

    return kept


def _identity(path: Path | None) -> tuple[int, int] | None:
    """A file's inode and change time: another after it is written (replaced) again."""
    try:
        st = path.stat() if path is not None else None
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns) if st else None


def _eval_stopped(cfg: RagpipeConfig) -> Callable[[], str]:
    return _stopped(cfg.eval.reports_dir, "evaluation", "no report or history row was written")


def _metrics_table(summary: RunSummary, names: list[str], title: str) -> Table:
    from ragpipe.evaluation.report import delta_cell, headline_cell

    # Names are the user's: Rich read "faq [v2]" as markup (shown "faq "), and a variant
    # "dense[/old]" raised MarkupError after the report was written.
    table = Table(title=escape(title))
    table.add_column("metric")
    variants = list(summary.metrics)
    for v in variants:
        table.add_column(escape(v), justify="right")
    for m in names:
        row = [m]
        for v in variants:
            cell = headline_cell(summary.metrics[v][m])
            if v in summary.deltas:  # report.md's cell: the CI the gate reads, p as the test can
                cell += f"  Δ {delta_cell(summary.deltas[v][m])}"
            row.append(escape(cell))
        table.add_row(*row)
    return table


def _print_eval(summary: RunSummary) -> None:
    """The headline as report.md has it: the same cells, the same flags."""
    from ragpipe.evaluation.rag import ANSWER_METRICS, RAG_METRICS
    from ragpipe.evaluation.report import generator_line

    names = summary.metric_names
    g = summary.golden
    head = f"{summary.name}: {g.queries} queries" + (f" ({g.selection})" if g.selection else "")
    if summary.kind == "rag":
        judge = summary.judge or {}
        label = (judge.get("calibration") or {}).get("label", "judge not calibrated")
        answer = [m for m in names if m in ANSWER_METRICS]
        judged = [m for m in names if m in RAG_METRICS]
        print(f"generator: {generator_line(summary)}")  # as report.md names it
        Console().print(_metrics_table(summary, answer, f"{head}: answers (no judge)"))
        Console().print(_metrics_table(summary, judged, f"judged (RAGAS): {label}"))
    else:
        title = f"{head}, {summary.granularity} level, mean [95% CI]"
        Console().print(_metrics_table(summary, names, title))
    for warning in summary.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False,
                      soft_wrap=True)  # fmt: skip
    out = Path(summary.report_dir)
    print(f"report: {out / 'report.html'} (also report.md, summary.json, per_query.parquet)")


@eval_app.command("check")
def eval_check(
    golden: Annotated[
        Path | None,
        typer.Argument(help="Golden set YAML (default: eval.golden, eval/golden/r-faq-dev.yaml)."),
    ] = None,
    scope: Annotated[
        str,
        typer.Option(
            help="Which targets: all; file or chunk (what a retrieval run at that granularity "
            "scores); answer (what `eval rag` cites: chunk targets, else files)."
        ),
    ] = "all",
    config: ConfigOption = None,
    store_path: StorePathOption = None,
    embedder: EmbedderOption = None,
) -> None:
    """Check a golden set against the published index, and nothing else (no query runs).

    The format first (every item's fields), then every target: each file must match a file
    in the index by path suffix, each chunk target (heading or contained text) a chunk that
    scoring can credit to it. Unmatched targets are listed with their closest matches, and,
    when eval.granularity is chunk (the default) or at --scope chunk, each answerable item
    without chunk targets (a retrieval run refuses it). Exit 0 when everything matches, 2
    otherwise (or for a bad file or a missing index).
    """
    from ragpipe.evaluation.check import NO_CHUNKS, IndexView, golden_for_index
    from ragpipe.evaluation.run import load_golden_from
    from ragpipe.models.embedders import embedder_name
    from ragpipe.store import require_reader

    try:
        cfg = _eval_config(config, store_path, embedder, {}, {"golden": golden})
        loaded = load_golden_from(cfg, reviewing=True)
        store = require_reader(cfg.store, embedder_name(cfg.embed))
        try:
            # The same verdict a run reaches (a set meant for another corpus included); its
            # check lists every unmatched target.
            _, check = golden_for_index(
                loaded,
                IndexView(store),
                skip_unmatched=True,
                origin=cfg.origin("eval.golden"),
                scope=scope,
                # What a run at the configured granularity refuses (scope all), or at chunk.
                require_chunks=scope == "chunk"
                or (scope == "all" and cfg.eval.granularity == "chunk"),
            )
        finally:
            store.close()
    except RagpipeError as exc:
        fail(exc, 2)
    unanswerable = sum(1 for i in loaded.items if not i.answerable)
    print(
        f"{loaded.name} ({loaded.source}): {check.items} items ({unanswerable} answerable: "
        f"false), {check.targets} targets checked against {check.index_files} files in the index"
    )
    if loaded.drafts:
        print(f"{len(loaded.drafts)} items are drafts (draft: true): evaluations refuse them "
              "until each is reviewed and its 'draft: true' line removed")  # fmt: skip
    for warning in check.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False,
                      soft_wrap=True)  # fmt: skip
    if check.ok:
        print("ok: every target matches")
        return
    for line in check.lines():
        console.print(f"[red]unmatched:[/red] {escape(line)}", highlight=False, soft_wrap=True)
    # No chunk targets is no mismatch with the index: --skip-unmatched does not score
    # around it, the granularity or the items must change.
    chunkless = [u.item_id for u in check.unmatched if u.target == NO_CHUNKS]
    others = [u for u in check.unmatched if u.target != NO_CHUNKS]
    if others:
        items = len({u.item_id for u in others})
        console.print(
            f"[red]error:[/red] {len(others)} target(s) of {items} item(s) cannot be scored "
            "on this index; fix them, or score the rest with --skip-unmatched",
            highlight=False,
        )
    if chunkless:
        console.print(
            f"[red]error:[/red] {len(chunkless)} item(s) have no chunk targets (first: "
            f"{escape(chunkless[0])}), which chunk granularity needs: set eval.granularity: "
            "file in the configuration, or add chunks: to each item "
            "(docs/reference/golden-format.md); --skip-unmatched does not score around them",
            highlight=False,
        )
    raise typer.Exit(2)


@eval_app.command("retrieval")
def eval_retrieval(
    golden: GoldenOption = None,
    mode: ModeOption = None,
    rerank: RerankOption = None,
    granularity: GranularityOption = None,
    depth: Annotated[
        int | None, typer.Option(help="Results ranked per query: 10 or more (default 10).")
    ] = None,
    skip_unmatched: SkipUnmatchedOption = None,
    allow_draft: AllowDraftOption = False,
    name: NameOption = None,
    reports_dir: ReportsOption = None,
    config: ConfigOption = None,
    store_path: StorePathOption = None,
    embedder: EmbedderOption = None,
    as_flow: Annotated[
        bool,
        typer.Option(
            "--flow",
            help="Run as a Prefect flow (a flow run with the report's artifacts, "
            "eval-retrieval-summary/-metrics/-report, as the deployment publishes), in "
            "Prefect's ephemeral mode or on PREFECT_API_URL's server. Default: in this "
            "process, without Prefect (seconds sooner; the same report and history row).",
        ),
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Replay the golden set through the retrieval stack and write a report.

    The golden set is first checked against the index: a target that matches nothing
    stops the run (exit 2) with its closest matches, unless --skip-unmatched. Metrics per
    query (Recall@5/10, Precision@5, MRR, Success@5, Hit@3, MAP, NDCG@10 linear and
    exponential gain), means with expanded bootstrap 95% CIs (n >= 10), a history row per run.
    """
    if as_flow:
        prefect_env(verbose)
    else:
        plain_env(verbose)
    try:
        cfg = _eval_config(
            config,
            store_path,
            embedder,
            {"mode": mode, "rerank": rerank},
            {"golden": golden, "granularity": granularity, "depth": depth,
             "reports_dir": reports_dir, "skip_unmatched": skip_unmatched,
             "allow_draft": allow_draft or None},
        )  # fmt: skip
    except RagpipeError as exc:
        fail(exc, 2)
    with interruptible(_eval_stopped(cfg)):
        try:
            if as_flow:
                from flows.eval import evaluate_retrieval

                summary = evaluate_retrieval(cfg, name=name)
            else:
                from ragpipe.evaluation.run import run_retrieval

                summary = run_retrieval(cfg, None, name=name)[1]
        except RagpipeError as exc:
            fail(exc, 2)
    _print_eval(summary)


@eval_app.command("rag")
def eval_rag(
    golden: GoldenOption = None,
    limit: Annotated[
        int | None, typer.Option(help="Judge only the first N questions (eval.rag_limit).")
    ] = None,
    sample: Annotated[
        int | None,
        typer.Option(
            help="Judge a sample of N questions: every one equally likely, strata (answerable "
            "or not, target files) in proportion, the same for the same eval.seed "
            "(eval.rag_sample)."
        ),
    ] = None,
    llm: Annotated[
        LLMProvider | None,
        typer.Option(help="Generator: llamacpp (default), ollama or openai (llm.base_url)."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Generator model (llm.model): a packaged name (qwen2.5-coder-1.5b, the "
            "default; qwen2.5-coder-0.5b; smollm2-135m) or a .gguf path; an Ollama or served "
            "model's name with --llm ollama/openai."
        ),
    ] = None,
    judge_model: Annotated[
        str | None,
        typer.Option(
            help="Judge model, in eval.judge's provider (the generator's when eval.judge is "
            "unset); default: eval.judge, else the generator."
        ),
    ] = None,
    labels: Annotated[
        Path | None,
        typer.Option(
            help="Human labels (CSV item_id,metric,value) of judged metrics: each gets a "
            "prediction-powered estimate and CI beside the judge's mean (eval.labels)."
        ),
    ] = None,
    probe_size: Annotated[
        int | None,
        typer.Option(help="Judge calibration probe pairs (eval.judge_probe_size, default 24)."),
    ] = None,
    mode: ModeOption = None,
    k: KOption = None,
    skip_unmatched: SkipUnmatchedOption = None,
    allow_draft: AllowDraftOption = False,
    name: NameOption = None,
    reports_dir: ReportsOption = None,
    config: ConfigOption = None,
    store_path: StorePathOption = None,
    embedder: EmbedderOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Answer the golden questions, score the answers, and judge them with RAGAS.

    Without a judge, on every run: correctness against expected_answer (token F1, ROUGE-L,
    embedding cosine), citation precision and recall, correct refusals (answerable: false
    items) and false refusals, degenerate (looping) answers. The judge is measured first on a
    calibration probe built from the golden set and the index; below eval.judge_min_kappa
    its metrics (faithfulness, answer relevancy, context precision and recall) are headlined
    "judge unreliable" without a value, and "judge unavailable" when more than half of the
    probe's calls failed; when every one raised or timed out, the run stops before the first
    question (exit 2). Every metric shows n scored, failed and not
    applicable; a CI needs n >= 10. Slow on CPU: the expected duration is logged after the
    calibration probe; use --sample N (stratified) or --limit N.
    """
    prefect_env(verbose)
    try:
        cfg = _eval_config(
            config,
            store_path,
            embedder,
            {"mode": mode, "top_k": k},
            {"golden": golden, "rag_limit": limit, "rag_sample": sample, "reports_dir": reports_dir,
             "skip_unmatched": skip_unmatched, "labels": labels,
             "allow_draft": allow_draft or None,
             "judge_probe_size": probe_size},
        )  # fmt: skip
        cfg = rag_models(cfg, llm.value if llm else None, model, judge_model)
    except RagpipeError as exc:
        fail(exc, 2)
    with interruptible(_eval_stopped(cfg)):
        try:
            from flows.eval import evaluate_rag

            summary = evaluate_rag(cfg, name=name)
        except RagpipeError as exc:
            fail(exc, 2)
    _print_eval(summary)


def rag_models(
    cfg: RagpipeConfig, provider: str | None, model: str | None, judge_model: str | None
) -> RagpipeConfig:
    """``cfg`` with eval rag's --llm, --model and --judge-model applied: the generator's
    provider and model; the judge is ``eval.judge`` (the generator when unset), its model
    replaced by --judge-model. Without --judge-model a configured judge stays (it was
    dropped, and the generator judged its own answers)."""
    generator = {k: v for k, v in {"provider": provider, "model": model}.items() if v is not None}
    # Validated as the config is (a missing .gguf is refused now, not after Prefect's start
    # and the judge's calibration probe).
    llm_cfg = _checked(cfg.llm, generator, "--llm/--model")
    judge_cfg = cfg.eval.judge
    if judge_model:
        judge_cfg = _checked(judge_cfg or llm_cfg, {"model": judge_model}, "--judge-model")
    return cfg.model_copy(
        update={"llm": llm_cfg, "eval": cfg.eval.model_copy(update={"judge": judge_cfg})}
    )


def _checked(base: LLMConfig, update: dict[str, Any], option: str) -> LLMConfig:
    try:
        return LLMConfig.model_validate({**base.model_dump(), **update})
    except ValidationError as exc:
        reasons = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise ConfigError(f"{option}: {reasons}") from None


@eval_app.command("import-beir")
def import_beir_command(
    dataset: Annotated[
        Path, typer.Argument(help="A BEIR dataset directory (corpus.jsonl, queries.jsonl, qrels/).")
    ],
    corpus_out: Annotated[
        Path, typer.Option(help="Where to write the corpus as Markdown files (one per document).")
    ],
    golden_out: Annotated[Path, typer.Option(help="Where to write the golden set YAML.")],
    split: Annotated[str, typer.Option(help="qrels/<split>.tsv to use.")] = "test",
) -> None:
    """Turn a BEIR dataset into documents to ingest and a golden set (qrels as graded relevance).

    The dataset's three files are read and checked first: a bad line stops the import (exit
    2, its file and line named) before anything is written. Then: `ragpipe ingest
    CORPUS_OUT` and `ragpipe eval retrieval --golden GOLDEN_OUT --granularity file`.
    """
    from ragpipe.evaluation.golden import import_beir, save_golden

    with interruptible(
        f"the import stopped before writing {golden_out}; the documents it wrote to "
        f"{corpus_out} (the last perhaps cut off) are written again by the next import"
    ):
        try:
            golden = import_beir(dataset, corpus_out, split)
            save_golden(golden, golden_out)
        except RagpipeError as exc:
            fail(exc, 2)
    files = sum(1 for _ in corpus_out.glob("*.md"))
    print(f"wrote {files} documents to {corpus_out} and {len(golden.items)} queries to "
          f"{golden_out}")  # fmt: skip
    for note in golden.notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}", highlight=False, soft_wrap=True)


@eval_app.command("compare")
def eval_compare(
    variants: Annotated[
        list[str],
        typer.Option(
            "--variant",
            help="NAME:key=value,... of retrieve settings, e.g. dense:mode=dense or "
            "'rrf-w:fusion_method=rrf,dense_weight=2'. The first is the baseline.",
        ),
    ],
    golden: GoldenOption = None,
    granularity: GranularityOption = None,
    gate_metric: Annotated[
        str | None,
        typer.Option(help="Fail (exit 4) when this metric's (e.g. mrr, ndcg@10) delta CI ..."),
    ] = None,
    gate_threshold: Annotated[
        float, typer.Option(help="... lies entirely below this value (e.g. -0.02).")
    ] = 0.0,
    skip_unmatched: SkipUnmatchedOption = None,
    allow_draft: AllowDraftOption = False,
    name: NameOption = None,
    reports_dir: ReportsOption = None,
    config: ConfigOption = None,
    store_path: StorePathOption = None,
    embedder: EmbedderOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Compare retrieval settings on the same queries: paired deltas, CIs, p-values."""
    prefect_env(verbose)
    from ragpipe.evaluation.metrics import METRICS
    from ragpipe.evaluation.retrieval import parse_variant

    try:
        parsed = [parse_variant(v) for v in variants]
        if gate_metric is not None and gate_metric not in METRICS:
            raise ConfigError(f"--gate-metric {gate_metric!r} is not one of {', '.join(METRICS)}")
        if len(parsed) < 2:
            raise ConfigError("give at least two --variant options (the first is the baseline)")
        cfg = _eval_config(
            config,
            store_path,
            embedder,
            {},
            {"golden": golden, "granularity": granularity, "reports_dir": reports_dir,
             "skip_unmatched": skip_unmatched,
             "allow_draft": allow_draft or None},
        )  # fmt: skip
    except RagpipeError as exc:
        fail(exc, 2)
    with interruptible(_eval_stopped(cfg)):
        try:
            from flows.eval import compare_retrieval
            from ragpipe.evaluation.retrieval import Gate

            gate = Gate(gate_metric, gate_threshold) if gate_metric else None
            summary = compare_retrieval(cfg, parsed, name=name or "compare", gate=gate)
        except GateFailed as exc:
            fail(exc, 4, "gate failed")
        except RagpipeError as exc:
            fail(exc, 2)
    _print_eval(summary)


@eval_app.command("tune")
def eval_tune(
    golden: GoldenOption = None,
    granularity: GranularityOption = None,
    metric: Annotated[
        str, typer.Option(help="Metric to maximise and to judge the pick by, e.g. ndcg@10, mrr.")
    ] = "ndcg@10",
    share: Annotated[
        float, typer.Option(help="Share of the golden queries that tune; the rest only confirm.")
    ] = 0.5,
    seed: Annotated[
        int | None, typer.Option(help="Seed of the split and the statistics (eval.seed).")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Also write the tuned config here when the verdict is 'recommend' (pass it "
            "back with --config). A 'recommend, not significant' pick is not written here: "
            "it stays in the report folder as tuned-not-significant.yaml."
        ),
    ] = None,
    skip_unmatched: SkipUnmatchedOption = None,
    allow_draft: AllowDraftOption = False,
    llm_options: Annotated[
        bool,
        typer.Option(
            "--llm-options",
            help="Also try the settings that call the LLM per query: LLM rerank (one call "
            "per candidate, seconds each on a CPU, cached) and adaptive HyDE.",
        ),
    ] = False,
    ingest_options: Annotated[
        bool,
        typer.Option(
            "--ingest-options",
            help="Also try chunk.whole_sections: a second index of your sources is built "
            "beside the work dir, in <work_dir>.tune/ (conversions reused, every chunk "
            "embedded again) and searched with the same coordinate search; it is picked "
            "only when it wins.",
        ),
    ] = False,
    name: NameOption = None,
    reports_dir: ReportsOption = None,
    config: ConfigOption = None,
    store_path: StorePathOption = None,
    embedder: EmbedderOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Tune the retrieve settings on your golden set, with an honest hold-out.

    The queries are split by a seeded shuffle: a coordinate search over mode, fusion
    method, alpha, rrf_k, leg weights, document weight, prefetch depth, fragments, the
    quoted-phrase boost, MMR and dense pseudo-relevance feedback (with --llm-options also
    LLM rerank and adaptive HyDE; with --ingest-options also whole-section chunks, on a
    second index it builds) picks the best settings on the tuning share only. The
    report says, per setting, what was kept or refused and on what score. Then
    the pick and the current settings are scored on the held-out queries (paired delta,
    bootstrap 95% CI, permutation p-value). Verdict: recommend (tuned.yaml written, with
    your config's other sections kept), recommend, not significant (a gain the test cannot
    tell from noise: kept in the report folder as tuned-not-significant.yaml, not written
    to --out), refused (the pick is worse on the held-out queries: its delta CI lies
    entirely below zero), or no change. A golden set that would hold out fewer than 6
    queries, on which the sign-flip test cannot reach p < 0.05, is refused before any
    search. Exit 0 for every verdict; 2 for a bad configuration or golden set.
    """
    prefect_env(verbose)
    try:
        cfg = _eval_config(
            config,
            store_path,
            embedder,
            {},
            {
                "golden": golden,
                "granularity": granularity,
                "reports_dir": reports_dir,
                "seed": seed,
                "skip_unmatched": skip_unmatched,
                "allow_draft": allow_draft or None,
            },
        )
        from dataclasses import replace

        from ragpipe.evaluation.golden import load_golden
        from ragpipe.evaluation.metrics import METRICS
        from ragpipe.evaluation.tune import split_queries

        # Checked here so that a mistake is one line, not a flow run's traceback.
        if metric not in METRICS:
            raise ConfigError(f"tune metric {metric!r} is not one of {', '.join(METRICS)}")
        loaded = load_golden(cfg.eval.golden)
        loaded.refuse_drafts(cfg.eval.allow_draft)
        scored = replace(loaded, items=loaded.answerable)
        split_queries(scored, cfg.eval.seed, share, "answerable item(s)")
    except RagpipeError as exc:
        fail(exc, 2)
    base = config or (DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None)
    # The indexes --ingest-options builds are ordinary incremental ingests: what one had
    # embedded is kept, and the next tune goes on from there.
    unwritten = "no report or tuned config was written" + (
        "; the indexes it was building beside the work dir keep what they finished"
        if ingest_options
        else ""
    )
    columns = (TextColumn("{task.description:>9}"), MofNCompleteColumn(), TimeElapsedColumn())
    with (
        Progress(
            *columns, console=console, transient=True, disable=not console.is_terminal
        ) as progress,
        interruptible(_stopped(cfg.eval.reports_dir, "tune", unwritten, out)),
    ):
        previous = set_reporter(RichReporter(progress))
        try:
            from flows.eval import tune_retrieval

            summary = tune_retrieval(
                cfg,
                config_path=str(base) if base else None,
                name=name,
                metric=metric,
                share=share,
                write_config=str(out) if out else None,
                llm_options=llm_options,
                ingest_options=ingest_options,
            )
        except RagpipeError as exc:
            fail(exc, 2)
        finally:
            set_reporter(previous)
    _print_tune(summary, out)


def _print_tune(summary: TuneSummary, out: Path | None = None) -> None:
    split = summary.split
    tuning = summary.tuning
    from ragpipe.evaluation.report import no_ci_reason
    from ragpipe.evaluation.tune import changed_settings, scores_said

    said = scores_said(summary.metric, tuning["current"], tuning["best"], tuning["highest"])
    print(
        f"split (seed {summary.seed}): {len(split.tuning)} tuning queries, "
        f"{len(split.confirmation)} held-out; {len(tuning['trials'])} configurations "
        f"scored on the tuning queries ({said})"
    )

    print("changed settings: " + json.dumps(changed_settings(summary.overrides, summary.ingest)))
    for setting, verdict in tuning.get("options", {}).items():
        print(f"  {setting}: {verdict}")
    table = Table(title="held-out queries: tuned - current, mean [95% CI]")
    for column in ("metric", "current", "tuned", "delta", "p"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for m, d in summary.confirmation.items():
        table.add_row(
            m,
            f"{d['current']:.4f}",
            f"{d['tuned']:.4f}",
            f"{d['mean']:+.4f} [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}]"
            if d["ci_low"] is not None
            else f"{d['mean']:+.4f} (n={d['n']}, no CI{no_ci_reason(d['n'], 'every delta equal')})",
            f"{d['p_value']:.3g}",
        )
    Console().print(table)
    for warning in summary.warnings:
        console.print(
            f"[yellow]warning (held-out queries):[/yellow] {escape(warning)}", highlight=False
        )
    colour = {"recommend": "green", "refused": "red"}.get(summary.decision, "yellow")
    console.print(
        f"[{colour}]{escape(summary.message)}[/{colour}]", highlight=False, soft_wrap=True
    )
    for warning in summary.config_warnings:
        console.print(
            f"[yellow]warning (tuned config):[/yellow] {escape(warning)}",
            highlight=False,
            soft_wrap=True,
        )
    if summary.tuned_config:
        print(f"tuned config: {summary.tuned_config} (use it with --config)")
    if summary.weak_config:
        console.print(
            "[yellow]not significant: the pick is not written as tuned.yaml"
            f"{escape(f' nor to {out}') if out else ''}; it is kept as "
            f"{escape(summary.weak_config)}. Confirm it on more golden queries before you use "
            "it.[/yellow]",
            highlight=False,
            soft_wrap=True,
        )
    if summary.tuned_config and summary.ingest:
        print(
            f"its chunk settings need the index tune built at {summary.index}: the next "
            "ingest with the tuned config re-chunks and re-embeds every file"
        )
    print(f"report: {Path(summary.report_dir) / 'report.html'} (also report.md, tune.json)")


def report(
    last: Annotated[int, typer.Option(help="How many recent runs to show side by side.")] = 5,
    metric: Annotated[str, typer.Option(help="Metric whose trend to show.")] = "mrr",
    golden: Annotated[
        str | None, typer.Option(help="Only runs of this golden set (its name, e.g. r-faq-dev).")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Only runs with this run name.")] = None,
    html_dir: Annotated[
        Path | None,
        typer.Option(
            "--html-dir", help="Where to write trend-<golden>.html (default: eval.reports_dir)."
        ),
    ] = None,
    reports_dir: ReportsOption = None,
    config: ConfigOption = None,
) -> None:
    """Show the latest evaluation runs and the trend of one metric, per golden set.

    Runs of different golden sets, retrieval and RAG runs, and retrieval runs at different
    granularities are never mixed in one table or trend. Also writes an HTML trend per
    golden set (every metric over time, 95% CI whiskers): REPORTS_DIR/trend-<golden>.html
    (trend-<golden>-<name>.html with --name); a name with a capital or a character other
    than a letter, digit, - _ or . ends in 8 hex digits of its SHA-256 there, one file each.
    """
    from ragpipe.evaluation.metrics import METRICS
    from ragpipe.evaluation.rag import ALL_RAG_METRICS
    from ragpipe.evaluation.report import render_trend, trend_scope
    from ragpipe.evaluation.run import file_slug, read_history

    try:
        cfg = load_config(
            config, {"eval": {"reports_dir": str(reports_dir)}} if reports_dir else {}
        )
    except RagpipeError as exc:
        fail(exc, 2)
    if metric not in (*METRICS, *ALL_RAG_METRICS):
        console.print(
            f"[red]error:[/red] --metric must be one of {', '.join((*METRICS, *ALL_RAG_METRICS))}"
        )
        raise typer.Exit(2)
    if last < 1:
        console.print("[red]error:[/red] --last must be at least 1")
        raise typer.Exit(2)
    # Flagged and withheld metrics too: the table shows them with their flag, no trend does.
    try:
        rows = read_history(cfg.eval.reports_dir, flagged=True)
    except RagpipeError as exc:
        fail(exc, 2)
    if not rows:
        print(f"no evaluation runs in {cfg.eval.reports_dir} yet: run `ragpipe eval retrieval`")
        return
    sets = sorted({r["golden"] for r in rows})
    rows = [r for r in rows if (golden is None or r["golden"] == golden)
            and (name is None or r["name"] == name)]  # fmt: skip
    if not rows:
        asked = " ".join(f"--{k} {v}" for k, v in (("golden", golden), ("name", name)) if v)
        console.print(
            f"[red]error:[/red] no run matches {asked} (golden sets in the history: "
            f"{', '.join(sets)})",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(2)
    out_dir = html_dir or cfg.eval.reports_dir
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file where the folder goes, or no permission
        fail(ConfigError(f"cannot write the trend pages to {out_dir}: {exc.strerror or exc}; "
                         "pass --html-dir a folder you can write"), 2)  # fmt: skip
    for g in sorted({r["golden"] for r in rows}):
        mine = [r for r in rows if r["golden"] == g]
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in mine:  # never one trend across kinds of run, granularities or sizes
            what = "rag runs" if r["kind"] == "rag" else f"retrieval runs, {r['granularity']} level"
            # A --limit 3 run or a sample is not the 75-question run it is named like, nor a
            # run at another depth (as the HTML trend).
            scope = trend_scope(r, settings=False)  # a compare's variants: one table
            size = f", {scope}" if scope else ""
            groups.setdefault(what + size, []).append(r)
        for what, group in groups.items():
            _print_history(group, last, metric, f"{g}, {what}")
        # One file per golden set (and --name): "faq v2" and "faq-v2" wrote one another's.
        slug = file_slug(g + (f"-{name}" if name else ""), keep="-_.", unique=True)
        path = out_dir / f"trend-{slug}.html"
        path.write_text(render_trend(g, [r for r in mine if not r["flag"]]), encoding="utf-8")
        print(f"trend: {path}")


def _print_history(rows: list[dict[str, Any]], last: int, metric: str, what: str) -> None:
    """The latest ``last`` runs (every variant of each) side by side, and one metric's trend
    per series (as the HTML trend's lines)."""
    from ragpipe.evaluation.metrics import METRICS
    from ragpipe.evaluation.rag import ALL_RAG_METRICS
    from ragpipe.evaluation.report import history_cell, no_ci_reason, trend_series

    runs = list(dict.fromkeys(r["run_id"] for r in rows))
    columns = list(dict.fromkeys((r["run_id"], r["variant"]) for r in rows))
    shown = [c for c in columns if c[0] in runs[-last:]]
    table = Table(
        title=escape(f"{what}: latest {min(last, len(runs))} of {len(runs)} runs (mean [95% CI])")
    )
    table.add_column("metric", no_wrap=True)
    for run_id, variant in shown:
        stamp, _, name = run_id.partition("-")
        # Headers wrap rather than being cut: run name, time, variant on their own lines.
        table.add_column(escape(f"{name}\n{stamp}\n{variant}"), justify="right", overflow="fold")
    by_key = {(r["run_id"], r["variant"], r["metric"]): r for r in rows}
    names = [m for m in (*METRICS, *ALL_RAG_METRICS) if any((*c, m) in by_key for c in shown)]
    for m in names:
        cells = []
        for run_id, variant in shown:
            got = by_key.get((run_id, variant, m))
            cells.append("" if got is None else escape(history_cell(got)))  # its n and flag
        table.add_row(m, *cells)
    Console().print(table)
    # One trend per series, keyed as the HTML trend's lines: a compare run's variants and
    # runs of other names are never read as one run's history.
    trends: dict[str, list[dict[str, Any]]] = {}
    flagged = 0
    for run_id, variant in columns:
        if (run_id, variant, metric) in by_key:
            point = by_key[(run_id, variant, metric)]
            if point.get("flag"):  # no trend point: an uncalibrated judge's number, or none
                flagged += 1
                continue
            trends.setdefault(trend_series(point), []).append(point)
    if not trends:
        also = f" (flagged or withheld in {flagged} run(s): no trend point)" if flagged else ""
        print(f"{what}: no run has {metric} as a value{also}")
        return
    points = [r for series in trends.values() for r in series]
    low, high = min(r["mean"] for r in points), max(r["mean"] for r in points)
    print(
        f"{what}: trend of {metric}, one per kind of run, name and variant (oldest first; bars "
        f"span {low:.3f} to {high:.3f} in every one, not 0 to 1):"
    )
    wide = max(len(r["run_id"]) for r in points)
    for series, mine in sorted(trends.items()):
        print(f"  {series}:")
        for r in mine:
            share = (r["mean"] - low) / (high - low) if high > low else 1.0
            bar = "█" * (1 + round(39 * share))
            # One item, too few, or every value equal: no CI, as the table says.
            no_ci = f" (n={r['n']}, no CI{no_ci_reason(r['n'])})" if r["ci_low"] is None else ""
            print(f"    {r['run_id']:<{wide}s} {r['mean']:.3f} {bar}{no_ci}")
