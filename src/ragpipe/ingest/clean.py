"""Clean converted Markdown before chunking.

Every rule is switchable in :class:`~ragpipe.config.CleanConfig`, and every
removal or fix is counted by reason, so a run can say what cleaning did.
Fenced code blocks and ragpipe's page markers are left untouched (but for a PDF's fenced
book index, see ``_index_listing``), and so are table rows by the line rules.

Rules follow the document's kind (``KIND_RULES``): page furniture (page numbers,
download stamps, print timestamps, IP addresses) and words hyphenated across a
line break are a PDF's; a text file (code, config, plain text) keeps every
character but invisible ones, its indentation included.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
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
# 3: tables: cell padding removed, a TOC only by its dot leaders. 4: rules by kind, a TOC
# entry needs a page-number gap, comments only within a block, indentation kept. 5: no
# contents page in a record; leaders need the next entry after their page number. 6: a
# contents page or index of one entry per paragraph is judged as one block. 7: so is a
# PDF's book index set as code.
CLEAN_VERSION = "7"

_PAGE_MARKER = re.compile(PAGE_MARKER_RE)

# Each pattern matches a whole line (after stripping).
BOILERPLATE: dict[str, list[re.Pattern[str]]] = {
    "page_number": [
        re.compile(r"(?i)^page\s+\d{1,4}\s*(?:of|/)\s*\d{1,4}$"),
        _N_OF_M := re.compile(r"(?i)^\d{1,4}\s*(?:of|/)\s*\d{1,4}$"),  # "3/4": a PDF's only
        re.compile(r"(?i)^page\s+\d{1,4}$"),
        _LONE_NUMBER := re.compile(r"^(?:[-–—]\s*\d{1,4}\s*[-–—]|\d{1,4})$"),  # not "- 22"
    ],
    "copyright": [
        # A line that starts with the notice and its year: "© 2021 Example", "Copyright
        # (C) 2005 FSF", "Copyright c© 1998-2020 Kurt Hornik", "© Copyright 2014 IBM". Not
        # "(c) by the agent", "(c) In 2019 the committee...", "Copyright law changed in
        # 1998", "type the © sign".
        re.compile(
            r"(?i)^(?:©|\(c\)|copyright)(?:\s*(?:©|\(c\)|c©|copyright))*\s*\d{4}"
            r"(?:\s*[-–,]\s*\d{4})*\b.{0,200}$"
        ),
        # In a PDF, as before the kind rules: © anywhere, or the notice and a year ("(C)
        # Copyright IBM Corporation 2015", "Copyright © The R Core Team 2020").
        _PDF_COPYRIGHT := re.compile(
            r"(?i)^.{0,120}(?:©|(?:\(c\)|copyright)\s*(?:\(c\)\s*)?\d{4}).{0,120}$"
        ),
        # ... or that ends in the reservation (and perhaps a page): not a sentence about it.
        re.compile(r"(?i)^.{0,160}\ball rights reserved\b[.,;]?(?:\s+\S{1,8})?$"),
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
        # IPv6: a hex letter or "::" (12:30:45 is a time).
        re.compile(r"^(?=.*(?:[a-fA-F]|::))[0-9a-fA-F]{1,4}(?::[0-9a-fA-F]{0,4}){2,7}$"),
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
# A page number as a contents page writes it: arabic, or a roman numeral up to 39 in one
# case (a front matter's pages), never empty.
_ROMAN = r"x{0,3}(?:ix|iv|vi{0,3}|i{1,3})|x{1,3}"
_PAGE = rf"(?:\d{{1,4}}|{_ROMAN}|{_ROMAN.upper()})"
# A contents entry ends in its page number after dot leaders or a gap of two spaces or a
# tab: after one space it is the end of a sentence or list item ("IPO in 2004", "DVD").
_TOC_ENTRY = re.compile(rf"(?:(?:\.\s*){{3,}}|\s{{2,}}|\t){_PAGE}\s*\|?$")
# Or, after one space, where the line starts with a section number ("2.1 Data 7"; not
# "1. Step": a Markdown list) and the block's pages never go down.
# A section number is short ("2019 Europe 120" is a row of a table of years).
_NUMBERED_ENTRY = re.compile(
    r"^(\d{1,2}(?:\.\d{1,3})*|chapter\s+\d{1,2}|appendix\s+[a-z])\s+\S.*\s(\d{1,4})$",
    re.IGNORECASE,
)
_DOT_LEADER = re.compile(r"(?:\.\s?){4,}")
# Leaders to a page followed by the line's end or the next entry (a section number, a
# title), as prose's leaders and ellipses are not: "Resolving.... 12 packages", "Group A
# ........ 12 patients, Group B ........ 15 patients", "Unpacking.......... 100% done".
# After long leaders the next entry may be a book index's: ". . . . 26, 27 term . . . 30",
# a term in lower case that reaches its own leaders on the line, with no punctuation.
# A next entry's title reaches its own leaders on its line: "0 Errors\ntest ........" and
# "120 EUR\nShipping ........" are a unit after a number, not a title.
_NEXT_ENTRY = r"\s*$|\s+(?:\d+(?:\.\d+)*\s+)?[A-Z][^\n]{0,100}?(?:\.\s?){4}"
_LEADER_ENTRY = re.compile(
    rf"(?:\.\s?){{8,}}\s*{_PAGE}\b"
    rf"(?={_NEXT_ENTRY}|\s*,\s*\d|[ \t]+[^\W\d_][^,;:.\n]{{0,80}}?(?:\.\s?){{4,}})"
    rf"|(?:\.\s?){{4,7}}\s*{_PAGE}(?={_NEXT_ENTRY})"
)
# A book index joined into one paragraph ("generic, internal . . . . . 12 read.table . . .
# 5, 11"): its terms hold commas and dots, so it is told by long leaders to a page making
# at least half of the block (0.66 and 0.75 in R-ints and R-lang; prose 0.24 to 0.37).
_LONG_LEADER = re.compile(rf"(?:\.\s?){{8,}}\s*{_PAGE}\b")
_INDEX_SHARE = 0.5
# A line that ends in leaders to its page or pages: a contents or index entry that is a
# paragraph of its own ("2 R Basics. . . . . . 3", "cbind . . . . 26, 58"; R's index term
# ".." runs into its leaders), as a PDF's contents page comes when every chapter's entry is
# set apart.
_LEADER_TO_PAGES = re.compile(rf"(?:\.\s?){{4,}}\s*{_PAGE}(?:\s*,\s*{_PAGE})*$")

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


# Backticks only: Docling writes every code block so, and a converted paragraph that starts
# "~~~ Part two ~~~" is text (read as a fence, it took every later heading).
_FENCE = re.compile(r"\s*(`{3,})(.*)")
_FENCE_CLOSE = re.compile(r"\s*`{3,}\s*")


class Fences:
    """Where fenced code is, line by line, as CommonMark reads backtick fences: a fence
    opens with three or more backticks and closes only on a line of backticks at least as
    long, with nothing after it. Docling writes a four-backtick fence around
    code that holds a three-backtick one; toggling on every line starting with three
    backticks closed it there, so the code's "# Setup" comment became a heading and
    every later section hung under it."""

    def __init__(self) -> None:
        self.opened: str | None = None

    @property
    def inside(self) -> bool:
        return self.opened is not None

    def step(self, line: str) -> bool:
        """Whether ``line`` opens or closes a fence; reads it as the next line."""
        match = _FENCE.match(line)
        if match is None:
            return False
        run, rest = match.groups()
        if self.opened is None:
            if run[0] == "`" and "`" in rest:  # inline code ("```x```"), no fence
                return False
            self.opened = run
            return True
        if run[0] == self.opened[0] and len(run) >= len(self.opened) and not rest.strip():
            self.opened = None
            return True
        return False


def opens_fence(block: str) -> bool:
    """Whether ``block`` starts with an opening fence."""
    return Fences().step(block.lstrip("\n").split("\n", 1)[0])


def _blocks(markdown: str) -> list[str]:
    """Split into blank-line separated blocks; a fenced code block is a block of its own,
    whole (its blank lines kept), also where text runs into it with no blank line."""
    blocks: list[str] = []
    current: list[str] = []
    fences = Fences()

    def flush() -> None:
        if current:
            blocks.append("\n".join(current))
            current.clear()

    for line in markdown.split("\n"):
        fence = fences.step(line)
        fenced = fences.inside
        if fence and fenced:
            flush()  # "Example:" and the fence under it: two blocks
        if not fenced and not fence and not line.strip():
            flush()
            continue
        current.append(line)
        if fence and not fenced:
            flush()  # the closing fence ends the block
    flush()
    return blocks


def strip_comments(text: str) -> tuple[str, int]:
    """``text`` without its HTML comments (ragpipe's page markers kept), and how many.

    Linear: a ``<!--`` with no ``-->`` after it ends the search (so does every later
    one), where a lazy pattern rescanned the rest of the text for each of them.
    """
    out: list[str] = []
    start = removed = 0
    while (opened := text.find("<!--", start)) >= 0:
        closed = text.find("-->", opened + 4)
        if closed < 0:
            break
        if _PAGE_MARKER.match(text, opened):
            out.append(text[start : closed + 3])
        else:
            out.append(text[start:opened])
            removed += 1
        start = closed + 3
    out.append(text[start:])
    return "".join(out), removed


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
        matched = [m for ln in lines if (m := _NUMBERED_ENTRY.match(ln))]
        numbered = [int(m[2]) for m in matched]
        pages_rise = all(a <= b for a, b in pairwise(numbered))
        # A contents page has sections below chapters ("2.1"); numbered steps do not.
        sections = any("." in m[1] for m in matched)
        if sections and pages_rise and len(numbered) / len(lines) >= config.toc_ratio:
            return True
    # Converters may join TOC lines into one paragraph: count leaders to a page instead.
    if len(_LEADER_ENTRY.findall(block)) >= config.toc_min_lines:
        return True
    runs = [m.end() - m.start() for m in _LONG_LEADER.finditer(block)]
    return len(runs) >= config.toc_min_lines and sum(runs) >= _INDEX_SHARE * len(block)


def _entry_block(block: str) -> bool:
    """Whether every line of ``block`` could be one contents or index entry: it ends in
    leaders to its pages, or starts with a section number and ends in one (``2.1 Data
    7``). A gap before the number (``Flour  200``) is not enough across paragraphs."""
    lines = [ln.strip() for ln in block.split("\n") if ln.strip()]
    return bool(lines) and all(
        not ln.startswith(("#", "|"))
        and (_LEADER_TO_PAGES.search(ln) is not None or _NUMBERED_ENTRY.match(ln) is not None)
        for ln in lines
    )


def _index_listing(block: str) -> str | None:
    """The lines of a fenced block that is a book index, or None.

    The fast PDF converter fences lines set in a monospace font, and R's manuals set their
    function index so: 14 KB of ``cbind . . . . . 26`` in R-intro was kept as code. Every
    line must end in leaders to its pages, or be a term wrapped onto the next, indented,
    line that does (``_R_CHECK_BUILD_VIGNETTES_`` then ``  ELAPSED_TIMEOUT_ . . . 65``).
    """
    rows = block.strip("\n").split("\n")
    if len(rows) < 3 or not _FENCE_CLOSE.fullmatch(rows[-1]):
        return None  # a fence left open runs to the document's end: code, not judged
    lines = [ln.rstrip() for ln in rows[1:-1] if ln.strip()]
    if not lines:
        return None
    for i, line in enumerate(lines):
        if _LEADER_TO_PAGES.search(line.strip()):
            continue
        after = lines[i + 1] if i + 1 < len(lines) else ""
        indent = len(line) - len(line.lstrip())
        wrapped = len(after) - len(after.lstrip()) > indent and _LEADER_TO_PAGES.search(
            after.strip()
        )
        if not wrapped:
            return None
    return "\n".join(lines)


def _toc_blocks(blocks: list[str], config: CleanConfig, fences: bool) -> set[int]:
    """Which of ``blocks`` are a contents page or a book index, by index.

    A block is judged alone, and so is each run of adjacent blocks that are all entries
    (``_entry_block``): a PDF's contents page sets each chapter's entry apart, one
    paragraph each, and a run of them is judged as the lines of one block. Page markers
    do not end a run (a contents page goes on over the page), headings and text do.

    Args:
        blocks: The document's blocks (``_blocks``), comments removed.
        config: The TOC settings.
        fences: Whether a fenced block may be a book index (``_index_listing``; PDFs).
    """
    drop: set[int] = set()
    run: list[int] = []
    texts: dict[int, str] = {}

    def judge() -> None:
        if len(run) > 1 and _is_toc("\n".join(texts[i] for i in run), config):
            drop.update(run)
        run.clear()

    for i, block in enumerate(blocks):
        stripped = block.strip()
        if _PAGE_MARKER.match(stripped):
            continue
        if opens_fence(stripped):
            listing = _index_listing(stripped) if fences else None
            if listing is None:
                judge()
                continue
            texts[i] = listing
        elif _entry_block(block):
            texts[i] = block
        else:
            judge()
            if _is_toc(block, config):
                drop.add(i)
            continue
        if _is_toc(texts[i], config):
            drop.add(i)
        run.append(i)
    judge()
    return drop


# Which rules a document's kind gets; a kind not listed gets MARKUP.
# "fenced_index": a PDF's book index set in a monospace font, which the fast converter fences
# as code; a Markdown author's code block is never judged.
PAGE_RULES = frozenset(
    {"toc", "fenced_index", "boilerplate", "page_furniture", "hyphenation", "comments"}
)
MARKUP = frozenset({"toc", "boilerplate", "comments"})
KIND_RULES: dict[str | None, frozenset[str]] = {
    None: PAGE_RULES,  # unknown: every rule
    "pdf": PAGE_RULES,
    "text": frozenset(),  # code, config, plain text: as written
    # A record's fields, written by ragpipe: never a contents page (an aligned listing in
    # a field, "Apples   12", read as one and was deleted).
    "record": frozenset({"boilerplate", "comments"}),
}
# The boilerplate lines that are page furniture only in a PDF (its running heads and
# stamps): elsewhere a line of one number, "3/4", a date, an address or "Accessed from
# the main menu, ..." is the text's own ("42", a changelog's "2024-01-05"). "Page 3 of
# 7" and copyright lines are boilerplate in any kind.
PAGE_FURNITURE = frozenset(
    {_LONE_NUMBER, _N_OF_M, _PDF_COPYRIGHT, *BOILERPLATE["timestamp"],
     *BOILERPLATE["ip_address"], *BOILERPLATE["download_notice"]}
)  # fmt: skip
_RUNS_OF_SPACE = re.compile(r"(?<=\S)[ \t]{2,}")  # inside a line: indentation is structure


def clean_markdown(markdown: str, config: CleanConfig, kind: str | None = None) -> CleanResult:
    """Apply the configured cleaning rules that ``kind`` takes (``KIND_RULES``).

    Args:
        markdown: Converted Markdown (page markers allowed).
        config: Which rules run.
        kind: The document's kind (``SourceFile.kind``); None applies every rule.

    Returns:
        The cleaned text and counts of what each rule removed or fixed.
    """
    dropped: Counter[str] = Counter()
    custom = [re.compile(p) for p in config.extra_patterns]
    rules = KIND_RULES.get(kind, MARKUP)
    if config.ligatures:

        def fix(match: re.Match[str]) -> str:
            char = match.group(0)
            dropped["ligature" if char in LIGATURES else "ocr_fix"] += 1
            return LIGATURES.get(char) or OCR_FIXES[char]

        markdown = _LIGATURE_RE.sub(fix, markdown)

    if not rules:  # a text file: invisible characters fixed, the rest as written
        kept = [
            ln
            for ln in markdown.split("\n")
            if not _line_drop_reason(ln.strip(), config, custom, rules)
        ]
        dropped["custom"] += markdown.count("\n") + 1 - len(kept)
        cleaned = "\n".join(kept).strip("\n")
        return CleanResult(cleaned + "\n" if cleaned.strip() else "",
                           {k: v for k, v in dropped.items() if v})  # fmt: skip

    blocks: list[str] = []
    for block in _blocks(markdown):
        stripped = block.strip()
        if (
            config.html_comments
            and "comments" in rules
            and not (opens_fence(stripped) or _PAGE_MARKER.match(stripped))
        ):
            block, n = strip_comments(block)  # within a block: never a section's text
            dropped["html_comment"] += n
            if not block.strip():
                continue
        blocks.append(block)
    toc: set[int] = set()
    if config.toc and "toc" in rules:
        toc = _toc_blocks(blocks, config, fences="fenced_index" in rules)
        dropped["toc"] += len(toc)
    out: list[str] = []
    for i, block in enumerate(blocks):
        stripped = block.strip()
        if i in toc:
            continue
        if opens_fence(stripped) or _PAGE_MARKER.match(stripped):
            out.append(block)
            continue
        kept_lines = []
        for line in block.split("\n"):
            reason = _line_drop_reason(line.strip(), config, custom, rules)
            if reason:
                dropped[reason] += 1
            else:
                kept_lines.append(line.rstrip())
        if not kept_lines:
            continue
        text = "\n".join(kept_lines)
        if config.hyphenation and "hyphenation" in rules:
            text, n = _HYPHEN_RE.subn("", text)
            dropped["hyphenation"] += n
        if config.compact_tables:
            text, n = compact_tables(text)
            dropped["table_padding"] += n
        text = _RUNS_OF_SPACE.sub(" ", text) if not text.lstrip().startswith("|") else text
        out.append(text)
    cleaned = "\n\n".join(out).strip()
    return CleanResult(cleaned + "\n" if cleaned else "", {k: v for k, v in dropped.items() if v})


def _line_drop_reason(
    line: str, config: CleanConfig, custom: list[re.Pattern[str]], rules: frozenset[str]
) -> str | None:
    if not line or (line.startswith("#") and rules):  # a heading; in a text file, a comment
        return None
    if config.boilerplate and "boilerplate" in rules and not line.startswith("|"):
        pdf = "page_furniture" in rules
        for reason, patterns in BOILERPLATE.items():  # a table row is data, never furniture
            if any(p.match(line) for p in patterns if pdf or p not in PAGE_FURNITURE):
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
        result = clean_markdown(doc.markdown, config.clean, doc.kind)
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
