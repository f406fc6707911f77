"""Golden question sets: YAML in ``eval/``, validated on load; BEIR import.

Format::

    name: r-faq-dev
    description: what the set is for
    items:
      - id: faq-2.7
        query: What documentation exists for R?
        relevance: {R-FAQ.pdf: 3}          # file suffix -> grade 0..3
        # expected_files: [R-FAQ.pdf]      # binary shorthand (grade 1 each)
        chunks:                            # optional chunk-level targets
          - {file: R-FAQ.pdf, heading: "2.7 What documentation exists for R?", grade: 3}
          - {file: R-FAQ.pdf, contains: "help.start()"}
        expected_answer: Online documentation ...   # optional (RAG metrics)
      - id: capital
        query: What is the capital of France?
        answerable: false                  # the corpus does not answer it: no targets;
                                           # a RAG run scores whether the model refuses

File matching is by path suffix on component boundaries: ``math/trig.md``
matches ``docs/math/trig.md`` but not ``docs/xmath/trig.md``.
"""

from __future__ import annotations

import csv
import difflib
import hashlib
import json
import logging
import math
import os
import random
from collections.abc import Collection, Iterator, Sequence
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ragpipe import yamlio
from ragpipe.checkpoint import atomic_write_bytes
from ragpipe.errors import ConfigError
from ragpipe.evaluation.answers import normalize_answer

logger = logging.getLogger(__name__)

MAX_GRADE = 3
ITEM_KEYS = {
    "id",
    "query",
    "relevance",
    "expected_files",
    "chunks",
    "expected_answer",
    "answerable",
    "draft",
    "provenance",
}
FILE_KEYS = {"name", "description", "items"}
FREE_KEY_PREFIX = "x-"  # top-level keys for YAML anchors, never read
FREE_KEY_NOTE = "keys starting with 'x-' are free, to hold YAML anchors"
CHUNK_KEYS = {"file", "contains", "heading", "grade"}
PROVENANCE_KEYS = {"method", "file", "point_id", "source_sha", "model"}
PROVENANCE_METHODS = ("heading", "llm")  # what `ragpipe golden draft` writes


@dataclass(frozen=True)
class ChunkTarget:
    """A chunk that answers the query: in ``file``, containing text or under a heading."""

    file: str
    contains: str | None = None
    heading: str | None = None
    grade: int = 1

    @property
    def key(self) -> str:
        what = f"heading={self.heading}" if self.heading else f"contains={self.contains}"
        return f"{self.file}#{what}"

    def matches(self, payload: dict[str, Any]) -> bool:
        if not file_matches(str(payload.get("file_path", "")), self.file):
            return False
        if self.heading is not None and self.heading not in (payload.get("heading_path") or []):
            return False
        text = str(payload.get("text", ""))
        return self.contains is None or " ".join(self.contains.split()) in " ".join(text.split())


@dataclass(frozen=True)
class GoldenItem:
    """One question with its graded relevance."""

    id: str
    query: str
    relevance: dict[str, int]  # file suffix -> grade
    chunks: tuple[ChunkTarget, ...] = ()
    expected_answer: str | None = None
    answerable: bool = True
    draft: bool = False  # drafted by `ragpipe golden draft`, not yet reviewed
    # How `golden draft` made it (provenance.method: heading, llm); None when not drafted.
    # Not scored, so not in item_digest: it only says what a run's drafts are worth.
    drafted_by: str | None = None


def item_digest(item: GoldenItem) -> str:
    """What an item asks and what scores it, hashed: its query, targets, grades, expected
    answer and answerability (not its id, nor whether it is a reviewed draft). An edited
    item is another question: its scores are no point on the same trend line."""
    asked = {
        "query": item.query,
        "relevance": sorted(item.relevance.items()),
        "chunks": [astuple(c) for c in item.chunks],
        "expected_answer": item.expected_answer,
        "answerable": item.answerable,
    }
    return hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()[:12]


@dataclass
class GoldenSet:
    name: str
    items: list[GoldenItem]
    description: str = ""
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    # What an import left out or changed, one line each (import_beir); not saved.
    notes: list[str] = field(default_factory=list)

    @property
    def answerable(self) -> list[GoldenItem]:
        """The items whose answer is in the corpus (the ones retrieval metrics score)."""
        return [i for i in self.items if i.answerable]

    @property
    def drafts(self) -> list[GoldenItem]:
        """Items still marked ``draft: true`` (drafted, not reviewed)."""
        return [i for i in self.items if i.draft]

    def duplicate_queries(self) -> list[str]:
        """One line per question asked by more than one item (case and runs of whitespace
        aside), naming the items: a question scored twice weighs twice in every mean, which
        no one meant when the second copy was a paste."""
        asked: dict[str, list[GoldenItem]] = {}
        for item in self.items:
            asked.setdefault(" ".join(item.query.split()).casefold(), []).append(item)
        lines = []
        for same in asked.values():
            if len(same) > 1:
                ids = [i.id for i in same]
                named = ", ".join(ids[:-1]) + f" and {ids[-1]}"
                lines.append(
                    f"items {named} ask the same question ({same[0].query!r}): it weighs "
                    f"{len(same)} times in every mean; merge them, or reword one"
                )
        return lines

    def refuse_drafts(self, allowed: bool) -> None:
        """ConfigError when items are unreviewed drafts, unless ``allowed``
        (``eval.allow_draft``; logged then)."""
        drafts = self.drafts
        if not drafts:
            return
        if allowed:
            logger.warning("golden set %s: %d of %d items are unreviewed drafts (draft: true), "
                           "evaluated as eval.allow_draft asks", self.name, len(drafts),
                           len(self.items))  # fmt: skip
            return
        ids = ", ".join(i.id for i in drafts[:5]) + (" ..." if len(drafts) > 5 else "")
        raise ConfigError(
            f"golden set {self.source or self.name}: {len(drafts)} of {len(self.items)} items are "
            f"drafts not yet reviewed ({ids}): read each, fix or delete it and remove its "
            "'draft: true' line; or evaluate them as drafts with --allow-draft "
            "(eval.allow_draft)"
        )


def file_matches(path: str, suffix: str) -> bool:
    """Whether ``path`` ends with ``suffix`` on a path-component boundary."""
    path = path.replace("\\", "/")
    suffix = suffix.replace("\\", "/").lstrip("/")
    return path == suffix or path.endswith("/" + suffix)


def _grade(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GRADE:
        raise ConfigError(f"{where}: grade {value!r} must be an integer 0..{MAX_GRADE}")
    return value


def _same(a: ChunkTarget, b: ChunkTarget) -> bool:
    """Two targets that match the same chunks (``contains`` reads runs of whitespace as
    one space, as ``matches`` does), their file named by one suffix or another
    (``science/a.md``, ``a.md``): two relevant items for one section, each credited."""

    def spaced(text: str | None) -> str | None:
        return " ".join(text.split()) if text is not None else None

    return _one_file(a.file, b.file) and (a.heading, spaced(a.contains)) == (
        b.heading, spaced(b.contains)
    )  # fmt: skip


def _one_file(a: str, b: str) -> bool:
    """Whether two file suffixes name one file as far as their text tells: equal, or one
    ends the other at a path separator (``sample/a.pdf``, ``a.pdf``)."""
    return file_matches(a, b) or file_matches(b, a)


def _refuse_unknown(
    raw: dict[Any, Any], allowed: Collection[str], where: str, note: str = ""
) -> None:
    """ConfigError naming the keys of ``raw`` not in ``allowed``, each with the allowed key
    it looks like: a misspelt key was read as absent (``garde: 3`` scored grade 1).
    ``note`` ends the message."""
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if not unknown:
        return
    near = [
        f"{key!r} looks like {close[0]!r}"
        for key in unknown
        if (close := difflib.get_close_matches(key.lower(), sorted(allowed), n=1, cutoff=0.6))
    ]
    raise ConfigError(
        f"{where}: unknown keys {unknown} ({'; '.join([*near, ''])}allowed: "
        f"{', '.join(sorted(allowed))}{'; ' + note if note else ''})"
    )


def _check_provenance(raw: Any, where: str) -> str:
    """An item's ``provenance`` (written by ``golden draft``), checked; its method, the one
    field evaluations read."""
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{where}: 'provenance' must be a mapping ({', '.join(sorted(PROVENANCE_KEYS))}), "
            f"got {raw!r}"
        )
    _refuse_unknown(raw, PROVENANCE_KEYS, f"{where}, provenance")
    method = raw.get("method")
    if method not in PROVENANCE_METHODS:
        raise ConfigError(
            f"{where}: provenance 'method' is {method!r}; it must be one of "
            f"{', '.join(PROVENANCE_METHODS)} (how `ragpipe golden draft` made the item), or "
            "remove 'provenance'"
        )
    return str(method)


def _item(raw: Any, index: int, source: str, seen: set[str]) -> GoldenItem:
    where = f"{source}: item {index + 1}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a mapping with id, query and relevance")
    _refuse_unknown(raw, ITEM_KEYS, where)
    raw_id = raw.get("id")
    if isinstance(raw_id, bool) or not isinstance(raw_id, str | int | None):
        raise ConfigError(f"{where}: 'id' must be text or a number, got {raw_id!r}")
    item_id = "" if raw_id is None else str(raw_id).strip()
    if not item_id:
        raise ConfigError(f"{where}: 'id' is missing")
    where = f"{source}: item {index + 1} (id {item_id})"
    if item_id in seen:
        raise ConfigError(f"{where}: duplicate id")
    seen.add(item_id)
    query = raw.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ConfigError(f"{where}: 'query' must be a non-empty string")
    answerable = raw.get("answerable", True)
    if not isinstance(answerable, bool):
        raise ConfigError(f"{where}: 'answerable' must be true or false, got {answerable!r}")
    answer = raw.get("expected_answer")
    if answer is not None and not isinstance(answer, str):
        raise ConfigError(f"{where}: 'expected_answer' must be a string")
    if answer is not None:
        answer = answer.strip()
        if not normalize_answer(answer):  # every answer would score F1 0 against it
            raise ConfigError(
                f"{where}: 'expected_answer' {raw.get('expected_answer')!r} has no word to "
                "score an answer against (blank, or only punctuation and articles); write "
                "the answer or remove the key"
            )
    draft = raw.get("draft", False)
    if not isinstance(draft, bool):
        raise ConfigError(f"{where}: 'draft' must be true or false, got {draft!r}")
    drafted_by = _check_provenance(raw["provenance"], where) if "provenance" in raw else None
    if not answerable:
        keys = ("relevance", "expected_files", "chunks", "expected_answer")
        targets = [k for k in keys if raw.get(k)]
        if targets:
            raise ConfigError(
                f"{where}: 'answerable: false' means the corpus holds no answer; remove "
                f"{', '.join(targets)} or drop 'answerable: false'"
            )
        return GoldenItem(item_id, query.strip(), {}, answerable=False, draft=draft,
                          drafted_by=drafted_by)  # fmt: skip
    relevance: dict[str, int] = {}
    graded = raw.get("relevance") or {}
    if not isinstance(graded, dict):
        raise ConfigError(f"{where}: 'relevance' must map file suffixes to grades 0..3")
    for file, grade in graded.items():
        relevance[str(file)] = _grade(grade, f"{where}, relevance of {file!r}")
    explicit = set(relevance)

    def implied(file: str, grade: int) -> None:
        """A file ``relevance`` does not grade takes the highest grade given to it. A file
        already named by a longer or shorter suffix (``sample/a.pdf`` and ``a.pdf``) is
        that name's: a second name for one file was refused when matched."""
        name = next((k for k in relevance if _one_file(k, file)), file)
        if name not in explicit:
            relevance[name] = max(relevance.get(name, grade), grade)

    expected = raw.get("expected_files") or []
    if not isinstance(expected, list) or not all(isinstance(f, str) for f in expected):
        raise ConfigError(
            f"{where}: 'expected_files' must be a list of file suffixes, got {expected!r} "
            "(grades go under 'relevance')"
        )
    for file in expected:
        implied(file, 1)
    targets = raw.get("chunks") or []
    if not isinstance(targets, list):
        raise ConfigError(f"{where}: 'chunks' must be a list of chunk targets, got {targets!r}")
    chunks: list[ChunkTarget] = []
    for j, target in enumerate(targets):
        cw = f"{where}, chunk target {j + 1}"
        if isinstance(target, dict):
            _refuse_unknown(target, CHUNK_KEYS, cw)
        if not isinstance(target, dict) or not target.get("file"):
            raise ConfigError(f"{cw}: needs 'file' and one of 'contains' or 'heading'")
        for key in ("file", "contains", "heading"):
            if target.get(key) is not None and not isinstance(target[key], str):
                raise ConfigError(
                    f"{cw}: '{key}' must be text, got {target[key]!r}; quote it "
                    f'({key}: "{target[key]}")'
                )
            if isinstance(target.get(key), str) and not target[key].strip():
                # "" is in every text: a blank target matched the file's first chunk
                raise ConfigError(f"{cw}: '{key}' is blank; it would match every chunk")
        if bool(target.get("contains")) == bool(target.get("heading")):
            raise ConfigError(f"{cw}: give exactly one of 'contains' or 'heading'")
        grade = _grade(target.get("grade", 1), cw)
        new = ChunkTarget(str(target["file"]), target.get("contains"), target.get("heading"), grade)
        same = next((k for k, c in enumerate(chunks, start=1) if _same(c, new)), None)
        if same is not None:
            # One target twice would be one relevant item counted twice: a second chunk of
            # it credited as relevant, and its grade the one listed last.
            raise ConfigError(
                f"{cw}: the same target as chunk target {same} ({new.key}; grades "
                f"{chunks[same - 1].grade} and {grade}): keep one, with the grade you mean"
            )
        chunks.append(new)
        implied(str(target["file"]), grade)
    if not any(g > 0 for g in relevance.values()):
        raise ConfigError(
            f"{where}: no relevant file (grade > 0): add 'relevance', 'expected_files' or "
            "'chunks' (or 'answerable: false' for a question the corpus does not answer)"
        )
    return GoldenItem(item_id, query.strip(), relevance, tuple(chunks), answer, draft=draft,
                      drafted_by=drafted_by)  # fmt: skip


def load_golden(path: Path) -> GoldenSet:
    """Read and validate a golden set; errors name the item and the fix."""
    if not path.is_file():
        raise ConfigError(f"golden set {path} not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"golden set {path} is not UTF-8 text: {exc}") from exc
    data = yamlio.load(text, f"golden set {path}", yamlio.DATA_LIMIT)
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        raise ConfigError(f"golden set {path}: expected a mapping with an 'items' list")
    # Keys starting with "x-" hold what the file's items refer to by YAML anchor (as in a
    # Compose file): ``x-files: &f [a.md, b.md]``, then ``expected_files: *f``.
    free = {k: v for k, v in data.items() if not str(k).startswith(FREE_KEY_PREFIX)}
    _refuse_unknown(free, FILE_KEYS, f"golden set {path}", FREE_KEY_NOTE)
    seen: set[str] = set()
    items = [_item(raw, i, str(path), seen) for i, raw in enumerate(data["items"])]
    if not items:
        raise ConfigError(f"golden set {path} has no items")
    name = str(data.get("name") or path.stem)
    return GoldenSet(name, items, str(data.get("description", "")), str(path))


def save_golden(golden: GoldenSet, path: Path) -> None:
    """Write a golden set in the YAML format above (replacing ``path`` whole).

    Raises:
        DiskFull: No space left to write it.
    """
    items = []
    for item in golden.items:
        raw: dict[str, Any] = {"id": item.id, "query": item.query}
        if not item.answerable:
            raw["answerable"] = False
            items.append(raw)
            continue
        raw["relevance"] = item.relevance
        if item.chunks:
            raw["chunks"] = [
                {
                    k: v
                    for k, v in (
                        ("file", c.file),
                        ("heading", c.heading),
                        ("contains", c.contains),
                        ("grade", c.grade),
                    )
                    if v is not None
                }
                for c in item.chunks
            ]
        if item.expected_answer:
            raw["expected_answer"] = item.expected_answer
        items.append(raw)
    data = {"name": golden.name, "description": golden.description, "items": items}
    # Over the old set whole or not at all: an interrupt or a full disk never leaves a
    # cut-off set, which would load with fewer items and no word of the rest.
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)
    atomic_write_bytes(path, text.encode("utf-8"))


def import_beir(directory: Path, out_corpus: Path, split: str = "test") -> GoldenSet:
    """Turn a BEIR dataset into documents under ``out_corpus`` and a golden set.

    Each corpus entry becomes ``<out_corpus>/<doc id>.md`` (title as heading,
    then the text; characters other than letters, digits, ``-_.`` become ``_``,
    and an id whose name another id already took, ``doc:1`` after ``doc_1``,
    gets its hash appended), so the normal ingest indexes it; qrels of
    ``split`` become file-level graded relevance. What the import leaves out
    (qrels naming a document or query the dataset lacks, queries with no
    relevant document) is counted in ``notes``: a relevant document dropped
    shrinks its query's relevant set, and recall rises with it. The three files
    are read and checked before any document is written: a bad line writes nothing.

    Raises:
        ConfigError: A file is missing or malformed (its line named), a document id
            repeats, or no query has a relevant document.
    """
    corpus_file = directory / "corpus.jsonl"
    queries_file = directory / "queries.jsonl"
    qrels_file = directory / "qrels" / f"{split}.tsv"
    for required in (corpus_file, queries_file, qrels_file):
        if not required.is_file():
            raise ConfigError(f"BEIR import: {required} is missing")
    names, renamed = _beir_names(corpus_file)
    queries = _beir_queries(queries_file)
    graded: dict[str, dict[str, int]] = {}
    no_doc: dict[str, int] = {}  # query -> its relevant qrels whose document is missing
    no_query = clipped = 0
    repeated: set[tuple[str, str]] = set()  # (query, document) graded twice, differently
    judged: set[str] = set()  # this split's queries (the queries file holds every split's)
    for qid, doc_id, score in _beir_qrels(qrels_file):
        if qid not in queries:
            no_query += 1
            continue
        judged.add(qid)
        if doc_id not in names:
            if score > 0:
                no_doc[qid] = no_doc.get(qid, 0) + 1
        else:
            grades = graded.setdefault(qid, {})
            grade = min(max(score, 0), MAX_GRADE)
            clipped += score > MAX_GRADE
            before = grades.get(names[doc_id])
            if before is not None and before != grade:
                repeated.add((qid, doc_id))  # the highest kept: the last row won, even a 0
            grades[names[doc_id]] = max(grade, before or 0)
    items = [
        GoldenItem(qid, _beir_text(queries_file, queries[qid]), rel)
        for qid, rel in sorted(graded.items())
        if any(g > 0 for g in rel.values())
    ]
    if not items:
        raise ConfigError(f"BEIR import: no query in {qrels_file} has a relevant document")
    _refuse_strangers(out_corpus, set(names.values()))
    _write_beir_corpus(corpus_file, names, out_corpus)
    notes = []
    if renamed:
        notes.append(f"{renamed} document id(s) would have shared a file name with another "
                     "(after replacing characters a file name cannot hold): their files end "
                     "in a hash of the id")  # fmt: skip
    if no_doc:
        kept = {i.id for i in items}
        shrunk = sum(1 for q in no_doc if q in kept)
        notes.append(
            f"{sum(no_doc.values())} relevant qrel(s) of {len(no_doc)} query(ies) name documents "
            f"not in {corpus_file.name}: left out, so {shrunk} kept query(ies) have fewer "
            "relevant documents than the dataset says (their recall is not comparable with "
            "published numbers)"
        )
    if no_query:
        notes.append(f"{no_query} qrel(s) name queries not in {queries_file.name}: left out")
    if clipped:
        notes.append(f"{clipped} qrel(s) grade above {MAX_GRADE}, read as {MAX_GRADE}: graded "
                     "metrics (NDCG) are not comparable with published numbers")  # fmt: skip
    if repeated:
        notes.append(f"{len(repeated)} (query, document) pair(s) are graded twice, differently, "
                     f"in {qrels_file.name}: the higher grade kept")  # fmt: skip
    unjudged = len(judged) - len(items)
    if unjudged:
        notes.append(f"{unjudged} of {len(judged)} queries judged in {qrels_file.name} have no "
                     "relevant document (or none left): not in the golden set")  # fmt: skip
    return GoldenSet(directory.name, items, f"BEIR {directory.name} ({split})", str(directory),
                     notes=notes)  # fmt: skip


def _beir_lines(path: Path) -> Iterator[tuple[int, str]]:
    """The non-blank lines of a BEIR JSONL file, numbered from 1."""
    line_no = 0
    try:
        with path.open(encoding="utf-8") as fh:
            for line_no, line in enumerate(fh, start=1):
                if line.strip():
                    yield line_no, line
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}:{line_no + 1}: not UTF-8 text; BEIR files are UTF-8") from exc


def _beir_object(path: Path, line_no: int, line: str, *keys: str) -> dict[str, Any]:
    """One JSONL line as an object holding ``keys``, or the error naming the line."""
    want = f"each line must be a JSON object with {' and '.join(repr(k) for k in keys)}"
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{line_no}: not JSON ({exc.msg}); {want}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{path}:{line_no}: not a JSON object; {want}")
    missing = [repr(k) for k in keys if k not in value]
    if missing:
        raise ConfigError(f"{path}:{line_no}: no {' or '.join(missing)}; {want}")
    for key in keys:  # a null or empty one became the query 'None' or ''
        got = value[key]
        if key == "_id" and (isinstance(got, bool) or not isinstance(got, str | int)
                             or not str(got).strip()):  # fmt: skip
            raise ConfigError(f"{path}:{line_no}: '_id' is {json.dumps(got)}; it must be a "
                              "non-empty string or a whole number")  # fmt: skip
    return value


_STEM_BYTES = 200  # a long id's file name is cut to this, ending in the id's hash


def _beir_names(corpus_file: Path) -> tuple[dict[str, str], int]:
    """Each document id's file name, and how many ids got a hash to keep their name apart;
    nothing is written yet."""
    names: dict[str, str] = {}
    taken: dict[str, str] = {}  # lower-cased file name -> its id (case-blind file systems)
    renamed = 0
    for line_no, line in _beir_lines(corpus_file):
        doc_id = str(_beir_object(corpus_file, line_no, line, "_id")["_id"])
        if doc_id in names:
            raise ConfigError(f"{corpus_file}:{line_no}: document id {doc_id!r} repeats")
        stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in doc_id)
        if len(stem.encode()) > _STEM_BYTES:  # a file name holds 255 bytes: cut, and tell
            cut = stem.encode()[: _STEM_BYTES - 11].decode("utf-8", "ignore")  # apart by hash
            stem = f"{cut}-{hashlib.sha256(doc_id.encode()).hexdigest()[:10]}"
        name = stem + ".md"
        if name.lower() in taken:  # another id's name: never write over its document
            name = f"{stem}-{hashlib.sha256(doc_id.encode()).hexdigest()[:10]}.md"
            renamed += 1
            if name.lower() in taken:
                raise ConfigError(f"{corpus_file}:{line_no}: no file name left for document "
                                  f"id {doc_id!r} ({name} is taken)")  # fmt: skip
        names[doc_id] = name
        taken[name.lower()] = doc_id
    return names, renamed


def _beir_queries(queries_file: Path) -> dict[str, tuple[Any, int]]:
    """Each query id's text as the file has it, and its line (checked when used: the file
    holds every split's queries)."""
    queries: dict[str, tuple[Any, int]] = {}
    for line_no, line in _beir_lines(queries_file):
        query = _beir_object(queries_file, line_no, line, "_id", "text")
        queries[str(query["_id"])] = (query["text"], line_no)
    return queries


def _beir_text(queries_file: Path, query: tuple[Any, int]) -> str:
    """A used query's text: a null or blank one became the query 'None' or ''."""
    text, line_no = query
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{queries_file}:{line_no}: 'text' is {json.dumps(text)}; a query's "
                          "text must be a non-empty string")  # fmt: skip
    return text


def _beir_qrels(qrels_file: Path) -> list[tuple[str, str, int]]:
    """The qrels rows as (query id, document id, score), the header row left out."""
    want = "each line is query-id, corpus-id and a whole-number score, separated by tabs"
    rows: list[tuple[str, str, int]] = []
    line_no = 0
    try:
        with qrels_file.open(encoding="utf-8") as fh:
            for line_no, row in enumerate(csv.reader(fh, delimiter="\t"), start=1):
                if not any(field.strip() for field in row) or row[0] == "query-id":
                    continue
                if len(row) < 3:
                    raise ConfigError(f"{qrels_file}:{line_no}: {len(row)} field(s); {want}")
                try:
                    score = int(row[2])
                except ValueError as exc:
                    raise ConfigError(
                        f"{qrels_file}:{line_no}: score {row[2]!r} is not a whole number; {want}"
                    ) from exc
                rows.append((row[0], row[1], score))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{qrels_file}:{line_no + 1}: not UTF-8 text; BEIR files are "
                          "UTF-8") from exc  # fmt: skip
    return rows


def _refuse_strangers(out_corpus: Path, names: set[str]) -> None:
    """ConfigError when ``out_corpus`` holds files that are not this dataset's documents: an
    earlier import of another dataset (or split of files) left there would be indexed with
    it, as distractors no qrel knows, and lower every metric in silence."""
    if not out_corpus.is_dir():
        return
    strangers = []
    for here, folders, files in os.walk(out_corpus, followlinks=True):  # a linked folder too
        folders[:] = [f for f in folders if not f.startswith(".")]  # .git: never indexed
        at = Path(here)
        strangers += [
            str((at / f).relative_to(out_corpus)) for f in files
            if not f.startswith(".") and (at != out_corpus or f not in names)
        ]  # fmt: skip
    strangers.sort()
    if strangers:
        shown = ", ".join(strangers[:5]) + (", ..." if len(strangers) > 5 else "")
        raise ConfigError(
            f"BEIR import: --corpus-out {out_corpus} holds {len(strangers)} file(s) that are not "
            f"this dataset's documents ({shown}); they would be indexed with it as documents no "
            "qrel knows. Empty the folder or give another one"
        )


def _write_beir_corpus(corpus_file: Path, names: dict[str, str], out_corpus: Path) -> None:
    """Each document as Markdown, under the name ``_beir_names`` gave it."""
    out_corpus.mkdir(parents=True, exist_ok=True)
    for _, line in _beir_lines(corpus_file):
        doc = json.loads(line)  # each line was checked by _beir_names
        title = str(doc.get("title") or "").strip()
        body = (f"# {title}\n\n" if title else "") + str(doc.get("text", "")) + "\n"
        (out_corpus / names[str(doc["_id"])]).write_text(body, encoding="utf-8")


def stratified_sample(items: Sequence[GoldenItem], n: int, seed: int) -> list[GoldenItem]:
    """``n`` items, every one equally likely (``n / len(items)``), its strata (answerable or
    not, and the first target file) in proportion; in the golden order, the same for the
    same ``seed``.

    Systematic sampling over the items ordered by stratum (each stratum shuffled by
    ``seed``, a random start): an equal-probability design, so a plain mean over the sample
    estimates the whole set's mean. Taking one item per stratum in turn did not: a file with
    30 questions weighed as much as one with 1, and a sample's mean fell outside its own
    95% CI of the set's (0.371 [0.200, 0.543] where the set's was 0.714)."""
    if n >= len(items):
        return list(items)
    strata: dict[tuple[bool, str], list[int]] = {}
    for index, item in enumerate(items):
        target = item.chunks[0].file if item.chunks else next(iter(item.relevance), "")
        strata.setdefault((item.answerable, target), []).append(index)
    rng = random.Random(seed)
    ordered: list[int] = []
    for key in sorted(strata):
        members = strata[key]
        rng.shuffle(members)
        ordered += members
    step = len(items) / n  # > 1
    start = rng.random() * step
    chosen = [ordered[min(math.floor(start + k * step), len(items) - 1)] for k in range(n)]
    return [items[i] for i in sorted(chosen)]
