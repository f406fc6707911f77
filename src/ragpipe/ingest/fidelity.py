"""Fidelity of converted Markdown against a reference Markdown.

Used by ``bench/convert.py`` (and its tests) to judge the fast PDF mode
against Docling's model-pipeline output.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from dataclasses import dataclass

_HEADING_RE = re.compile(r"^\s{0,3}(#{1,6})\s+(.+?)(?:\s+#+)?\s*$")  # "# C#": "C#"
_COMMENT_RE = re.compile(r"<!--.*?-->", re.DOTALL)
_TOKEN_RE = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True)
class Fidelity:
    """Heading and text agreement of one document with its reference."""

    heading_recall: float
    heading_precision: float
    text_precision: float
    text_recall: float
    text_f1: float
    headings_ref: int
    headings_found: int


def headings(markdown: str) -> list[str]:
    """Normalised heading texts of a Markdown document, in order."""
    out = []
    for line in markdown.splitlines():
        match = _HEADING_RE.match(line)
        if match:
            out.append(_norm(match.group(2)))
    return out


def tokens(markdown: str) -> Counter[str]:
    """Bag of lower-cased word tokens, without comments and Markdown syntax."""
    text = _COMMENT_RE.sub(" ", markdown)
    return Counter(t.lower() for t in _TOKEN_RE.findall(text))


def _norm(text: str) -> str:
    return " ".join(_TOKEN_RE.findall(text.lower()))


def _matches(a: str, b: str) -> bool:
    return a == b or difflib.SequenceMatcher(None, a, b).ratio() >= 0.85


def _match_count(wanted: list[str], pool: list[str]) -> int:
    remaining = list(pool)
    hits = 0
    for item in wanted:
        for i, cand in enumerate(remaining):
            if _matches(item, cand):
                hits += 1
                del remaining[i]
                break
    return hits


def compare(ours: str, reference: str) -> Fidelity:
    """Compare a converted document with the reference conversion.

    Heading recall/precision match headings by normalised text (fuzzy, ratio
    ≥ 0.85), ignoring levels. Text scores are token-level bag-of-words
    precision, recall and F1.
    """
    ref_heads, our_heads = headings(reference), headings(ours)
    hits = _match_count(ref_heads, our_heads)
    ref_tokens, our_tokens = tokens(reference), tokens(ours)
    overlap = sum((ref_tokens & our_tokens).values())
    precision = overlap / max(1, sum(our_tokens.values()))
    recall = overlap / max(1, sum(ref_tokens.values()))
    f1 = 0.0 if overlap == 0 else 2 * precision * recall / (precision + recall)
    return Fidelity(
        heading_recall=hits / len(ref_heads) if ref_heads else 1.0,
        heading_precision=hits / len(our_heads) if our_heads else (1.0 if not ref_heads else 0.0),
        text_precision=precision,
        text_recall=recall,
        text_f1=f1,
        headings_ref=len(ref_heads),
        headings_found=len(our_heads),
    )
