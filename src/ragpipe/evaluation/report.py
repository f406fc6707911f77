"""Rendering an evaluation run: Markdown, and a self-contained HTML page with plots and
a drill-down into the worst questions. Only renders: ``ragpipe.evaluation.run`` scores
the run and writes its files."""

from __future__ import annotations

import html
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pyarrow as pa

from ragpipe.config import RagpipeConfig
from ragpipe.evaluation.metrics import METRICS
from ragpipe.evaluation.rag import RAG_METRICS

if TYPE_CHECKING:
    from ragpipe.evaluation.run import RunSummary


def _fmt(ci: dict[str, Any]) -> str:
    if not ci["n"]:
        return "n/a"
    return f"{ci['mean']:.3f} [{ci['ci_low']:.3f}, {ci['ci_high']:.3f}]"


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


def render_markdown(summary: RunSummary) -> str:
    """The run's report.md: provenance, metrics with CIs, deltas, gate, judge, settings."""
    names = _names(summary)
    title = "RAG evaluation" if summary.kind == "rag" else "Retrieval evaluation"
    lines = [f"# {title}: {summary.name}", ""]
    g = summary.golden
    lines += [
        f"- golden set: **{g.name}** ({g.queries} queries, `{g.source}`)",
        f"- granularity: {summary.granularity}, depth {summary.depth}",
        f"- corpus: {summary.corpus['files']} files, {summary.corpus['points']} chunks "
        f"(fingerprint {summary.corpus['sha256']})",
        *_index_version_line(summary.corpus.get("index_version") or {}),
        f"- embedder: {summary.models['embedder']}; git {summary.git_revision or 'n/a'}",
        f"- 95% CIs: percentile bootstrap, {summary.statistics['resamples']} resamples, "
        f"seed {summary.statistics['seed']}",
        "",
    ]
    for warning in summary.warnings:
        lines.append(f"> **warning:** {warning}")
    variants = list(summary.metrics)
    lines += ["", "| metric | " + " | ".join(variants) + " |", "|---" * (len(variants) + 1) + "|"]
    for m in names:
        lines.append(f"| {m} | " + " | ".join(_fmt(summary.metrics[v][m]) for v in variants) + " |")
    if summary.deltas:
        lines += ["", f"## Paired deltas vs `{summary.baseline}`", ""]
        others = list(summary.deltas)
        lines += ["| metric | " + " | ".join(others) + " |", "|---" * (len(others) + 1) + "|"]
        for m in names:
            cells = []
            for v in others:
                d = summary.deltas[v][m]
                ci = f"[{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"
                cells.append(f"{d['mean']:+.3f} {ci} p={d['p_value']:.3f}")
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
        judge = summary.judge
        lines += [
            "",
            "## Judge",
            "",
            f"- model: {judge['model']}, temperature {judge['temperature']}, ragas "
            f"{judge['ragas']}; metrics: {', '.join(judge['metric_classes'])}",
            "- a judge failure is recorded as null with its reason (never as 0); "
            "not applicable: context_recall without expected_answer, faithfulness of a "
            "'not found' answer",
            "",
            "| metric | scored | failed | not applicable |",
            "|---|---|---|---|",
        ]
        for m in names:
            c = judge["counts"][m]
            lines.append(f"| {m} | {c['ok']} | {c['failed']} | {c['not_applicable']} |")
    lines += ["", "## Settings", ""]
    for v, s in summary.variants.items():
        keys = (
            "mode",
            "fusion_method",
            "alpha",
            "doc_weight",
            "rrf_k",
            "prefetch",
            "rerank",
            "mmr",
            "hyde",
        )
        lines.append(f"- **{v}**: " + ", ".join(f"{k}={s[k]}" for k in keys))
    return "\n".join(lines) + "\n"


def _svg(fig: Any) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight")
    return buffer.getvalue()[buffer.getvalue().index("<svg") :]


def plots(summary: RunSummary, table: pa.Table) -> list[tuple[str, str]]:
    """(title, inline SVG) figures: metric bars with CI whiskers, distributions, deltas."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    names = _names(summary)
    variants = list(summary.metrics)
    width = 0.8 / len(variants)
    fig, ax = plt.subplots(figsize=(10, 4))
    for i, v in enumerate(variants):
        means = [summary.metrics[v][m]["mean"] for m in names]
        low = [means[j] - summary.metrics[v][m]["ci_low"] for j, m in enumerate(names)]
        high = [summary.metrics[v][m]["ci_high"] - means[j] for j, m in enumerate(names)]
        xs = [j + i * width for j in range(len(names))]
        ax.bar(xs, means, width, yerr=[low, high], capsize=3, label=v)
    ax.set_xticks([j + width * (len(variants) - 1) / 2 for j in range(len(names))], names)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("mean (95% CI)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.tick_params(axis="x", rotation=30)
    out.append(("Metrics with 95% confidence intervals", _svg(fig)))
    plt.close(fig)

    data = table.to_pydict()
    shown = [m for m in ("mrr", "ndcg@10", "recall@10") if m in names] or names[:3]
    fig, axes = plt.subplots(1, len(shown), figsize=(4 * len(shown), 3.5), squeeze=False)
    for ax, m in zip(axes[0], shown, strict=True):
        series = [
            [x for x, vv in zip(data[m], data["variant"], strict=True) if vv == v and x is not None]
            for v in variants
        ]
        ax.boxplot(series, tick_labels=variants, showmeans=True)
        ax.set_title(f"{m} per query")
        ax.set_ylim(-0.05, 1.05)
        ax.tick_params(axis="x", rotation=20)
    out.append(("Per-query distributions", _svg(fig)))
    plt.close(fig)

    if summary.deltas:
        others = list(summary.deltas)
        fig, ax = plt.subplots(figsize=(10, 4))
        width = 0.8 / len(others)
        for i, v in enumerate(others):
            d = [summary.deltas[v][m] for m in names]
            means = [x["mean"] for x in d]
            err = [[x["mean"] - x["ci_low"] for x in d], [x["ci_high"] - x["mean"] for x in d]]
            ax.bar(
                [j + i * width for j in range(len(names))],
                means,
                width,
                yerr=err,
                capsize=3,
                label=f"{v} - {summary.baseline}",
            )
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks([j + width * (len(others) - 1) / 2 for j in range(len(names))], names)
        ax.tick_params(axis="x", rotation=30)
        ax.set_ylabel("paired delta (95% CI)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        out.append((f"Deltas vs baseline ({summary.baseline})", _svg(fig)))
        plt.close(fig)
    return out


# Questions shown in the HTML report's drill-down.
WORST_SHOWN = 10


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
        scores = ", ".join(f"{v} {group[v][metric]:.3f}" for v in variants if v in group)
        expected = "".join(
            f"<li>{html.escape(key)} <span class='grade'>grade {grade}</span></li>"
            for key, grade in sorted(relevant.items(), key=lambda kv: -kv[1])
        )
        lists = []
        for v in variants:
            if v not in group:
                continue
            ranked = "".join(
                f"<li class='{'hit' if key in relevant else 'miss'}'>{html.escape(key)}"
                + (f" <span class='grade'>grade {relevant[key]}</span>" if key in relevant else "")
                + "</li>"
                for key in group[v]["retrieved"]
            )
            lists.append(
                f"<div><b>{html.escape(v)}</b> retrieved ({metric} {group[v][metric]:.3f}, "
                f"mrr {group[v]['mrr']:.3f}):<ol>{ranked or '<li>nothing</li>'}</ol></div>"
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


def _worst_rag(table: pa.Table, shown: int) -> str:
    rows = table.to_pylist()

    def badness(r: dict[str, Any]) -> tuple[int, float, str]:
        scores = [r[m] for m in RAG_METRICS if r[m] is not None]
        failed = sum(r[f"{m}_status"] == "failed" for m in RAG_METRICS)
        return (-failed, sum(scores) / len(scores) if scores else 0.0, r["item_id"])

    parts = []
    for r in sorted(rows, key=badness)[:shown]:
        judged = "".join(
            f"<li>{m}: "
            + (f"{r[m]:.3f}" if r[m] is not None else html.escape(r[f"{m}_status"]))
            + (f" <i>({html.escape(r[f'{m}_reason'])})</i>" if r[f"{m}_reason"] else "")
            + "</li>"
            for m in RAG_METRICS
        )
        contexts = "".join(f"<li><pre>{html.escape(c)}</pre></li>" for c in r.get("contexts") or [])
        expected = r.get("expected_answer")
        parts.append(
            f"<details><summary>{html.escape(r['item_id'])}: {html.escape(r['query'])}</summary>"
            + (f"<p>expected: {html.escape(expected)}</p>" if expected else "")
            + f"<p>answer{' (not found)' if r['not_found'] else ''}: "
            f"{html.escape(r['answer'])}</p><div>judge:<ul>{judged}</ul></div>"
            f"<div>contexts (numbered as cited):<ol>{contexts}</ol></div></details>"
        )
    return (
        f"<h2>Worst {min(shown, len(rows))} of {len(rows)} questions (judge failures first, "
        "then by mean score)</h2>" + "".join(parts)
    )


def drill_down(summary: RunSummary, table: pa.Table, shown: int = WORST_SHOWN) -> str:
    """HTML: the worst questions with what was expected, retrieved (ranked) or answered."""
    if table.num_rows == 0:
        return ""
    if summary.kind == "rag":
        return _worst_rag(table, shown)
    return _worst_retrieval(table, "ndcg@10", shown)


def render_html(summary: RunSummary, md: str, table: pa.Table) -> str:
    """The run's report.html: ``md`` (its report.md), the plots, the worst questions."""
    return html_page(summary, md, plots(summary, table), drill_down(summary, table))


def html_page(summary: RunSummary, md: str, figures: list[tuple[str, str]], drill: str = "") -> str:
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
    for title, svg in figures:
        body.append(f"<h2>{html.escape(title)}</h2><div class='fig'>{svg}</div>")
    body.append(drill)
    style = (
        "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;"
        "font-variant-numeric:tabular-nums}th{background:#f3f3f3}.warn{color:#a40}"
        ".fig svg{max-width:100%;height:auto}details{margin:.4em 0}summary{cursor:pointer}"
        ".hit{color:#070}.miss{color:#555}.grade,.score{color:#666;font-size:90%}"
        "pre{white-space:pre-wrap;background:#f7f7f7;padding:4px}"
    )
    title = html.escape(f"ragpipe eval: {summary.name}")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
        f"<style>{style}</style></head><body>{''.join(body)}</body></html>"
    )


def report_link(config: RagpipeConfig, out: Path, file: str = "report.html") -> str:
    """Where a team opens a run's report: under ``eval.reports_url`` when it is set
    (reports_dir served there), else a file:// URL on this machine."""
    if config.eval.reports_url:
        return f"{config.eval.reports_url.rstrip('/')}/{quote(out.name)}/{file}"
    return (out / file).resolve().as_uri()
