"""``ragpipe golden draft``: golden items drafted from the index, for a person to review.

Two sources, both read from the live index:

* **Question headings** (the R-FAQ pattern): a section whose heading is a question
  ("2.7 What documentation exists for R?") becomes an item asking it (numbering dropped),
  targeting that section by heading, with the section's first sentences as the expected
  answer.
* **Questions written by the configured LLM** for a stratified sample of chunks (round robin
  over files, and within a file over its start, middle and end), each targeting its chunk
  by a verbatim span, with the expected answer drawn from the chunk's own sentences. A
  question is kept only when the model, asked again, judges that its chunk answers it; it
  does not copy a long run of the chunk's words; and it is no near-duplicate of one kept.

Every item is written with ``draft: true`` and its provenance (how it was made, from
which chunk of which version of the file, by which model). Evaluations refuse draft items
unless ``eval.allow_draft`` is set: a person reads each one, fixes or deletes it, and
removes its ``draft`` line.
"""

from __future__ import annotations

import functools
import logging
import random
import re
import sys
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ragpipe.checkpoint import atomic_create_bytes, signals_deferred
from ragpipe.errors import RagpipeError
from ragpipe.evaluation.answers import UNSPACED, normalize_answer
from ragpipe.evaluation.golden import file_matches
from ragpipe.models.llm import LLM
from ragpipe.store.base import VectorStore

logger = logging.getLogger(__name__)

# A question that repeats this many consecutive words of its chunk copies it: retrieval on
# it measures string matching, not whether a user's question finds its answer.
COPY_WORDS = 6
# Two questions whose word sets overlap this much (Jaccard) ask the same thing.
NEAR_DUPLICATE = 0.7
MIN_CHUNK_WORDS = 25
# What a question-heading item is worth: said in the draft's description, by `golden draft`
# and by a run that scores drafts (run.with_drafts). Measured: 0.987 NDCG@10 on R-FAQ.
HEADING_ITEMS_NOTE = (
    "question-heading items test lexical matching only: each asks its section's heading, "
    "the first line of the chunk it targets, so retrieval finds it by its words (expect "
    "scores near 1); only model-written or hand-written questions test what a user's "
    "question finds"
)
QUESTION_MAX_CHARS = 200
ANSWER_MAX_CHARS = 300
EXPECTED_SENTENCES = 2
_NUMBERING = re.compile(r"^\s*(?:\d+(?:\.\d+)*\.?|[A-Z]\.(?:\d+\.?)*)\s+")
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\"'])")
# A word of any script (Korean, Arabic, Russian: [a-z0-9]+ counted none, and no chunk of
# theirs was ever drafted), with its combining marks (a Devanagari or Thai vowel sign is
# no letter to ``\w``: a Hindi word fell into 2 or 3); a Chinese or Japanese character is
# a word of its own, counted as half of one (``word_count``).
_ASCII_WORD = re.compile(r"[a-z0-9]+")
_UNSPACED_CHAR = re.compile(f"[{UNSPACED}]")
_QUESTION_MARKS = ("?", "？", "؟")  # the full-width and the Arabic marks too
_MARKUP = re.compile(r"^#+\s.*$|[*_`>|]+", re.M)

QUESTION_PROMPT = """Here is a passage from a team's documentation.

<passage>
{text}
</passage>

Write one question a user of this documentation might ask that this passage answers.
Ask it in your own words, as a user would: do not copy phrases from the passage, and do
not mention "the passage". Then give the answer, in one or two sentences from the passage.
Reply as JSON: {{"question": "...", "answer": "..."}}"""

CHECK_PROMPT = """<passage>
{text}
</passage>

Question: {question}

Does the passage above answer this question? Reply as JSON: {{"answers": true}} or
{{"answers": false}}."""

QUESTION_SCHEMA = {
    "type": "object",
    "properties": {
        "question": {"type": "string", "maxLength": QUESTION_MAX_CHARS},
        "answer": {"type": "string", "maxLength": ANSWER_MAX_CHARS},
    },
    "required": ["question", "answer"],
}
CHECK_SCHEMA = {
    "type": "object",
    "properties": {"answers": {"type": "boolean"}},
    "required": ["answers"],
}


@dataclass(frozen=True)
class Passage:
    """A chunk of the index, as the drafts read it."""

    point_id: str
    file_path: str
    target: str  # the file as the golden set names it (a path suffix)
    heading_path: tuple[str, ...]
    chunk_index: int
    text: str
    source_sha: str


@dataclass
class Drafted:
    """The draft items and what happened on the way."""

    items: list[dict[str, Any]] = field(default_factory=list)
    asked: int = 0  # chunks the LLM was asked about
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> count

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1


@functools.cache
def _word() -> re.Pattern[str]:
    """Words of any script: built once, on the first text that is not ASCII (0.5 s)."""
    marks, start = [], None
    for code in range(sys.maxunicode + 2):
        mark = code <= sys.maxunicode and unicodedata.category(chr(code))[0] == "M"
        if mark and start is None:
            start = code
        elif not mark and start is not None:
            marks.append(f"{re.escape(chr(start))}-{re.escape(chr(code - 1))}")
            start = None
    return re.compile(rf"[{UNSPACED}]|(?:[^\W_{UNSPACED}]|[{''.join(marks)}])+")


def words(text: str) -> list[str]:
    text = text.lower()
    return (_ASCII_WORD if text.isascii() else _word()).findall(text)


def _split(text: str) -> tuple[int, int]:
    """How many words ``text`` has, and how many of them are Chinese or Japanese
    characters."""
    found = words(text)
    return len(found), sum(1 for w in found if _UNSPACED_CHAR.fullmatch(w))


def word_count(text: str) -> float:
    """Words, a Chinese or Japanese character counted as half of one (a word of those
    scripts is about two characters)."""
    found, unspaced = _split(text)
    return found - unspaced / 2


def is_question(text: str, least: int) -> bool:
    """Ends with a question mark (any script's) and has ``least`` words or more."""
    return text.rstrip().endswith(_QUESTION_MARKS) and word_count(text) >= least


def copied_run(question: str, passage: str) -> int:
    """The longest run of consecutive words of ``question`` that ``passage`` also has."""
    q, p = words(question), words(passage)
    if not q or not p:
        return 0
    best = 0
    previous = [0] * (len(p) + 1)
    for qw in q:
        current = [0] * (len(p) + 1)
        for j, pw in enumerate(p, start=1):
            if qw == pw:
                current[j] = previous[j - 1] + 1
                best = max(best, current[j])
        previous = current
    return best


def _piece_words(text: str) -> int:
    """Pieces a word takes in ``text``: 2 when it is mostly Chinese or Japanese characters
    (a copied run is counted in them), else 1."""
    found, unspaced = _split(text)
    return 2 if 2 * unspaced > found else 1


def overlap(a: str, b: str) -> float:
    """Jaccard overlap of two texts' word sets."""
    sa, sb = set(words(a)), set(words(b))
    return len(sa & sb) / len(sa | sb) if sa and sb else 0.0


def body(text: str) -> str:
    """A chunk's prose: heading lines and Markdown markup dropped, whitespace joined."""
    return " ".join(_MARKUP.sub(" ", text).split())


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(body(text)) if s.strip()]


def unique_suffixes(paths: Sequence[str]) -> dict[str, str]:
    """Each path's shortest end (whole components) that matches no other path: what a golden
    set names it by (targets match by path suffix, so ``README.md`` alone would also credit
    every other README.md). URLs keep their slashes."""
    parts = {p: p.replace("\\", "/").split("/") for p in paths}
    out: dict[str, str] = {}
    for path, components in parts.items():
        for n in range(1, len(components) + 1):
            suffix = "/".join(components[-n:])
            if suffix and not any(file_matches(o, suffix) for o in paths if o != path):
                out[path] = suffix
                break
        else:
            out[path] = path
    return out


def passages(store: VectorStore) -> list[Passage]:
    """Every chunk of the index, by file and position."""
    hits = list(store.scroll())
    names = unique_suffixes(sorted({str(h.payload.get("file_path", "")) for h in hits}))
    out = []
    for hit in hits:
        p = hit.payload
        path = str(p.get("file_path", ""))
        headings = p.get("heading_path") or []
        out.append(
            Passage(
                point_id=hit.point_id,
                file_path=path,
                target=names[path],
                heading_path=tuple(str(h) for h in headings),
                chunk_index=int(p.get("chunk_index") or 0),
                text=str(p.get("text", "")),
                source_sha=str(p.get("source_sha", "")),
            )
        )
    return sorted(out, key=lambda c: (c.file_path, c.chunk_index))


def _provenance(method: str, chunk: Passage, **extra: Any) -> dict[str, Any]:
    return {
        "method": method,
        "file": chunk.file_path,
        "point_id": chunk.point_id,
        "source_sha": chunk.source_sha,
        **extra,
    }


def heading_items(chunks: Sequence[Passage], drafted: Drafted) -> None:
    """An item per question heading: its section in every file that has it (one item, so
    that no file's section counts against another's)."""
    items: dict[str, dict[str, Any]] = {}
    for chunk in chunks:
        if not chunk.heading_path:
            continue
        heading = chunk.heading_path[-1].strip()
        query = _NUMBERING.sub("", heading).strip()
        if not is_question(heading, 0) or word_count(query) < 3:
            continue
        item = items.get(query)
        if item is None:
            item = items[query] = {
                "id": f"heading-{len(drafted.items) + len(items) + 1}",
                "query": query,
                "relevance": {},
                "chunks": [],
                "draft": True,
            }
            answer = " ".join(sentences(chunk.text)[:EXPECTED_SENTENCES])
            if normalize_answer(answer):  # words to score against (the golden loader's rule)
                item["expected_answer"] = answer
            item["provenance"] = _provenance("heading", chunk)
        target = {"file": chunk.target, "heading": heading, "grade": 3}
        if target not in item["chunks"]:
            item["relevance"][chunk.target] = 3
            item["chunks"].append(target)
    drafted.items.extend(items.values())


def stratified(chunks: Sequence[Passage], n: int, seed: int) -> list[Passage]:
    """Up to ``n`` chunks with prose enough to ask about: round robin over the files (in a
    seeded order), each file's turn taking its start, middle or end third in rotation (file
    k of the order starting at third k, so a sample smaller than the number of files still
    spans all three)."""
    rng = random.Random(seed)
    by_file: dict[str, list[list[Passage]]] = {}
    for chunk in chunks:
        if word_count(body(chunk.text)) >= MIN_CHUNK_WORDS:
            by_file.setdefault(chunk.file_path, []).append([chunk])
    strata: dict[str, list[list[Passage]]] = {}
    for file, singles in by_file.items():
        flat = [c[0] for c in singles]
        third = max(1, len(flat) // 3)
        parts = [flat[:third], flat[third : 2 * third], flat[2 * third :]]
        for part in parts:
            rng.shuffle(part)
        strata[file] = [p for p in parts if p]
    files = sorted(strata)
    rng.shuffle(files)
    picked: list[Passage] = []
    turn = 0
    while len(picked) < n and any(any(p) for p in strata.values()):
        for offset, file in enumerate(files):
            parts = [p for p in strata[file] if p]
            if not parts or len(picked) >= n:
                continue
            # Each file starts the rotation at a different third: with more files than
            # questions, the sample still spans starts, middles and ends.
            picked.append(parts[(turn + offset) % len(parts)].pop())
        turn += 1
    return picked


def _reply(llm: LLM, prompt: str, schema: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    import json

    reply = llm.chat([{"role": "user", "content": prompt}], schema=schema,
                     max_tokens=max_tokens, temperature=0.0, seed=0)  # fmt: skip
    value = json.loads(reply.text)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def expected_from(chunk: Passage, answer: str) -> str:
    """The chunk's own sentence (and the next, up to two) closest to the model's answer."""
    found = sentences(chunk.text)
    if not found:
        return ""
    best = max(range(len(found)), key=lambda i: overlap(found[i], answer))
    return " ".join(found[best : best + EXPECTED_SENTENCES])[:1000]


def llm_items(
    chunks: Sequence[Passage],
    llm: LLM,
    n: int,
    seed: int,
    drafted: Drafted,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Questions written by ``llm`` for ``n`` stratified chunks, filtered (see above)."""
    kept = [str(i["query"]) for i in drafted.items]
    sample = stratified(chunks, n, seed)
    for done, chunk in enumerate(sample, start=1):
        if progress is not None:
            progress(done, len(sample))
        drafted.asked += 1
        text = chunk.text[:4000]
        try:
            wrote = _reply(llm, QUESTION_PROMPT.format(text=text), QUESTION_SCHEMA, 160)
            question = " ".join(str(wrote.get("question", "")).split())
            answer = str(wrote.get("answer", ""))
        except (ValueError, KeyError) as exc:
            logger.info("no question for %s: %s", chunk.point_id, exc)
            drafted.drop("the model wrote no question")
            continue
        except RagpipeError as exc:  # the model server failed on this one: the rest go on
            logger.warning("no question for %s: %s", chunk.point_id, exc)
            drafted.drop(f"the model failed ({type(exc).__name__})")
            continue
        if not is_question(question, 4):
            drafted.drop("not a question")
            continue
        if copied_run(question, chunk.text) >= COPY_WORDS * _piece_words(question):
            drafted.drop(f"copies {COPY_WORDS}+ words of its chunk")
            continue
        if any(overlap(question, other) >= NEAR_DUPLICATE for other in kept):
            drafted.drop("near-duplicate of a kept question")
            continue
        try:
            check = _reply(llm, CHECK_PROMPT.format(text=text, question=question), CHECK_SCHEMA, 16)
        except (ValueError, KeyError):
            drafted.drop("the model's check was unreadable")
            continue
        except RagpipeError as exc:
            logger.warning("no check for %s: %s", chunk.point_id, exc)
            drafted.drop(f"the model failed ({type(exc).__name__})")
            continue
        if check.get("answers") is not True:
            drafted.drop("its chunk does not answer it (model's check)")
            continue
        span = _span(chunk, [c for c in chunks if c.file_path == chunk.file_path])
        if span is None:
            drafted.drop("no span of its chunk that no other chunk of its file has")
            continue
        item: dict[str, Any] = {
            "id": f"llm-{len(drafted.items) + 1}",
            "query": question,
            "relevance": {chunk.target: 3},
            "chunks": [{"file": chunk.target, "contains": span, "grade": 3}],
            "draft": True,
        }
        expected = expected_from(chunk, answer)
        if expected and normalize_answer(expected):
            item["expected_answer"] = expected
        item["provenance"] = _provenance("llm", chunk, model=llm.name)
        drafted.items.append(item)
        kept.append(question)


SPAN_CHARS = 80


def _span(chunk: Passage, file_chunks: Sequence[Passage]) -> str | None:
    """A verbatim run of the chunk's text, at most 80 characters cut at word boundaries,
    that no other chunk of its file holds (chunk targets match by containment): from its
    longest lines first, at their start and then further in. None when there is none.

    The longest line's start was taken as it stood: a paragraph cut between two chunks
    starts the next one inside the overlap, and a table's parts all repeat its header
    row, so a drafted grade-3 target credited the chunk before, or every part of the
    table, as a perfect hit."""
    others = [" ".join(c.text.split()) for c in file_chunks if c.point_id != chunk.point_id]
    lines = [" ".join(line.split()) for line in chunk.text.splitlines()]
    for line in sorted((ln for ln in lines if ln and not ln.startswith("#")), key=len,
                       reverse=True):  # fmt: skip
        tokens = line.split(" ")
        for start in range(len(tokens)):  # every word: an overlap of 150 characters is 20+
            span = _cut_span(" ".join(tokens[start:]))
            if len(span) < 20 and span != line:  # too short to say which chunk: go on
                continue
            if not any(span in other for other in others):
                return span
    return None


def _cut_span(text: str) -> str:
    if len(text) <= SPAN_CHARS:
        return text
    return text[:SPAN_CHARS].rsplit(" ", 1)[0]


def draft_golden(
    store: VectorStore,
    llm: LLM | None,
    sample: int,
    seed: int,
    name: str,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[dict[str, Any], Drafted]:
    """The draft golden set (as written to YAML) and what was dropped."""
    chunks = passages(store)
    drafted = Drafted()
    heading_items(chunks, drafted)
    headings = len(drafted.items)
    if llm is not None and sample > 0:
        llm_items(chunks, llm, sample, seed, drafted, progress)
    now = datetime.now(UTC).isoformat(timespec="seconds")
    model = f", questions written by {llm.name}" if llm is not None and sample > 0 else ""
    description = (
        f"DRAFT of {now}: {headings} question headings{model}; "
        f"{len(drafted.items) - headings} of {drafted.asked} model questions kept. Review "
        "every item (fix or delete it, then remove its 'draft: true') before evaluating."
    )
    if headings:
        description += f" The {HEADING_ITEMS_NOTE}."
    return {"name": name, "description": description, "items": drafted.items}, drafted


def write_draft(golden: dict[str, Any], out: Path, written: list[Path] | None = None) -> Path:
    """Write the draft set as YAML to ``out``, never over a file: one made meanwhile keeps
    it, and the draft goes beside it (``NAME-<pid>.yaml``). Returns where it went, also
    added to ``written`` with the file (a signal cannot come between them: an interrupted
    command says what it wrote from there).

    The file appears whole or not at all: a cut-off draft would load with its last items
    no longer marked ``draft: true``, and an empty one would block the next draft's name.

    Raises:
        FileExistsError: ``out`` and its fallback both exist.
        DiskFull: No space left to write it.
    """
    import os

    import yaml

    text = yaml.safe_dump(golden, sort_keys=False, allow_unicode=True, width=100)
    for target in (out, out.with_name(f"{out.stem}-{os.getpid()}{out.suffix}")):
        try:
            with signals_deferred():
                atomic_create_bytes(target, text.encode("utf-8"))
                if written is not None:
                    written.append(target)
            return target
        except FileExistsError:
            continue
    raise FileExistsError(f"{out} and its fallback exist")
