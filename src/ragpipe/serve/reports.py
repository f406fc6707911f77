"""The reports directory over HTTP (``ragpipe serve``'s ``/reports/``), read-only.

An index page lists the evaluation runs by golden set (newest first, each linked to
its report.html, with its scope: which items, what depth) with a trend page per
golden set; any file under ``eval.reports_dir`` is served as is. Nothing outside the
directory is: a path that leaves it (``..``, an absolute path, a symlink pointing out)
is not found.
"""

from __future__ import annotations

import html
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ragpipe.evaluation.report import history_cell, render_trend, trend_scope
from ragpipe.evaluation.run import read_history

# The index page's columns: retrieval metrics (METRICS) and RAG ones (ALL_RAG_METRICS).
HEADLINE = ("ndcg@10", "mrr", "recall@10", "answer_f1", "citation_precision", "faithfulness")


def inside(root: Path, relative: str) -> Path | None:
    """The regular file ``relative`` names under ``root``, symlinks resolved; None when
    there is none, or it lies outside ``root``."""
    base = root.resolve()
    if "\x00" in relative:
        return None
    try:
        target = (base / relative.lstrip("/")).resolve()
        # is_file() raises on a name too long for the file system (ENAMETOOLONG): a 500
        if not target.is_relative_to(base) or not target.is_file():
            return None
    except (OSError, RuntimeError):  # a symlink loop, a name too long
        return None
    return target


def _runs(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """golden set -> its runs, newest first, each with its headline metrics (history rows,
    flagged and withheld ones with their flag)."""
    runs: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in rows:
        run = runs[r["golden"]].setdefault(r["run_id"], {**r, "means": {}})
        if r["variant"] == run["variant"]:  # the baseline's (the first variant's) numbers
            run["means"][r["metric"]] = r
    return {golden: sorted(by_id.values(), key=lambda r: r["finished_at"], reverse=True)
            for golden, by_id in runs.items()}  # fmt: skip


def _cell(row: dict[str, Any]) -> str:
    judge = f" title='judge: {html.escape(row['judge'], quote=True)}'" if row.get("judge") else ""
    text = html.escape(history_cell(row))
    return (
        f"<span class='flag'{judge}>{text}</span>"
        if row.get("flag")
        else f"<span{judge}>{text}</span>"
    )


def index_page(root: Path) -> str:
    """The runs in ``root`` by golden set, each linked to its report, and a trend link."""
    history = read_history(root, flagged=True)
    groups = _runs(history)
    trended = {r["golden"] for r in history if not r["flag"]}  # a trend needs a value
    body = ["<h1>ragpipe evaluation reports</h1>"]
    if not groups:
        body.append(f"<p>No runs in {html.escape(str(root))} yet: run <code>ragpipe eval "
                    "retrieval</code> (or the eval deployments).</p>")  # fmt: skip
    for golden in sorted(groups):
        runs = groups[golden]
        shown = [m for m in HEADLINE if any(m in r["means"] for r in runs)]
        trend = (f" <small><a href='trend/{quote(golden, safe='')}'>trend of every metric</a>"
                 "</small>" if golden in trended else " <small>(no trend: every metric of "
                 "its runs is flagged or withheld)</small>")  # fmt: skip
        body.append(f"<h2>{html.escape(golden)}{trend}</h2>")
        head = "".join(f"<th>{html.escape(h)}</th>" for h in ("run", "kind", "finished",
                                                                 "scope", *shown))  # fmt: skip
        rows = []
        for r in runs:
            link = f"<a href='{quote(r['run_id'])}/report.html'>{html.escape(r['run_id'])}</a>"
            kind = r["kind"] if r["kind"] == "rag" else f"{r['kind']} ({r['granularity']})"
            cells = [link, html.escape(kind), html.escape(str(r["finished_at"])[:19]),
                     html.escape(trend_scope(r, settings=False))]  # fmt: skip
            # As every headline: the CI or "no CI" with n, the flag; the judge on hover.
            cells += [_cell(r["means"][m]) if m in r["means"] else "" for m in shown]
            rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        body.append(f"<table><tr>{head}</tr>{''.join(rows)}</table>")
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}"
             ".flag{color:#a15c00}")  # fmt: skip
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>ragpipe reports</title>"
        f"<style>{style}</style></head><body>{''.join(body)}</body></html>"
    )


def trend_page(root: Path, golden: str) -> str | None:
    """The trend page of one golden set; None when it has no run."""
    rows = [r for r in read_history(root) if r["golden"] == golden]
    return render_trend(golden, rows) if rows else None
