"""Search results as text, JSON or XML: for the command line and the HTTP API alike."""

from __future__ import annotations

import json
import re
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from ragpipe.query.results import RetrievalResult

# Characters XML 1.0 does not allow at all (not even escaped): C0 controls but tab, LF and
# CR, lone surrogates, U+FFFE and U+FFFF.
_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


# What a terminal acts on instead of printing: C0 controls (ESC starts colour, cursor and
# title sequences) but tab and newline, DEL, and the C1 controls (0x9b is a one-byte CSI).
_TERMINAL_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


# -- output formats ------------------------------------------------------------------


def search_json(result: RetrievalResult) -> dict[str, Any]:
    """The JSON form of a search: ranked hits with every stage's score, and the trace.

    ``ragpipe search --format json`` prints it; ``POST /search`` of ``ragpipe serve``
    returns it.
    """
    hits = [
        {
            "rank": i,
            "point_id": h.point_id,
            "score": h.score,
            "scores": h.scores,
            "file_path": h.file_path,
            "page": h.page,
            "heading": h.heading,
            "text": h.text,
        }
        for i, h in enumerate(result.hits, start=1)
    ]
    return {"query": result.query, "hits": hits, "trace": result.trace}


def to_json(result: RetrievalResult) -> str:
    return json.dumps(search_json(result), indent=2)


def xml_safe(text: str) -> str:
    """``text`` without the characters XML 1.0 forbids (escaping cannot make them legal)."""
    return _XML_INVALID.sub("", text)


def terminal_safe(text: str) -> str:
    """``text`` without control characters a terminal would act on (escape sequences)."""
    return _TERMINAL_CONTROL.sub("", text)


def one_line(text: str) -> str:
    """``terminal_safe`` and on one line: a newline in a file name or heading is shown as
    ``\\n``, so it cannot print a fake result line."""
    return terminal_safe(text).replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")


def to_xml(result: RetrievalResult) -> str:
    """A ``<retrieved_context>`` block for prompts: well-formed for any stored text.

    Every value is escaped; characters XML forbids outright (most C0 controls)
    are dropped.
    """

    def attr(value: str) -> str:
        return quoteattr(xml_safe(value))

    lines = ["<retrieved_context>"]
    for i, h in enumerate(result.hits, start=1):
        attrs = f"id={attr(str(i))} file={attr(h.file_path)}"
        if h.page is not None:
            attrs += f" page={attr(str(h.page))}"
        if h.heading:
            attrs += f" heading={attr(h.heading)}"
        attrs += f" score={attr(f'{h.score:.6g}')}"
        lines.append(f"<source {attrs}>{escape(xml_safe(h.text))}</source>")
    lines.append("</retrieved_context>")
    return "\n".join(lines)


def to_text(result: RetrievalResult, width: int = 300) -> str:
    """Readable lines for a terminal; document text never carries control sequences."""
    lines = []
    for i, h in enumerate(result.hits, start=1):
        where = one_line(h.file_path) + (f" p.{h.page}" if h.page is not None else "")
        stages = " ".join(f"{k}={v:.4g}" for k, v in h.scores.items())
        heading = one_line(h.heading) if h.heading else "-"
        lines.append(f"{i}. {where}  [{heading}]  score={h.score:.4g}  ({stages})")
        snippet = " ".join(terminal_safe(h.text).split())
        lines.append("   " + (snippet[:width] + ("…" if len(snippet) > width else "")))
    if not lines:
        lines.append("(no results)")
    cost = result.trace.get("llm_rerank")
    if cost:
        lines.append(rerank_cost_line(cost))
    return "\n".join(lines)


def rerank_cost_line(cost: dict[str, Any]) -> str:
    """What an LLM rerank cost, in one line."""
    return (
        f"llm rerank ({one_line(str(cost['model']))}): {cost['pairs']} candidates, "
        f"{cost['model_calls']} "
        f"model calls, {cost['cached']} cached, {cost['seconds']:.1f} s"
    )
