"""Clean converted Markdown before chunking.

Every rule is switchable in :class:`~ragpipe.config.CleanConfig`, and every
removal or fix is counted by reason, so a run can say what cleaning did.
Fenced code blocks and ragpipe's page markers are left untouched.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ragpipe.config import CleanConfig, RagpipeConfig, fingerprint
from ragpipe.errors import InputError
from ragpipe.ingest import runner
from ragpipe.schemas import (
    PAGE_MARKER_RE,
    CleanedDocument,
    Document,
    Failure,
)

STAGE = "clean"
CLEAN_VERSION = "3"  # 3: tables: cell padding removed, a TOC only by its dot leaders

_PAGE_MARKER = re.compile(PAGE_MARKER_RE)
_COMMENT = re.compile(r"<!--(?!\s*ragpipe:page).*?-->", re.DOTALL)

# Each pattern matches a whole line (after stripping).
BOILERPLATE: dict[str, list[re.Pattern[str]]] = {
    "page_number": [
        re.compile(r"(?i)^(?:page\s+)?\d{1,4}\s*(?:of|/)\s*\d{1,4}$"),
        re.compile(r"(?i)^page\s+\d{1,4}$"),
        re.compile(r"^[-–—]?\s*\d{1,4}\s*[-–—]?$"),
    ],
    "copyright": [
        re.compile(r"(?i)^.{0,120}(?:©|\(c\)|copyright)\s*(?:\d{4}|by\b).{0,120}$"),
        re.compile(r"(?i)^.{0,160}\ball rights reserved\b.{0,80}$"),
    ],
    "download_notice": [
        re.compile(r"(?i)^this content downloaded from\b.*$"),
        re.compile(r"(?i)^(?:downloaded|retrieved|accessed)\s+(?:from|on)\b.{0,160}$"),
    ],
    "timestamp": [
        re.compile(
            r"(?i)^(?:\d{1,2}[/.-]\d{1,2}[/.-]\d{2,4}|\d{4}-\d{2}-\d{2})"
            r"(?:[ ,T]+\d{1,2}:\d{2}(?::\d{2})?\s*(?:am|pm|utc|z)?)?$"
        ),
    ],
    "ip_address": [
        re.compile(r"^(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?$"),
        re.compile(r"^[0-9a-fA-F]{1,4}(?::[0-9a-fA-F]{0,4}){2,7}$"),
    ],
}

LIGATURES = {
    "\ufb00": "ff",
    "\ufb01": "fi",
    "\ufb02": "fl",
    "\ufb03": "ffi",
    "\ufb04": "ffl",
    "\ufb05": "st",
    "\ufb06": "st",
    "\u0132": "IJ",
    "\u0133": "ij",
}
# Invisible or mis-decoded characters common in PDF/OCR text.
OCR_FIXES = {
    "\u00ad": "",  # soft hyphen
    "\u200b": "",  # zero-width space
    "\ufeff": "",  # stray BOM
    "\u00a0": " ",  # no-break space
    "\ufffd": "",  # replacement character
    "\uf0b7": "•",  # Symbol-font bullet in the private use area
}
_LIGATURE_RE = re.compile("|".join(map(re.escape, [*LIGATURES, *OCR_FIXES])))
# "-\n" between two letters before and two lowercase letters after. Lookarounds, not
# captured words: a greedy word pattern backtracks quadratically on a long letter run.
_HYPHEN_RE = re.compile(r"(?<=[^\W\d_]{2})-\n(?=[a-z]{2})")
_TOC_ENTRY = re.compile(
    r"(?:(?:\.\s*){3,}|\s{2,}|\s)(?:\d{1,4}|[ivxlcdm]{1,6})\s*\|?$", re.IGNORECASE
)
_DOT_LEADER = re.compile(r"(?:\.\s?){4,}")
# The delimiter row under a pipe table's header (``|---|:-:|``, Docling also writes ``| - |``).
TABLE_DELIMITER = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")


def is_table_delimiter(line: str) -> bool:
    """Whether ``line`` is a pipe table's delimiter row (it has a pipe: ``---`` is a rule)."""
    return "|" in line and TABLE_DELIMITER.match(line) is not None


@dataclass(frozen=True)
class CleanResult:
    """Cleaned Markdown and what was removed or fixed, by reason."""

    markdown: str
    dropped: dict[str, int]


def _blocks(markdown: str) -> list[str]:
    """Split into blank-line separated blocks, keeping fenced code blocks whole."""
    blocks: list[str] = []
    current: list[str] = []
    fenced = False
    for line in markdown.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and not line.strip() and not line.lstrip().startswith("```"):
            if current:
                blocks.append("\n".join(current))
                current = []
            continue
        current.append(line)
    if current:
        blocks.append("\n".join(current))
    return blocks


_CELL_SPLIT = re.compile(r"(?<!\\)\|")


def _compact_row(line: str, delimiter: bool) -> str:
    """``|  a   |  b |`` → ``| a | b |``; a delimiter row → ``|---|:-:|``."""
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    cells = [c.strip() for c in _CELL_SPLIT.split(inner)]
    if delimiter:
        cells = [
            (":" if c.startswith(":") else "")
            + "---"
            + (":" if c.endswith(":") and len(c) > 1 else "")
            for c in cells
        ]
        return "|" + "|".join(cells) + "|"
    return "| " + " | ".join(cells) + " |"


def _aligned(cell: str) -> str:
    left = ":" if cell.startswith(":") else ""
    right = ":" if cell.endswith(":") and len(cell) > 1 else ""
    return f"{left}---{right}"


def compact_tables(block: str) -> tuple[str, int]:
    """The block with its pipe tables' cell padding removed, and how many tables changed.

    Docling pads every cell to its column's widest: one long cell makes every row as wide,
    and a delimiter row of a hundred dashes costs a hundred word-pieces in every chunk that
    repeats the header. Cells, alignment and order are kept.
    """
    lines = block.split("\n")
    tables = 0
    i = 0
    while i + 1 < len(lines):
        if lines[i].lstrip().startswith("|") and is_table_delimiter(lines[i + 1]):
            before = lines[i:]
            lines[i] = _compact_row(lines[i], False)
            lines[i + 1] = _compact_row(lines[i + 1], True)
            j = i + 2
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                if j + 1 < len(lines) and is_table_delimiter(lines[j + 1]):
                    break  # the next table's header
                lines[j] = _compact_row(lines[j], False)
                j += 1
            tables += lines[i:j] != before[: j - i]
            i = j
        else:
            i += 1
    return "\n".join(lines), tables


def _is_toc(block: str, config: CleanConfig) -> bool:
    raw = [ln for ln in block.split("\n") if ln.strip()]
    table = len(raw) > 1 and raw[0].lstrip().startswith("|") and is_table_delimiter(raw[1])
    if table:
        raw = [raw[0], *raw[2:]]
    lines = [ln.strip().strip("|").strip() for ln in raw]
    if table:
        # A table is a table of contents by its dot leaders only: a data table's last column
        # holds numbers too (prices, ports, years, sorted ids), and deleting data is worse
        # than indexing a contents page.
        leaders = sum(1 for ln in lines if _DOT_LEADER.search(ln))
        return len(lines) >= config.toc_min_lines and leaders / len(lines) >= config.toc_ratio
    if len(lines) >= config.toc_min_lines:
        entries = [m for ln in lines if not ln.startswith("#") and (m := _TOC_ENTRY.search(ln))]
        if len(entries) / len(lines) >= config.toc_ratio:
            return True
    # Converters may join TOC lines into one paragraph: count dot leaders instead.
    return len(_DOT_LEADER.findall(block)) >= config.toc_min_lines


def clean_markdown(markdown: str, config: CleanConfig) -> CleanResult:
    """Apply the configured cleaning rules.

    Args:
        markdown: Converted Markdown (page markers allowed).
        config: Which rules run.

    Returns:
        The cleaned text and counts of what each rule removed or fixed.
    """
    dropped: Counter[str] = Counter()
    custom = [re.compile(p) for p in config.extra_patterns]

    if config.html_comments:
        markdown, n = _COMMENT.subn("", markdown)
        dropped["html_comment"] += n
    if config.ligatures:

        def fix(match: re.Match[str]) -> str:
            char = match.group(0)
            dropped["ligature" if char in LIGATURES else "ocr_fix"] += 1
            return LIGATURES.get(char) or OCR_FIXES[char]

        markdown = _LIGATURE_RE.sub(fix, markdown)

    out: list[str] = []
    for block in _blocks(markdown):
        stripped = block.strip()
        if stripped.startswith("```") or _PAGE_MARKER.match(stripped):
            out.append(block)
            continue
        if config.toc and _is_toc(block, config):
            dropped["toc"] += 1
            continue
        kept_lines = []
        for line in block.split("\n"):
            reason = _line_drop_reason(line.strip(), config, custom)
            if reason:
                dropped[reason] += 1
            else:
                kept_lines.append(line.rstrip())
        if not kept_lines:
            continue
        text = "\n".join(kept_lines)
        if config.hyphenation:
            text, n = _HYPHEN_RE.subn("", text)
            dropped["hyphenation"] += n
        if config.compact_tables:
            text, n = compact_tables(text)
            dropped["table_padding"] += n
        text = re.sub(r"[ \t]{2,}", " ", text) if not text.lstrip().startswith("|") else text
        out.append(text)
    cleaned = "\n\n".join(out).strip()
    return CleanResult(cleaned + "\n" if cleaned else "", {k: v for k, v in dropped.items() if v})


def _line_drop_reason(line: str, config: CleanConfig, custom: list[re.Pattern[str]]) -> str | None:
    if not line or line.startswith("#"):
        return None
    if config.boilerplate:
        for reason, patterns in BOILERPLATE.items():
            if any(p.match(line) for p in patterns):
                return reason
    if any(p.search(line) for p in custom):
        return "custom"
    return None


# -- clean ---------------------------------------------------------------------------


@dataclass
class CleanCounts(runner.Counts):
    """Documents cleaned, failures, and what each rule removed or fixed."""

    documents: int = 0
    failed: int = 0
    dropped: dict[str, int] = field(default_factory=dict, metadata={"prefix": "dropped"})


def run_clean(
    config: RagpipeConfig, converted: runner.StageSummary[Any]
) -> runner.StageSummary[CleanCounts]:
    """Clean every converted document."""
    started = time.perf_counter()
    here = runner.WorkDir.of(config).stage("clean")
    config_fp = fingerprint(config.clean, CLEAN_VERSION)
    reused = runner.reuse_stage(
        here, "clean", config_fp, converted.output_fingerprint, CleanCounts, converted.plan_id
    )
    if reused:
        return reused
    docs = runner.read_input(config, converted, "documents.parquet", Document)

    def clean_one(doc: Document) -> CleanedDocument:
        result = clean_markdown(doc.markdown, config.clean)
        if not result.markdown.strip():
            raise InputError("no_text", "nothing left after cleaning (all boilerplate?)")
        return CleanedDocument(
            doc_id=doc.doc_id,
            file_path=doc.file_path,
            source_sha256=doc.source_sha256,
            kind=doc.kind,
            converter=doc.converter,
            markdown=result.markdown,
            dropped=result.dropped,
            config_fingerprint=config_fp,
        )

    cleaned, failures = runner.per_document(
        "clean", docs, clean_one, lambda d: (d.file_path, d.source_sha256)
    )
    dropped: Counter[str] = Counter()
    for doc in cleaned:
        dropped.update(doc.dropped)
    counts = CleanCounts(len(cleaned), len(failures), dict(dropped))
    return runner.finish_stage(
        here,
        "clean",
        config_fp,
        converted.output_fingerprint,
        {"documents": (cleaned, CleanedDocument), "failures": (failures, Failure)},
        counts,
        started,
        converted.plan_id,
    )
