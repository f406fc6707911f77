"""Structure recovery for the fast PDF mode.

Docling's ``NativePdfPipeline`` yields one text cell per printed line, with
its box and font but no headings or paragraphs. This module rebuilds them
from geometry and typography alone:

* running headers/footers and page numbers: lines in the top/bottom margin
  band that repeat across pages (digits ignored) or are bare numbers, and
  a head that is printed too few times to repeat (a short chapter's) where
  the others are, carrying its page's number;
* headings: lines set in a non-body font that is larger than the body text
  or bold, short, not part of a table row; levels from the size ranking and
  from section numbering (``2.1.3``);
* paragraphs: lines re-joined unless a vertical gap, a first-line indent, a
  bullet or a short line ending a sentence says a new block starts;
  words hyphenated across lines are re-joined;
* code: lines in a monospace font become fenced blocks, kept verbatim.

Pure functions over :class:`Line` records, so they are tested without PDFs.
"""

from __future__ import annotations

import itertools
import re
import statistics
import textwrap
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ragpipe.schemas import PAGE_MARKER


@dataclass(frozen=True)
class Line:
    """One printed line of a PDF page (top-left origin, points)."""

    page: int
    x0: float
    x1: float
    top: float
    bottom: float
    font: str
    text: str
    page_width: float
    page_height: float
    cells: int = 1  # text cells merged into this line (>1: a table row)

    @property
    def height(self) -> float:
        return self.bottom - self.top

    @property
    def font_size(self) -> float:
        """Box height, capped by what the line's width allows.

        A parser cell that spans two printed lines is twice as tall as its
        font; average glyph width (about half the font size) exposes it.
        """
        width_bound = 2.2 * (self.x1 - self.x0) / max(1, len(self.text.strip()))
        return min(self.height, width_bound)


_BOLD_RE = re.compile(r"bold|black|heavy|semibold|demi|cmbx|cmb\d|-bd|\bbd\b", re.IGNORECASE)
_MONO_RE = re.compile(r"mono|courier|consol|cmtt|menlo|inconsolata|typewriter", re.IGNORECASE)
_PAGE_NUMBER_RE = re.compile(
    r"^(?:page\s+)?(?:\d{1,4}|[ivxlcdm]{1,7})(?:\s*(?:of|/)\s*\d{1,4})?$", re.IGNORECASE
)
_NUMBERING_RE = re.compile(
    r"^(?:(?:chapter|section|appendix)\s+)?(\d+(?:\.\d+)*|[A-Z](?:\.\d+)*)\.?\s+\S"
)
# A dash or an asterisk is a bullet with a space after it: "-40 degrees" is a number and
# "--vanilla" an option, which a wrapped line may start with.
_BULLET_RE = re.compile(
    r"^(?:[•●◦▪▫■□‣⁃∙·∞\uf0b7\uf0a7]\s*|[\-–—*]\s+|\(?\d{1,3}[.)]\s+|\(?[a-z][.)]\s+)"
)
_ORDERED_RE = re.compile(r"\d{1,3}[.)]")
_SENTENCE_END_RE = re.compile(r"[.!?:;)\"'”’]$")
_DOT_LEADER_RE = re.compile(r"(?:\.\s*){4,}\S*$")
_MARGIN_BAND = 0.09


def _list_item(text: str) -> str:
    """A list item in Markdown: a symbol bullet becomes "- ", a number keeps its place.

    "1." and "2)" are Markdown's own ordered markers; "(a)", "b)" and "(3)" are kept as
    written after a "- ", so a step's number or letter, which the text may refer to, stays.
    """
    match = _BULLET_RE.match(text)
    if match is None:
        return f"- {text}"
    marker, rest = match.group().strip(), text[match.end() :]
    if _ORDERED_RE.fullmatch(marker):
        return f"{marker} {rest}"
    if marker[0].isalnum() or marker[0] == "(":
        return f"- {marker} {rest}"
    return f"- {rest}"


def is_bold(font: str) -> bool:
    """Whether a PDF font name denotes a bold face."""
    return bool(_BOLD_RE.search(_base_font(font)))


def is_monospace(font: str) -> bool:
    """Whether a PDF font name denotes a monospace face."""
    return bool(_MONO_RE.search(_base_font(font)))


def _base_font(font: str) -> str:
    # "/ABCDEF+TimesNewRomanPS-BoldMT" -> "TimesNewRomanPS-BoldMT"
    return font.lstrip("/").split("+", 1)[-1]


def _norm_repeat(text: str) -> str:
    return re.sub(r"\d+", "#", text.strip().lower())


# The page number a running head or footer prints at its start or end ("Chapter 14: OS
# facilities  87", "12  Introduction"), or that is the whole line.
_FOLIO_RE = re.compile(r"^(\d{1,4})(?:\s+\S.*)?$|^.*\S\s+(\d{1,4})$")


def _folio(text: str) -> int | None:
    match = _FOLIO_RE.match(text.strip())
    return None if match is None else int(match.group(1) or match.group(2))


def merge_row_cells(lines: Sequence[Line]) -> list[Line]:
    """Merge cells printed on the same baseline of a page (table rows, split lines).

    Cells whose vertical extents overlap by more than half the smaller height
    and that follow each other in the parser's order become one line, joined
    left to right with two spaces.
    """
    merged: list[Line] = []
    for line in lines:
        if merged:
            prev = merged[-1]
            overlap = min(prev.bottom, line.bottom) - max(prev.top, line.top)
            if (
                prev.page == line.page
                and overlap > 0.5 * min(prev.height, line.height)
                and line.x0 > prev.x1 - 1.0
            ):
                merged[-1] = Line(
                    page=prev.page,
                    x0=prev.x0,
                    x1=max(prev.x1, line.x1),
                    top=min(prev.top, line.top),
                    bottom=max(prev.bottom, line.bottom),
                    font=prev.font,
                    text=f"{prev.text}  {line.text}" if line.x0 - prev.x1 > 8 else
                    f"{prev.text} {line.text}" if line.x0 - prev.x1 > 1 else
                    prev.text + line.text,
                    page_width=prev.page_width,
                    page_height=prev.page_height,
                    cells=prev.cells + line.cells,
                )  # fmt: skip
                continue
        merged.append(line)
    return merged


def drop_running_lines(lines: Sequence[Line]) -> tuple[list[Line], int]:
    """Remove running headers/footers and page numbers.

    Returns:
        The kept lines and how many were dropped.
    """
    pages = {line.page for line in lines}

    def in_margin(line: Line) -> bool:
        band = _MARGIN_BAND * line.page_height
        return line.top < band or line.bottom > line.page_height - band

    repeats: Counter[str] = Counter()
    for page in pages:
        seen = {_norm_repeat(ln.text) for ln in lines if ln.page == page and in_margin(ln)}
        repeats.update(seen)
    min_repeat = 2 if len(pages) <= 4 else 3

    def running(line: Line) -> bool:
        text = line.text.strip()
        return bool(_PAGE_NUMBER_RE.match(text)) or (
            len(pages) > 1 and repeats[_norm_repeat(text)] >= min_repeat
        )

    # Where the running lines stand (font, top) and how their page numbers relate to the
    # pages they are on. A short chapter's head ("Chapter 14: OS facilities  87" on one or
    # two pages) repeats too few times, but stands where the other heads stand, in their
    # font, and prints its own page's number as they do: 45 such heads were left in the
    # text of the six R manuals ("Chapter 14: OS facilities  87", "Concept index  37").
    # Matching all three leaves real text in the margin alone, repeated or not.
    slots: Counter[tuple[str, int, int]] = Counter()
    for line in lines:
        if in_margin(line) and running(line) and (folio := _folio(line.text)) is not None:
            slots[line.font, round(line.top), line.page - folio] += 1

    def short_run_head(line: Line) -> bool:
        folio = _folio(line.text)
        return folio is not None and any(
            slots[line.font, round(line.top) + shift, line.page - folio] >= min_repeat
            for shift in (-1, 0, 1)
        )

    kept: list[Line] = []
    dropped = 0
    for line in lines:
        if in_margin(line) and (running(line) or short_run_head(line)):
            dropped += 1
            continue
        kept.append(line)
    return kept, dropped


@dataclass(frozen=True)
class _Typography:
    body_font: str
    body_height: float
    pitch: float  # typical distance between consecutive body baselines
    left: float  # typical left edge of body text
    right: float  # typical right edge of body text


def _typography(lines: Sequence[Line]) -> _Typography:
    weights: Counter[str] = Counter()
    heights: Counter[float] = Counter()
    for line in lines:
        weights[line.font] += len(line.text)
        heights[round(line.height * 2) / 2] += len(line.text)
    body_font = weights.most_common(1)[0][0] if weights else ""
    body = [ln for ln in lines if ln.font == body_font] or list(lines)
    body_height = statistics.median(ln.height for ln in body) if body else 10.0
    gaps = [
        b.top - a.top
        for a, b in itertools.pairwise(body)
        if a.page == b.page and 0 < b.top - a.top < 3 * body_height
    ]
    pitch = statistics.median(gaps) if gaps else body_height * 1.3
    lefts = Counter(round(ln.x0) for ln in body)
    left = float(lefts.most_common(1)[0][0]) if lefts else 0.0
    right = statistics.quantiles([ln.x1 for ln in body], n=10)[8] if len(body) >= 10 else (
        max((ln.x1 for ln in body), default=0.0))  # fmt: skip
    return _Typography(body_font, body_height, pitch, left, right)


def _is_heading(
    line: Line,
    prev: Line | None,
    nxt: Line | None,
    typo: _Typography,
    size_ratio: float,
    max_chars: int,
) -> bool:
    text = line.text.strip()
    if line.cells > 1 or not text or len(text) > max_chars or line.font == typo.body_font:
        return False
    if not re.search(r"[^\W\d_]", text) or (
        _BULLET_RE.match(text) and not _NUMBERING_RE.match(text)
    ):
        return False
    if is_monospace(line.font) or _DOT_LEADER_RE.search(text):
        return False
    if line.font_size >= typo.body_height * size_ratio:
        return True
    if text.endswith((",", ";")):
        return False
    set_apart = prev is None or prev.page != line.page or line.top - prev.top > 1.45 * typo.pitch
    words = text.split()
    if not set_apart or text.endswith("."):
        return False
    if is_bold(line.font):
        return len(words) <= 12
    # Another face at body size (italic run-in headings): also must lead body text.
    leads_body = (
        nxt is not None
        and nxt.font == typo.body_font
        and nxt.page == line.page
        and nxt.top - line.top <= 1.45 * typo.pitch
    )
    return leads_body and len(words) <= 8 and text[0].isupper() and not text.endswith(":")


def _heading_levels(heads: Sequence[Line]) -> dict[float, int]:
    sizes = sorted({round(h.font_size) for h in heads}, reverse=True)
    return {size: min(i + 1, 6) for i, size in enumerate(sizes)}


# A word broken at a hyphen of its own, which the join keeps: TeX breaks a word that holds a
# hyphen only there ("cut-and-" "paste", "R-windows@R-" "project.org"), an option's
# ("--no-" "restore"), or after an acronym or a single letter ("DBMS-" "specific", "R-"
# "help"). Dropping it wrote "--norestore" and "R-windows@Rproject.org".
_OWN_HYPHEN = re.compile(r"(?:^|\s)(?:\S*[-@]\S*|-\S*|[A-Z]{2,}|[^\W\d_])-$")


def _join(prev: str, nxt: str) -> str:
    if re.search(r"[^\W\d_]-$", prev) and re.match(r"[a-z]", nxt):
        if _OWN_HYPHEN.search(prev):
            return prev + nxt  # cut-and-\npaste -> cut-and-paste
        return prev[:-1] + nxt  # infor-\nmation -> information
    return f"{prev} {nxt}"


def lines_to_markdown(
    lines: Sequence[Line], *, size_ratio: float = 1.15, max_heading_chars: int = 160
) -> tuple[str, dict[str, int]]:
    """Rebuild Markdown with headings, paragraphs, lists and code from PDF lines.

    Args:
        lines: Lines in the parser's reading order, all pages.
        size_ratio: Minimum height ratio to the body font for a heading by size.
        max_heading_chars: Longer lines are never headings.

    Returns:
        Markdown with a page marker line before each page's content, and
        counts of what was recovered (``headings``, ``paragraphs``,
        ``running_lines_dropped``...).
    """
    rows = merge_row_cells(lines)
    kept, dropped = drop_running_lines(rows)
    stats: Counter[str] = Counter(running_lines_dropped=dropped)
    if not kept:
        return "", dict(stats)
    typo = _typography(kept)
    head_flags = [
        _is_heading(
            ln,
            kept[i - 1] if i else None,
            kept[i + 1] if i + 1 < len(kept) else None,
            typo,
            size_ratio,
            max_heading_chars,
        )
        for i, ln in enumerate(kept)
    ]
    levels = _heading_levels([ln for ln, h in zip(kept, head_flags, strict=True) if h])

    blocks: list[str] = []
    current: list[str] = []  # lines of the paragraph being built
    kind = ""  # "para" | "code" | "heading" | "list"
    prev: Line | None = None
    page = None

    def flush() -> None:
        nonlocal current, kind
        if not current:
            return
        if kind == "code":
            code = textwrap.dedent("\n".join(current))
            # Longer than any run of backticks that starts a line of the code (an R Markdown
            # chunk's "```{r}"), as Docling writes a fence: such a line would close it.
            runs = re.findall(r"^\s*(`{3,})", code, re.MULTILINE)
            fence = "`" * max([3, *(len(r) + 1 for r in runs)])
            blocks.append(f"{fence}\n{code}\n{fence}")
            stats["code_blocks"] += 1
        elif kind == "heading":
            blocks.append(current[0])
        else:
            text = current[0]
            for nxt in current[1:]:
                text = _join(text, nxt)
            blocks.append(_list_item(text) if kind == "list" else text)
            stats["paragraphs"] += 1
        current, kind = [], ""

    for line, heading in zip(kept, head_flags, strict=True):
        text = line.text.strip()
        if line.page != page:
            flush()
            page = line.page
            blocks.append(PAGE_MARKER.format(page=page))
            prev = None
        if heading:
            level = levels[round(line.font_size)]
            numbered = _NUMBERING_RE.match(text)
            if numbered and numbered.group(1)[0].isdigit():
                level = max(level, min(numbered.group(1).count(".") + 1, 6))
            if kind == "heading" and prev is not None and line.top - prev.bottom < typo.pitch:
                # A heading wrapped over two lines.
                current[0] = f"{current[0]} {text}"
            else:
                flush()
                kind = "heading"
                current = [f"{'#' * level} {text}"]
                stats["headings"] += 1
            prev = line
            continue
        code_start = (
            prev is None
            or line.top - prev.top > 1.45 * typo.pitch
            or (line.x0 > typo.left + typo.body_height)
        )
        if (
            is_monospace(line.font)
            and line.font != typo.body_font
            and (kind == "code" or code_start)
        ):
            if kind != "code":
                flush()
                kind = "code"
            indent = " " * max(0, round((line.x0 - typo.left) / max(typo.body_height * 0.5, 1)))
            current.append(indent + text)
            prev = line
            continue
        new_block = (
            kind in ("", "heading", "code")
            or prev is None
            or line.top - prev.top > 1.45 * typo.pitch
            or line.top < prev.top  # jumped back up: a new column
            or bool(_BULLET_RE.match(text))
            or (line.x0 > typo.left + 0.8 * typo.body_height and kind != "list"
                and prev.x0 <= typo.left + 2)
            or (_SENTENCE_END_RE.search(prev.text.strip()) is not None
                and prev.x1 < typo.right - 0.12 * (typo.right - typo.left))
        )  # fmt: skip
        if kind == "list" and not _BULLET_RE.match(text) and prev is not None:
            # Continuation lines of a list item are indented under its text.
            new_block = line.top - prev.top > 1.45 * typo.pitch or (line.x0 < prev.x0 - 2 and (
                line.x0 <= typo.left + 2))  # fmt: skip
        if new_block:
            flush()
            kind = "list" if _BULLET_RE.match(text) and not heading else "para"
        current.append(text)
        prev = line
    flush()
    return "\n\n".join(blocks) + "\n", dict(stats)
