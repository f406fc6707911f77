"""Rendering an evaluation run: Markdown, and a self-contained HTML page with plots and
a drill-down into the worst questions. Only renders: ``ragpipe.evaluation.run`` scores
the run and writes its files."""

from __future__ import annotations

import html
import io
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pyarrow as pa

from ragpipe.config import RagpipeConfig
from ragpipe.evaluation.metrics import METHOD, METRICS, MIN_CI_N
from ragpipe.evaluation.rag import ALL_RAG_METRICS, ANSWER_METRICS, RAG_METRICS, UNTRUSTED_FLAGS

if TYPE_CHECKING:
    from ragpipe.evaluation.run import RunSummary


WITHHELD = "withheld: "  # how history's flag of a withheld metric starts


_VARIANT_SETTINGS = re.compile(r", settings [0-9a-f]{8}$")


def trend_scope(row: dict[str, Any], settings: bool = True) -> str:
    """A history row's scope (which items, what depth). Rows from before the column hold
    their number of items only: their own series, since their depth and selection are
    unknown. ``settings=False``: without a compare variant's settings hash, which parts
    its trend line but not the run (a table of the run's variants side by side)."""
    if row.get("scope"):
        scope = str(row["scope"])
        return scope if settings else _VARIANT_SETTINGS.sub("", scope)
    return f"{row['queries']} items, scope not recorded" if row.get("queries") else ""


def trend_series(row: dict[str, Any]) -> str:
    """The trend line a history row belongs to, as the HTML trend's legend and the
    terminal's trend name it: runs of another kind (retrieval, compare, RAG), granularity,
    name, variant, scope or judge never share one (a --limit 3 run is not the 75-question
    run it is named like; faithfulness by another judge is another instrument)."""
    kind = "rag" if row["kind"] == "rag" else f"{row['kind']} ({row['granularity']})"
    size = f", {trend_scope(row)}" if trend_scope(row) else ""
    judge = row.get("judge") or ""
    if judge and not judge.startswith(("embedder ", "answer rules ")):  # no judge's
        judge = f"judge {judge}"
    judge = f", {judge}" if judge else ""
    # A RAG run's generator: another model's answers are another line, not a step in this
    # one (rows from before the column have none: a line of their own).
    generator = f", generator {row['generator']}" if row.get("generator") else ""
    return f"{kind}: {row['name']} / {row['variant']}{size}{judge}{generator}"


def generator_line(summary: RunSummary) -> str | None:
    """A RAG run's generator and its settings, as report.md and the terminal name it
    ("big-model: provider ollama, temperature 0.0, ..."); None for other runs."""
    models = summary.models or {}
    if summary.kind != "rag" or not models.get("generator"):
        return None
    settings = models.get("generator_settings") or {}
    shown = ", ".join(f"{k} {_setting(v)}" for k, v in settings.items() if k != "model")
    return f"{models['generator']}: {shown or 'settings not recorded'}"


def _setting(value: Any) -> str:
    return value if isinstance(value, str) else "none" if value is None else json.dumps(value)


def no_ci_reason(n: int, equal: str = "all values equal") -> str:
    """Why a mean of ``n`` items has no CI, as the cells say it after "no CI": nothing for
    one item; too few (under ``MIN_CI_N``: a CI that would not hold the mean as often as
    it says); or every value the same (a CI of zero width would claim certainty)."""
    if n <= 1:
        return ""
    return f": under {MIN_CI_N}" if n < MIN_CI_N else f": {equal}"


def headline_cell(st: dict[str, Any]) -> str:
    """One metric as every headline shows it (terminal, report.md, report.html, Prefect).

    The value with its 95% CI when at least ``MIN_CI_N`` items were scored, the value
    alone (``no CI``) for fewer or when every value is the same, none for zero; then how many
    items it scored, failed on and did not apply to; a withheld metric (an unreliable
    judge, too many judge failures) shows why instead of a value.
    """
    n = int(st.get("n") or 0)
    failed = int(st.get("n_failed") or 0)
    na = int(st.get("n_not_applicable") or 0)
    extra = (f", {failed} failed" if failed else "") + (f", {na} n/a" if na else "")
    flag = st.get("flag")
    if st.get("withheld"):
        return f"{flag} (n={n}{extra})"
    if n == 0 or st.get("mean") is None:
        cell = f"no value (n=0{extra})"
    elif n == 1 or st.get("ci_low") is None:
        cell = f"{st['mean']:.3f} (n={n}, no CI{no_ci_reason(n)}{extra})"
    else:
        cell = f"{st['mean']:.3f} [{st['ci_low']:.3f}, {st['ci_high']:.3f}] (n={n}{extra})"
    return f"{cell}; {flag}" if flag else cell


def metric_rows(summary: RunSummary) -> list[dict[str, Any]]:
    """A run's metrics as table rows (the Prefect metrics artifact): the headline cell as
    report.md's, and numbers in the columns a table sorts and exports by only for a value:
    a withheld or flagged metric (a judge not calibrated) has its number in the headline
    only, beside its flag."""

    def num(value: float | None, st: dict[str, Any]) -> float | None:
        return None if value is None or st.get("withheld") or st.get("flag") else round(value, 4)

    return [
        {"variant": variant, "metric": m, "headline": headline_cell(st),
         "mean": num(st["mean"], st), "ci_low": num(st["ci_low"], st),
         "ci_high": num(st["ci_high"], st), "n": st["n"],
         "n_failed": st.get("n_failed", 0), "n_not_applicable": st.get("n_not_applicable", 0),
         "flag": st.get("flag") or ""}
        for variant, by_metric in summary.metrics.items()
        for m, st in by_metric.items()
        if m in METRICS or m in ALL_RAG_METRICS
    ]  # fmt: skip


def history_cell(row: dict[str, Any]) -> str:
    """A history row (a run's metric) as the headline shows it: with its CI or ``no CI``,
    its n, and its flag; a withheld metric's reason instead of a value."""
    flag = row.get("flag") or ""
    withheld = flag.startswith(WITHHELD)
    return headline_cell(
        {**row, "withheld": withheld, "flag": flag.removeprefix(WITHHELD) if withheld else flag}
    )


def delta_cell(d: dict[str, Any]) -> str:
    """A paired delta (variant - baseline) as report.md shows it: with its 95% CI and
    p-value, or why there is no CI (one paired query; fewer than ``MIN_CI_N``, then with
    the permutation test's p; every query's delta the same)."""
    n, p = d["n"], d.get("p_value")
    # The test's smallest p is 1/(N+1), not 0; three significant digits keep 0.0496 under
    # 0.05 (":.3f" made it p=0.050).
    shown = "" if p is None else "p<0.001" if p < 0.001 else f"p={p:.3g}"
    if d.get("ci_low") is None:  # too few, or a CI of zero width (summary.json holds null)
        why = no_ci_reason(n, "every delta equal")
        return f"{d['mean']:+.3f} (n={n}, no CI{why})" + (f" {shown}" if 1 < n < MIN_CI_N else "")
    return f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] {shown}"


def _method(summary: RunSummary) -> str:
    return str(summary.statistics.get("method", METHOD)).removesuffix(" over scored queries")


def _fewest(summary: RunSummary) -> int:
    """The fewest items with a CI in the run's method: 2 before the expanded interval."""
    return MIN_CI_N if _method(summary) == METHOD else 2


def _names(summary: RunSummary) -> list[str]:
    return summary.metric_names or list(METRICS)


def _index_version_line(version: dict[str, Any]) -> list[str]:
    if not version:
        return []
    return [
        f"- index version: `{version['generation'][:12]}`, published {version['published_at']}"
        f" (build fingerprint `{version['index_fingerprint']}`: converter, cleaner, chunker, "
        "embedder settings)"
    ]


def _metric_table(summary: RunSummary, names: list[str]) -> list[str]:
    variants = list(summary.metrics)
    lines = ["| metric | " + " | ".join(variants) + " |", "|---" * (len(variants) + 1) + "|"]
    for m in names:
        cells = [headline_cell(summary.metrics[v][m]) for v in variants if m in summary.metrics[v]]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines


def _answer_flag_lines(answer_flags: dict[str, Any] | None) -> list[str]:
    """How many answers carry each flag (per_query.parquet's ``flags``), and how many of
    them the pipeline does not vouch for (``UNTRUSTED_FLAGS``)."""
    if not answer_flags:  # a run from before it
        return []
    total = answer_flags["answers"]
    each = ", ".join(f"{f} {n}" for f, n in answer_flags["counts"].items()) or "none"
    kinds = ", ".join(UNTRUSTED_FLAGS)
    return [
        "",
        f"- answers flagged, of {total}: {each}; untrusted ({kinds}): "
        f"{answer_flags['untrusted']} of {total}",
    ]


def _judge_lines(judge: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## Judge",
        "",
        f"- model: {judge['model']}, temperature {judge['temperature']}, ragas "
        f"{judge['ragas']}; metrics: {', '.join(judge['metric_classes'])}",
        f"- faithfulness's verdicts: {judge.get('faithfulness_verdicts', 'not recorded')}",
        f"- context recall's and precision's verdicts: "
        f"{judge.get('context_verdicts', 'not recorded')}",
        "- a judge failure is recorded as null with its reason (never as 0); "
        "not applicable: context_recall without expected_answer, faithfulness of a "
        "'not found' answer, of a reply saying the sources lack the answer and of an empty "
        "one, every judged metric of an answerable: false item",
    ]
    cal = judge.get("calibration")
    if cal:
        acc = f"{cal['accuracy']:.2f}"
        if cal.get("accuracy_low") is not None:  # null (no CI) below 2 probe pairs
            acc += f" [{cal['accuracy_low']:.2f}, {cal['accuracy_high']:.2f}]"
        lines += [
            f"- calibration: **{cal['label']}**; accuracy {acc}, {cal['failed']} probe "
            f"verdict(s) failed (counted wrong), 'yes' share {cal['yes_share']:.2f}. Below "
            "the minimum kappa, or with more than half the probe's calls failed (judge "
            "unavailable), the judged metrics are withheld from the headline and feed no gate.",
            "",
            "| probe pairs | truth | pairs | judged right |",
            "|---|---|---|---|",
        ]
        for kind, c in cal["by_kind"].items():  # a summary from before 2026-12-02: no truth
            truth = {1: "yes", 0: "no"}.get(c.get("truth", -1), "?")
            lines.append(f"| {kind} | {truth} | {c['pairs']} | {c['correct']} |")
    else:
        lines.append("- calibration: **none** (eval.judge_probe_size 0, or no probe could be "
                     "built): the judged metrics are not known to be trustworthy")  # fmt: skip
    lines += ["", "| metric | scored | failed | not applicable |", "|---|---|---|---|"]
    for m, c in judge["counts"].items():
        lines.append(f"| {m} | {c['ok']} | {c['failed']} | {c['not_applicable']} |")
    kinds = judge.get("context_precision_kinds")  # none in summaries before it
    if kinds:
        lines += [
            "",
            f"- context_precision's scored items: {kinds['with_reference']} judged against "
            f"expected_answer (ragas's ContextPrecision), {kinds['without_reference']} "
            "against the generated answer (no expected_answer: ContextPrecisionWithoutReference)",
        ]
    ppi = judge.get("ppi") or {}
    if ppi:
        lines += [
            "",
            "## Human labels: prediction-powered estimates",
            "",
            f"- labels: `{judge.get('labels')}`. PPI (Angelopoulos et al., 2023): the judge's "
            "mean over the unlabelled items, corrected by the judge's average error on the "
            "labelled ones; unbiased whatever the judge's quality, with a 95% CI.",
            "",
            "| metric | PPI estimate [95% CI] | human labels alone [95% CI] | labelled / judged |",
            "|---|---|---|---|",
        ]
        for m, e in ppi.items():
            lines.append(
                f"| {m} | {ppi_cell(e)} | "
                f"{_ci(e['human_mean'], e['human_ci_low'], e['human_ci_high'])} | "
                f"{e['n_labeled']} / {e['n_judged']} |"
            )
    return lines


def ppi_cell(e: dict[str, Any]) -> str:
    """A prediction-powered estimate as report.md shows it: with its 95% CI, or no CI;
    an estimate outside the metric's range (kept unclipped: clipped, it read
    ``1.000 [1.000, 1.000]``) with its flag."""
    cell = _ci(e["mean"], e["ci_low"], e["ci_high"])
    return f"{cell}; {e['flag']}" if e.get("flag") else cell  # none in summaries before it


def _ci(mean: float, low: float | None, high: float | None) -> str:
    if low is None or high is None or low != low:
        return f"{mean:.3f} (no CI)"
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def render_markdown(summary: RunSummary) -> str:
    """The run's report.md: provenance, the headline metrics (n, failures, flags), deltas,
    gate, judge calibration, settings."""
    names = _names(summary)
    title = "RAG evaluation" if summary.kind == "rag" else "Retrieval evaluation"
    lines = [f"# {title}: {summary.name}", ""]
    g = summary.golden
    check = summary.golden_check or {}
    checked = (
        f"; checked against the index: {check['targets']} targets, "
        f"{len(check['skipped_items'])} items skipped"
        if check
        else ""
    )
    lines += [
        f"- golden set: **{g.name}** ({g.queries} queries: {g.selection or 'all'}; "
        f"`{g.source}`){checked}",
        f"- granularity: {summary.granularity}, depth {summary.depth}",
        f"- corpus: {summary.corpus['files']} files, {summary.corpus['points']} chunks "
        f"(fingerprint {summary.corpus['sha256']})",
        *_index_version_line(summary.corpus.get("index_version") or {}),
        f"- embedder: {summary.models['embedder']}; git {summary.git_revision or 'n/a'}",
        *([f"- generator: {generator}"] if (generator := generator_line(summary)) else []),
        f"- 95% CIs: {_method(summary)}, {summary.statistics['resamples']} resamples, "
        f"seed {summary.statistics['seed']}; a CI needs n >= {_fewest(summary)} scored items",
        "",
    ]
    for warning in summary.warnings:
        lines.append(f"> **warning:** {warning}")
    if summary.kind == "rag":
        answer = [m for m in names if m in ANSWER_METRICS]
        judged = [m for m in names if m in RAG_METRICS]
        judge = summary.judge or {}
        label = (judge.get("calibration") or {}).get("label", "judge not calibrated")
        lines += ["", "## Answers (no judge)", "", *_metric_table(summary, answer)]
        lines += _answer_flag_lines(summary.answer_flags)
        lines += ["", f"## Judged (RAGAS): {label}", "", *_metric_table(summary, judged)]
    else:
        lines += ["", *_metric_table(summary, names)]
    if summary.deltas:
        lines += ["", f"## Paired deltas vs `{summary.baseline}`", ""]
        others = list(summary.deltas)
        lines += ["| metric | " + " | ".join(others) + " |", "|---" * (len(others) + 1) + "|"]
        for m in names:
            cells = []
            for v in others:
                cells.append(delta_cell(summary.deltas[v][m]))
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    if summary.gate:
        gate = summary.gate
        state = "PASSED" if gate.passed else "FAILED"
        lines += [
            "",
            f"**Gate {state}:** {gate.metric} delta CI must not lie entirely below "
            f"{gate.threshold:+.3f}.",
        ]
        lines += [f"- {f}" for f in gate.failures]
    if summary.judge:
        lines += _judge_lines(summary.judge)
    if summary.evidence_changed:
        since = summary.evidence_since or {}
        lines += ["", f"## Evidence changed since the last run ({since.get('run_id', '?')})",
                  "", "Their files changed in the index: a moved metric may be a stale label.",
                  ""]  # fmt: skip
        lines += [f"- {item}: {why}" for item, why in sorted(summary.evidence_changed.items())]
    if check.get("unmatched"):
        lines += ["", "## Golden targets that cannot be scored (skipped)", ""]
        lines += [f"- {u}" for u in check["unmatched"]]
    lines += ["", "## Settings", ""]
    lines += [f"- **{v}**: {shown}" for v, shown in settings_lines(summary.variants).items()]
    return "\n".join(lines) + "\n"


SETTINGS_SHOWN = ("mode", "fusion_method", "alpha", "doc_weight", "rrf_k", "prefetch", "top_k",
                  "rerank", "mmr", "hyde")  # fmt: skip


def settings_lines(variants: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Each variant's settings as the report lists them: the usual ones, and every other
    one on which the variants differ (a compare of dense_weight 1 and 2 listed two equal
    lines)."""
    settings = list(variants.values())
    varied = sorted({k for s in settings for k in s if k not in SETTINGS_SHOWN
                     and any(o.get(k) != s.get(k) for o in settings)})  # fmt: skip
    keys = [k for k in (*SETTINGS_SHOWN, *varied) if any(k in s for s in settings)]
    return {v: ", ".join(f"{k}={s.get(k)}" for k in keys) for v, s in variants.items()}


@contextmanager
def _pyplot() -> Iterator[Any]:
    """matplotlib's pyplot (Agg), drawing every text as given: a run, variant or golden set
    name is never math text (``$x$`` was drawn as an italic x, and ``cost$_{$`` a parse
    error that ended the run after its scoring, or every later trend page)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with plt.rc_context({"text.parse_math": False}):
        yield plt


def svg(fig: Any) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight")
    return buffer.getvalue()[buffer.getvalue().index("<svg") :]


def mark_no_ci(ax: Any, bars: Any, has_ci: Sequence[bool]) -> None:
    """Hatch and label each bar drawn without a CI (one item, or every value the same):
    with no whisker it reads as a CI of zero width, certainty."""
    for bar, ok in zip(bars, has_ci, strict=True):
        if not ok and bar.get_height() == bar.get_height():  # not a NaN (not drawn)
            bar.set_hatch("//")
            top = max(bar.get_y(), bar.get_y() + bar.get_height())
            ax.annotate("no CI", (bar.get_x() + bar.get_width() / 2, top),
                        ha="center", va="bottom", fontsize=8)  # fmt: skip


def _lowest(values: Iterable[float | None]) -> float:
    """A y axis's floor: 0, or below the lowest value (answer cosine and relevancy, and
    deltas, go below 0: a bar under the axis read as a value near 0)."""
    low = min((v for v in values if v is not None and v == v), default=0.0)
    return min(0.0, low - 0.05)


def plots(summary: RunSummary, table: pa.Table) -> list[tuple[str, str]]:
    """(title, inline SVG) figures: metric bars with CI whiskers, distributions, deltas."""
    with _pyplot() as plt:
        return _plots(plt, summary, table)


def _plots(plt: Any, summary: RunSummary, table: pa.Table) -> list[tuple[str, str]]:
    out = []
    variants = list(summary.metrics)

    def drawn(st: dict[str, Any]) -> bool:
        return st.get("mean") is not None and not st.get("withheld") and not st.get("flag")

    # Withheld and flagged metrics (an uncalibrated judge's: a bar with whiskers reads as a
    # measurement) and metrics with no value are not drawn; n = 1 has no whisker.
    names = [m for m in _names(summary) if any(drawn(summary.metrics[v][m]) for v in variants)]
    width = 0.8 / len(variants)
    fig, ax = plt.subplots(figsize=(10, 4))
    handles = []
    for i, v in enumerate(variants):
        cis = [summary.metrics[v][m] for m in names]
        means = [c["mean"] if drawn(c) else float("nan") for c in cis]
        low = [c["mean"] - c["ci_low"] if drawn(c) and c["ci_low"] is not None else 0.0
               for c in cis]  # fmt: skip
        high = [c["ci_high"] - c["mean"] if drawn(c) and c["ci_high"] is not None else 0.0
                for c in cis]  # fmt: skip
        xs = [j + i * width for j in range(len(names))]
        bars = ax.bar(xs, means, width, yerr=[low, high], capsize=3)
        handles.append(bars)
        mark_no_ci(ax, bars, [c["ci_low"] is not None for c in cis])
    ax.set_xticks([j + width * (len(variants) - 1) / 2 for j in range(len(names))], names)
    drawn_sts = [summary.metrics[v][m] for v in variants for m in names]
    drawn_low = [c["ci_low"] if c["ci_low"] is not None else c["mean"]
                 for c in drawn_sts if drawn(c)]  # fmt: skip
    ax.set_ylim(_lowest(drawn_low), 1.05)
    ax.set_ylabel("mean (95% CI)")
    # Handles and labels given: matplotlib leaves out an artist whose label starts with "_"
    # (a variant named _current had no legend entry).
    ax.legend(handles, variants, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.tick_params(axis="x", rotation=30)
    left_out = "withheld and flagged ones not drawn: the tables above say why"
    out.append((f"Metrics with 95% confidence intervals ({left_out})", svg(fig)))
    plt.close(fig)

    data = table.to_pydict()
    with_values = [m for m in names if any(x is not None for x in data.get(m, []))]
    shown = [m for m in ("mrr", "ndcg@10", "recall@10") if m in names] or with_values[:3]
    if not shown:
        return out
    fig, axes = plt.subplots(1, len(shown), figsize=(4 * len(shown), 3.5), squeeze=False)
    for ax, m in zip(axes[0], shown, strict=True):
        series = [
            [x for x, vv in zip(data[m], data["variant"], strict=True) if vv == v and x is not None]
            for v in variants
        ]
        ax.boxplot(series, tick_labels=variants, showmeans=True)
        ax.set_title(f"{m} per query")
        ax.set_ylim(min(-0.05, _lowest(x for xs in series for x in xs)), 1.05)
        ax.tick_params(axis="x", rotation=20)
    out.append(("Per-query distributions", svg(fig)))
    plt.close(fig)

    if summary.deltas:
        others = list(summary.deltas)
        fig, ax = plt.subplots(figsize=(10, 4))
        width = 0.8 / len(others)
        handles = []
        for i, v in enumerate(others):
            d = [summary.deltas[v][m] for m in names]
            means = [x["mean"] for x in d]
            err = [
                [x["mean"] - x["ci_low"] if x["ci_low"] is not None else 0.0 for x in d],
                [x["ci_high"] - x["mean"] if x["ci_high"] is not None else 0.0 for x in d],
            ]
            bars = ax.bar(
                [j + i * width for j in range(len(names))],
                means,
                width,
                yerr=err,
                capsize=3,
            )
            handles.append(bars)
            mark_no_ci(ax, bars, [x["ci_low"] is not None for x in d])
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks([j + width * (len(others) - 1) / 2 for j in range(len(names))], names)
        ax.tick_params(axis="x", rotation=30)
        ax.set_ylabel("paired delta (95% CI)")
        labels = [f"{v} - {summary.baseline}" for v in others]
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        out.append((f"Deltas vs baseline ({summary.baseline})", svg(fig)))
        plt.close(fig)
    return out


# Questions shown in the HTML report's drill-down.
WORST_SHOWN = 10


def _rank_item(key: str, relevant: dict[str, int], rank: dict[str, str] | None) -> str:
    """One retrieved result: file, heading path and snippet; relevant ones marked."""
    hit = relevant.get(key, 0) > 0
    mark = f"<span class='grade'>✓ relevant, grade {relevant[key]}</span> " if hit else ""
    if rank is None:  # a report from before per-rank files were kept
        return f"<li class='{'hit' if hit else 'miss'}'>{mark}{html.escape(key)}</li>"
    heading = f" › {html.escape(rank['heading'])}" if rank["heading"] else ""
    return (
        f"<li class='{'hit' if hit else 'miss'}'>{mark}<b>{html.escape(rank['file'])}</b>"
        f"{heading}<div class='snip'>{html.escape(rank['snippet'])}</div></li>"
    )


def _worst_retrieval(table: pa.Table, metric: str, shown: int) -> str:
    rows = table.to_pylist()
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    by_item: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_item.setdefault(r["item_id"], {})[r["variant"]] = r
    first = variants[0]
    order = sorted(by_item, key=lambda i: (by_item[i][first][metric], by_item[i][first]["mrr"], i))
    parts = []
    for item_id in order[:shown]:
        group = by_item[item_id]
        head = group[first]
        relevant: dict[str, int] = json.loads(head["relevant"])
        scores = ", ".join(
            f"{html.escape(v)} {group[v][metric]:.3f}" for v in variants if v in group
        )
        expected = "".join(
            f"<li>{html.escape(key)} <span class='grade'>grade {grade}</span></li>"
            for key, grade in sorted(relevant.items(), key=lambda kv: -kv[1])
        )
        lists = []
        for v in variants:
            if v not in group:
                continue
            row = group[v]
            files = row.get("retrieved_files") or []
            ranks = [
                {"file": f, "heading": h, "snippet": t}
                for f, h, t in zip(
                    files, row.get("retrieved_headings") or [], row.get("retrieved_snippets") or [],
                    strict=False,
                )
            ]  # fmt: skip
            ranked = "".join(
                _rank_item(key, relevant, ranks[i] if i < len(ranks) else None)
                for i, key in enumerate(row["retrieved"])
            )
            lists.append(
                f"<div><b>{html.escape(v)}</b> retrieved ({metric} {row[metric]:.3f}, "
                f"mrr {row['mrr']:.3f}):<ol>{ranked or '<li>nothing</li>'}</ol></div>"
            )
        parts.append(
            f"<details><summary>{html.escape(item_id)}: {html.escape(head['query'])} "
            f"<span class='score'>{metric}: {scores}</span></summary>"
            f"<div>expected:<ul>{expected}</ul></div>{''.join(lists)}</details>"
        )
    return (
        f"<h2>Worst {min(shown, len(order))} of {len(order)} questions (by {metric} of "
        f"{html.escape(first)})</h2>" + "".join(parts)
    )


def _value(r: dict[str, Any], m: str) -> str:
    """One item's score, or its status; with the reason either way (a 0 given for an
    empty context says so)."""
    shown = f"{r[m]:.3f}" if r.get(m) is not None else html.escape(str(r.get(f"{m}_status")))
    reason = r.get(f"{m}_reason")
    return shown + (f" <i>({html.escape(reason)})</i>" if reason else "")


def _worst_rag(table: pa.Table, shown: int, notes: dict[str, str] | None = None) -> str:
    """``notes``: what the headline says of a withheld or flagged metric, said beside each
    of its scores too (a flagged judge's score is no plain measurement here either)."""
    said = notes or {}

    def line(r: dict[str, Any], m: str) -> str:
        note = f" <i>({html.escape(said[m])})</i>" if m in said else ""
        return f"<li>{m}: {_value(r, m)}{note}</li>"

    rows = table.to_pylist()

    def badness(r: dict[str, Any]) -> tuple[int, float, int, float, str]:
        # Answers the pipeline does not vouch for first (window_full, truncated, ...: their
        # scores read as any other's), then degenerate answers and false refusals, then
        # judge failures, then low correctness.
        untrusted = len(set(r.get("flags") or []) & UNTRUSTED_FLAGS.keys())
        wrong = (r.get("degenerate") or 0.0) + (r.get("false_refusal") or 0.0)
        correct = r.get("correct_refusal")
        wrong += 1.0 - (correct if correct is not None else 1.0)
        # Any metric that could not be scored: an empty answer's or a hedge's refusal
        # metric too (they left the list once the judge no longer failed on them).
        failed = sum(r.get(f"{m}_status") == "failed" for m in (*RAG_METRICS, *ANSWER_METRICS))
        f1 = r.get("answer_f1")
        return (-untrusted, -wrong, -failed, f1 if f1 is not None else 1.0, r["item_id"])

    parts = []
    for r in sorted(rows, key=badness)[:shown]:
        scored = "".join(line(r, m) for m in ANSWER_METRICS if m in r)
        judged = "".join(line(r, m) for m in RAG_METRICS)
        cited = set(r.get("cited_numbers") or [])
        files = r.get("source_files") or []
        headings = r.get("source_headings") or []
        holds = r.get("source_holds_target") or []
        contexts = []
        for i, text in enumerate(r.get("contexts") or []):
            where = ""
            if i < len(files):
                where = f"<b>{html.escape(files[i])}</b>" + (
                    f" › {html.escape(headings[i])}" if i < len(headings) and headings[i] else ""
                )
            marks = ("cited " if i + 1 in cited else "") + (
                "✓ holds a golden target" if i < len(holds) and holds[i] else ""
            )
            contexts.append(
                f"<li>{where} <span class='grade'>{marks}</span><pre>{html.escape(text)}</pre></li>"
            )
        invalid = [n for n in cited if not 1 <= n <= len(files)]
        expected = r.get("expected_answer")
        kind = (
            "" if r.get("answerable", True) else " <span class='grade'>(answerable: false)</span>"
        )
        parts.append(
            f"<details><summary>{html.escape(r['item_id'])}: {html.escape(r['query'])}{kind}"
            "</summary>"
            + (f"<p>expected: {html.escape(expected)}</p>" if expected else "")
            + f"<p>answer{' (not found)' if r['not_found'] else ''}: "
            f"{html.escape(r['answer'])}</p>"
            + (
                "<p class='warn'>flags: " + html.escape(", ".join(r["flags"])) + "</p>"
                if r.get("flags")
                else ""
            )
            + (
                "<p>written before the model said not found (withdrawn, not shown to the "
                f"user): {html.escape(r['withdrawn'])}</p>"
                if r.get("withdrawn")
                else ""
            )
            + (f"<p class='warn'>cites sources never given: {invalid}</p>" if invalid else "")
            + f"<div>scored without a judge:<ul>{scored}</ul></div>"
            f"<div>judge:<ul>{judged}</ul></div>"
            f"<div>sources given (numbered as cited):<ol>{''.join(contexts)}</ol></div></details>"
        )
    return (
        f"<h2>Worst {min(shown, len(rows))} of {len(rows)} questions (untrusted answers "
        f"first: {', '.join(UNTRUSTED_FLAGS)}; then degenerate answers and wrong refusals, "
        "then judge failures, then by answer F1)</h2>" + "".join(parts)
    )


def drill_down(summary: RunSummary, table: pa.Table, shown: int = WORST_SHOWN) -> str:
    """HTML: the worst questions with what was expected, retrieved (ranked) or answered."""
    if table.num_rows == 0:
        return ""
    if summary.kind == "rag":
        notes = {
            m: "not a measurement: " + str(st.get("flag") or "withheld")
            if st.get("withheld")
            else "flagged: " + str(st["flag"])
            for m, st in summary.metrics.get("rag", {}).items()
            if st.get("withheld") or st.get("flag")
        }
        return _worst_rag(table, shown, notes)
    return _worst_retrieval(table, "ndcg@10", shown)


def render_html(summary: RunSummary, md: str, table: pa.Table) -> str:
    """The run's report.html: ``md`` (its report.md), the plots, the worst questions."""
    title = f"ragpipe eval: {summary.name}"
    return html_page(title, md, plots(summary, table), drill_down(summary, table))


def html_page(title: str, md: str, figures: list[tuple[str, str]], drill: str = "") -> str:
    """One self-contained page: the Markdown tables rendered plainly, inline SVG, and the
    drill-down into the worst questions."""
    body = []
    in_table = False
    for line in md.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set("".join(cells)) <= set("-"):
                continue
            tag = "th" if not in_table else "td"
            if not in_table:
                body.append("<table>")
                in_table = True
            body.append(
                "<tr>" + "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in cells) + "</tr>"
            )
            continue
        if in_table:
            body.append("</table>")
            in_table = False
        if line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:].replace('`', ''))}</h2>")
        elif line.startswith("> "):
            body.append(f"<p class='warn'>{html.escape(line[2:].replace('**', ''))}</p>")
        elif line.startswith("- "):
            body.append(f"<p>• {html.escape(line[2:].replace('**', '').replace('`', ''))}</p>")
        elif line.strip():
            body.append(f"<p>{html.escape(line.replace('**', ''))}</p>")
    if in_table:
        body.append("</table>")
    for heading, figure in figures:  # not `title`: the page's <title> is read below
        body.append(f"<h2>{html.escape(heading)}</h2><div class='fig'>{figure}</div>")
    body.append(drill)
    style = (
        "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;"
        "font-variant-numeric:tabular-nums}th{background:#f3f3f3}.warn{color:#a40}"
        ".fig svg{max-width:100%;height:auto}details{margin:.4em 0}summary{cursor:pointer}"
        ".hit{color:#070}.miss{color:#555}.grade,.score{color:#666;font-size:90%}"
        "pre{white-space:pre-wrap;background:#f7f7f7;padding:4px}"
        ".snip{color:#444;font-size:90%;margin:.1em 0 .4em}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>{''.join(body)}</body></html>"
    )


def report_link(config: RagpipeConfig, out: Path, file: str = "report.html") -> str:
    """Where a team opens a run's report: under ``eval.reports_url`` when it is set
    (reports_dir served there), else under ``ragpipe serve``'s /reports/ when
    ``serve.public_url`` is set, else a file:// URL on this machine."""
    base = config.eval.reports_url
    if base is None and config.serve.public_url:
        base = f"{config.serve.public_url.rstrip('/')}/reports"
    if base:
        return f"{base.rstrip('/')}/{quote(out.name)}/{file}"
    return (out / file).resolve().as_uri()


def render_trend(golden: str, rows: list[dict[str, Any]]) -> str:
    """One golden set's history as an HTML page: per metric, the mean of every run over
    time with its 95% CI as whiskers, one line per kind of run (retrieval at its
    granularity, RAG), run name and variant, so that different measurements never share
    a line."""
    runs = sorted({(r["finished_at"], r["run_id"]) for r in rows})
    metrics = [m for m in (*METRICS, *ANSWER_METRICS, *RAG_METRICS)
               if any(r["metric"] == m for r in rows)]  # fmt: skip
    figures = []
    lines = [
        f"# Trend: {golden}",
        "",
        f"- {len(runs)} runs, oldest first; whiskers: 95% CI; a hollow point has no CI "
        f"(under {MIN_CI_N} items, or all values equal)",
        "- only metrics shown as values in their run: withheld or flagged metrics are not "
        "trend points",
        "",
    ]
    with _pyplot() as plt:
        for m in metrics:
            figures.append((m, _trend_figure(plt, m, rows, runs)))
    return html_page(f"ragpipe trend: {golden}", "\n".join(lines), figures)


def _trend_figure(
    plt: Any, metric: str, rows: list[dict[str, Any]], runs: list[tuple[str, str]]
) -> str:
    """One metric's trend as inline SVG: a line per trend series, runs in ``runs``' order."""
    position = {run_id: i for i, (_, run_id) in enumerate(runs)}
    series: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["metric"] == metric:
            series.setdefault(trend_series(r), []).append(r)
    fig, ax = plt.subplots(figsize=(10, 3.5))
    handles, labels = [], []
    for label, points in sorted(series.items()):
        points.sort(key=lambda p: position[p["run_id"]])
        xs = [position[p["run_id"]] for p in points]
        ys = [p["mean"] for p in points]
        low = [p["mean"] - p["ci_low"] if p["ci_low"] is not None else 0.0 for p in points]
        high = [p["ci_high"] - p["mean"] if p["ci_high"] is not None else 0.0 for p in points]
        line = ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3)
        handles.append(line)
        labels.append(label)
        bare = [(x, y) for x, y, p in zip(xs, ys, points, strict=True) if p["ci_low"] is None]
        if bare:  # no CI (under MIN_CI_N, or all equal): a hollow marker, no zero-width whisker
            ax.plot(*zip(*bare, strict=True), marker="o", linestyle="none", markersize=9,
                    markerfacecolor="white", color=line[0].get_color())  # fmt: skip
    ax.set_xticks(range(len(runs)), [run_id for _, run_id in runs])
    ax.tick_params(axis="x", rotation=30, labelsize=7)
    ax.set_ylabel(f"{metric} (95% CI)")
    # Handles and labels given: a label starting with "_" would be left out.
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    out = svg(fig)
    plt.close(fig)
    return out
