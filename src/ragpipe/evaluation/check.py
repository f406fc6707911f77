"""Golden sets checked against the index version being scored, before any query runs.

A target that matches nothing in the index (a typo'd heading, a misspelled or
renamed file, text the converter renders differently) would score 0 on its item
in silence, and a golden set meant for another corpus would score 0 everywhere.
``check_golden`` matches the targets a run scores against what the index holds
(``scope``: ``file`` and ``chunk`` granularity, ``answer`` for RAG, ``all``):

- a file target (``relevance`` / ``expected_files`` with grade > 0) must match
  one file in the index by path suffix (one that matches several, ``README.md``
  in a tree of packages, would score a hit on any of them as the answer);
- a chunk target (grade > 0) must match a point (``heading`` on its heading path,
  ``contains`` in its text, whitespace-normalised) that scoring can credit to it:
  a chunk counts for one target (``retrieval.credit_chunks``), so a target whose
  only chunks the item's other targets need could never score beside them; and its
  chunks must lie under one heading path (a heading target's: up to its heading), or a
  hit on the wrong section would score as the answer, as for a suffix naming several
  files (refused as that one is).

Each unmatched target is reported with its closest matches (file paths by
suffix similarity, headings by similarity, the passage sharing the longest run
of text). ``answerable: false`` items have no targets and always pass.
"""

from __future__ import annotations

import difflib
import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ragpipe.errors import ConfigError
from ragpipe.evaluation.golden import ChunkTarget, GoldenItem, GoldenSet, file_matches
from ragpipe.evaluation.retrieval import graded_targets
from ragpipe.store.base import VectorStore, Where

CLOSEST = 3
SCOPES = ("all", "file", "chunk", "answer")


class GoldenMismatch(ConfigError):
    """Golden targets match nothing in the index (exit 2, like any bad input)."""


@dataclass(frozen=True)
class Unmatched:
    """One target of one item that matches nothing, with what comes closest."""

    item_id: str
    target: str  # e.g. 'heading "2. Enabling ..." in sqlite/foreignkeys.html'
    problem: str  # e.g. "matches nothing in sqlite/foreignkeys.html"
    closest: tuple[str, ...] = ()
    # The target names several indexed files: it matches, but a hit on the wrong one would
    # score as the answer, so a score of the item is no evidence (``_ambiguous``).
    ambiguous: bool = False

    def line(self) -> str:
        near = "; closest: " + ", ".join(self.closest) if self.closest else ""
        return f"{self.item_id}: {self.target} {self.problem}{near}"


@dataclass
class GoldenCheck:
    """The outcome of checking one golden set against one index."""

    golden: str
    source: str
    items: int
    targets: int
    index_files: int
    unmatched: list[Unmatched] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # item ids left out (--skip-unmatched)
    # What can be scored but is likely a mistake (items asking one question): said, not
    # refused.
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.unmatched

    @property
    def unmatched_items(self) -> list[str]:
        return list(dict.fromkeys(u.item_id for u in self.unmatched))

    @property
    def ambiguous_items(self) -> list[str]:
        """Items with a target that names several indexed files."""
        return list(dict.fromkeys(u.item_id for u in self.unmatched if u.ambiguous))

    def lines(self) -> list[str]:
        return [u.line() for u in self.unmatched]

    def as_dict(self) -> dict[str, Any]:
        return {
            "items": self.items,
            "targets": self.targets,
            "index_files": self.index_files,
            "unmatched": [u.line() for u in self.unmatched],
            "skipped_items": self.skipped,
            "warnings": self.warnings,
        }


class IndexView:
    """What the check needs of an index: its files, their headings, their text on demand."""

    def __init__(self, store: VectorStore) -> None:
        self.store = store
        self.headings: dict[str, set[str]] = defaultdict(set)
        self.shas: dict[str, set[str]] = defaultdict(set)  # file -> its stored source SHA-256
        for hit in store.scroll(fields=["file_path", "heading_path", "source_sha"]):
            path = str(hit.payload.get("file_path", ""))
            self.headings[path].update(str(h) for h in hit.payload.get("heading_path") or [])
            if hit.payload.get("source_sha"):
                self.shas[path].add(str(hit.payload["source_sha"]))
        self.files = sorted(self.headings)
        # Files by their last path component: a suffix ends with its file's, so matching
        # is a lookup and a suffix check of those few, not a scan of every file (1,000
        # items x 2 targets on 20,000 files: 15 s of CPU in the check, 7.7 s in the evidence).
        self._by_name: dict[str, list[str]] = defaultdict(list)
        for path in self.files:
            self._by_name[_last_part(path)].append(path)
        self._matched: dict[str, tuple[str, ...]] = {}
        self._texts: dict[str, list[dict[str, Any]]] = {}

    def matching(self, suffix: str) -> list[str]:
        """The indexed files ``suffix`` names (``golden.file_matches``), in path order."""
        if suffix not in self._matched:
            named = self._by_name.get(_last_part(suffix), [])
            self._matched[suffix] = tuple(f for f in named if file_matches(f, suffix))
        return list(self._matched[suffix])

    def payloads(self, path: str) -> list[dict[str, Any]]:
        """Every chunk of one file (file_path, heading_path, text), loaded once."""
        if path not in self._texts:
            where = Where(must={"file_path": path})
            fields = ["file_path", "heading_path", "text", "chunk_index"]
            found = [h.payload for h in self.store.scroll(where, fields=fields)]
            # In document order: a scroll's order is the engine's, not always the same.
            self._texts[path] = sorted(found, key=lambda p: int(p.get("chunk_index") or 0))
        return self._texts[path]


def _last_part(path: str) -> str:
    """A path's last component, as ``file_matches`` splits them (``/`` or ``\\``)."""
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def _closest_files(suffix: str, files: Iterable[str]) -> tuple[str, ...]:
    """Index paths whose last components look most like ``suffix``."""
    depth = suffix.strip("/").count("/") + 1
    tails: dict[str, str] = {}
    for path in files:
        tails.setdefault("/".join(path.replace("\\", "/").split("/")[-depth:]), path)
    near = difflib.get_close_matches(suffix, list(tails), n=CLOSEST, cutoff=0.5)
    return tuple(tails[t] for t in near)


def _closest_headings(heading: str, headings: Iterable[str]) -> tuple[str, ...]:
    near = difflib.get_close_matches(heading, sorted(set(headings)), n=CLOSEST, cutoff=0.4)
    return tuple(f'"{h}"' for h in near)


def _closest_passage(text: str, payloads: list[dict[str, Any]]) -> tuple[str, ...]:
    """The passage sharing the longest run of characters with ``text``, quoted around it."""
    wanted = " ".join(text.split())
    best: tuple[int, str, str] = (0, "", "")
    for payload in payloads:
        body = " ".join(str(payload.get("text", "")).split())
        matcher = difflib.SequenceMatcher(None, wanted, body, autojunk=False)
        m = matcher.find_longest_match(0, len(wanted), 0, len(body))
        if m.size > best[0]:
            start = max(0, m.b - 20)
            snippet = body[start : m.b + max(m.size, len(wanted)) + 20]
            heading = " > ".join(payload.get("heading_path") or [])
            best = (m.size, snippet, heading)
    if best[0] < 4:
        return ()
    where = f" (under {best[2]})" if best[2] else ""
    return (f'"…{best[1]}…"{where}',)


def _where(payload: dict[str, Any]) -> str:
    """A chunk as a person finds it: its file, heading path and opening words."""
    words = " ".join(str(payload.get("text", "")).split()[:8])
    heading = " > ".join(payload.get("heading_path") or [])
    return (
        f"{payload.get('file_path', '?')}"
        + (f" under {heading}" if heading else "")
        + (f': "{words} …"')
    )


def _ambiguous(item: GoldenItem, what: str, files: list[str]) -> Unmatched:
    """A target naming several indexed files: any of them would score as the answer."""
    shown = ", ".join(files[:CLOSEST]) + (", ..." if len(files) > CLOSEST else "")
    return Unmatched(
        item.id,
        what,
        f"matches {len(files)} files in the index ({shown}), and a hit on any of them would "
        "score as the answer: give a longer path that names one",
        ambiguous=True,
    )


def _check_chunk(item: GoldenItem, target: ChunkTarget, view: IndexView) -> Unmatched | None:
    files = view.matching(target.file)
    if not files:
        return Unmatched(
            item.id,
            f'chunk target file "{target.file}"',
            "matches no file in the index",
            _closest_files(target.file, view.files),
        )
    if len(files) > 1:
        return _ambiguous(item, f'chunk target file "{target.file}"', files)
    if target.heading is not None and not any(target.heading in view.headings[f] for f in files):
        return Unmatched(
            item.id,
            f'heading "{target.heading}"',
            f"matches nothing in {', '.join(files)}",
            _closest_headings(target.heading, (h for f in files for h in view.headings[f])),
        )
    payloads = [p for f in files for p in view.payloads(f)]
    matched = [p for p in payloads if target.matches(p)]
    if matched:
        return _sections(item, target, matched)
    return Unmatched(
        item.id,
        f'text "{target.contains}"',
        f"is in no chunk of {', '.join(files)}",
        _closest_passage(str(target.contains), payloads),
    )


def _section(target: ChunkTarget, payload: dict[str, Any]) -> tuple[str, ...]:
    """The section of a chunk ``target`` matches: its heading path, cut after the target's
    heading (the chunks of its subsections are that one section's)."""
    path = tuple(str(h) for h in payload.get("heading_path") or [])
    if target.heading is not None and target.heading in path:
        return path[: path.index(target.heading) + 1]
    return path


def _sections(
    item: GoldenItem, target: ChunkTarget, matched: list[dict[str, Any]]
) -> Unmatched | None:
    """A target whose chunks lie under more than one heading path: a hit on any of them would
    score as the answer, as for a file suffix that names several files (``_ambiguous``), so
    it is refused as that one is. "the daemon" in two sections credited the install
    section's chunk at rank 1 for a question about upgrading: MRR 1.0, 0.25 with text only
    the upgrade section holds."""
    found = list(dict.fromkeys(_section(target, p) for p in matched))
    if len(found) < 2:
        return None
    shown = "; ".join(" > ".join(s) or "(no heading)" for s in found[:5])
    if len(found) > 5:
        shown += "; ..."
    fix = (
        "the heading is in several places, so give text only the answer's section holds (contains)"
        if target.heading is not None
        else "give text only the answer's section holds, or target that section by heading"
    )
    return Unmatched(
        item.id,
        f'chunk target "{target.key}"',
        f"matches chunks under {len(found)} heading paths ({shown}), and a hit on any of "
        f"them would score as the answer: {fix}",
    )


def _most_targets(payloads: list[dict[str, Any]], item: GoldenItem) -> set[int]:
    """The item's targets (indexes, grade > 0) that one assignment of chunks to targets
    (each chunk one target, each target one chunk) credits at once, as many as any can: a
    maximum matching, by augmenting paths."""
    graded = graded_targets(item)  # tried in scoring's order
    satisfied = [[t for t in graded if item.chunks[t].matches(p)] for p in payloads]
    owner: dict[int, int] = {}  # target -> chunk

    def augment(chunk: int, seen: set[int]) -> bool:
        for t in satisfied[chunk]:
            if t not in seen:
                seen.add(t)
                if t not in owner or augment(owner[t], seen):
                    owner[t] = chunk
                    return True
        return False

    for chunk in range(len(payloads)):
        augment(chunk, set())
    return set(owner)


def _crowded(item: GoldenItem, found: list[ChunkTarget], view: IndexView) -> list[Unmatched]:
    """Targets that match chunks, yet could never score beside the item's others: a chunk
    counts for one target (``retrieval.credit_chunks``), and no assignment of their files'
    chunks leaves one for them."""
    if len(found) < 2:
        return []
    files = sorted({f for t in found for f in view.matching(t.file)})
    payloads = [p for f in files for p in view.payloads(f)]
    credited = _most_targets(payloads, item)
    return [
        Unmatched(
            item.id,
            f'chunk target "{target.key}"',
            "matches only chunks that the item's other targets need (a chunk counts for one "
            "target), so its targets can never all score: merge them, or point this one at "
            "another chunk",
        )
        for t, target in enumerate(item.chunks)
        if target in found and t not in credited
    ]


def _shared(item: GoldenItem, found: list[ChunkTarget], view: IndexView) -> list[Unmatched]:
    """Targets whose credit depends on the order their chunks come back in: chunk c
    satisfies both, and the one a chunk tries first (``graded_targets``: the higher grade)
    also some chunk d the other does not. [c, d] credits c to the first and d to nothing,
    [d, c] both: recall 0.5 or 1.0 for the same two chunks, the better ranking (the answer
    first) lower. A passage (grade 3) inside its section (grade 1) is no such pair: its
    chunks all satisfy the section's target, and any order credits both. Named once per
    pair."""
    if len(found) < 2:
        return []
    files = sorted({f for t in found for f in view.matching(t.file)})
    order = {item.chunks[t].key: n for n, t in enumerate(graded_targets(item))}
    satisfied = [
        ({t for t, target in enumerate(found) if target.matches(p)}, p)
        for p in (p for f in files for p in view.payloads(f))
    ]
    pairs: dict[tuple[int, int], dict[str, Any]] = {}
    for both, payload in satisfied:
        for a, b in itertools.combinations(sorted(both), 2):
            first, then = (a, b) if order[found[a].key] < order[found[b].key] else (b, a)
            if any(first in these and then not in these for these, _ in satisfied):
                pairs.setdefault((a, b), payload)
    return [
        Unmatched(
            item.id,
            f'chunk target "{found[b].key}"',
            f'shares a chunk with chunk target "{found[a].key}" ({_where(payload)}): a chunk '
            "counts for one target, so the item's score would depend on the order its "
            "chunks come back in; make the targets name different chunks (e.g. a heading "
            "target for a subsection), or keep the one you mean",
        )
        for (a, b), payload in pairs.items()
    ]


def _scored_targets(item: GoldenItem, scope: str) -> tuple[list[str], list[ChunkTarget]]:
    """The file suffixes and chunk targets of ``item`` that a run of ``scope`` scores."""
    chunks = [t for t in item.chunks if t.grade > 0]
    files = [s for s, g in item.relevance.items() if g > 0]
    if scope == "file":
        return files, []
    if scope == "chunk":
        return [], chunks
    if scope == "answer":  # citations count chunk targets when there are any, else files
        return ([], chunks) if item.chunks else (files, [])
    # A file a graded chunk target names is checked through that target; one named only
    # by a grade-0 target is checked as a file ("ok" passed a file that matched nothing).
    chunk_files = {t.file for t in chunks}
    return [s for s in files if s not in chunk_files], chunks


NO_CHUNKS = "chunk targets"
NO_CHUNKS_PROBLEM = (
    "are missing: at chunk granularity (eval.granularity's default) an item is scored by "
    "them, and a retrieval run refuses it; set eval.granularity: file (--granularity file "
    "on `ragpipe eval retrieval`), or add chunks: to the item"
)


def check_golden(
    golden: GoldenSet, view: IndexView, scope: str = "all", *, require_chunks: bool = False
) -> GoldenCheck:
    """Match the targets a run of ``scope`` scores against the index; nothing is scored.

    Args:
        scope: ``file`` or ``chunk`` (a retrieval run's granularity), ``answer`` (a RAG
            run: its citation metrics), or ``all`` (every target, as ``eval check``).
        require_chunks: An answerable item without chunk targets is unmatched too (``eval
            check`` when ``eval.granularity`` is chunk, or at scope ``chunk``): ``chunks:``
            is optional in the format, but a chunk-granularity run refuses such an item,
            and "ok" before that refusal read as a set ready to score.
    """
    if scope not in SCOPES:
        raise ConfigError(f"check scope {scope!r} is not one of {', '.join(SCOPES)}")
    unmatched: list[Unmatched] = []
    targets = 0
    for item in golden.items:
        files, chunks = _scored_targets(item, scope)
        if require_chunks and item.answerable and not item.chunks:
            targets += 1
            unmatched.append(Unmatched(item.id, NO_CHUNKS, NO_CHUNKS_PROBLEM))
        if scope != "file" and item.chunks and not chunks:
            # Chunks (and citations) are scored by the chunk targets alone: with every
            # one at grade 0 nothing could count as relevant, and the item would score 0.
            targets += 1
            unmatched.append(
                Unmatched(
                    item.id,
                    "chunk targets",
                    "all have grade 0, so at chunk granularity (and for citations) nothing "
                    "is relevant and the item would score 0 whatever is retrieved: give the "
                    "target that answers the question a grade of 1..3, or remove 'chunks'",
                )
            )
        for suffix in files:
            targets += 1
            named = view.matching(suffix)
            if not named:
                unmatched.append(
                    Unmatched(
                        item.id,
                        f'file "{suffix}"',
                        "matches no file in the index",
                        _closest_files(suffix, view.files),
                    )
                )
            elif len(named) > 1:
                unmatched.append(_ambiguous(item, f'file "{suffix}"', named))
        # File granularity credits a file to the first name of the item it matches, whatever
        # its grade: a graded name (chunk files too) whose files are all claimed never scores.
        claimed: set[str] = set()
        for suffix, grade in item.relevance.items() if scope in ("file", "all") else ():
            found = set(view.matching(suffix))
            if grade > 0 and found and found <= claimed:
                unmatched.append(
                    Unmatched(
                        item.id,
                        f'file "{suffix}"',
                        "matches only files that an earlier file name of the item already "
                        "claims (a file counts for the first name it matches at file "
                        "granularity), so it can never score: remove the duplicate name",
                    )
                )
            claimed |= found
        located: list[ChunkTarget] = []
        for target in chunks:
            targets += 1
            problem = _check_chunk(item, target, view)
            if problem is not None:
                unmatched.append(problem)
            else:
                located.append(target)
        crowded = _crowded(item, located, view)
        unmatched += crowded or _shared(item, located, view)
    return GoldenCheck(
        golden.name,
        golden.source,
        len(golden.items),
        targets,
        len(view.files),
        unmatched,
        warnings=golden.duplicate_queries(),
    )


def golden_for_index(
    golden: GoldenSet,
    view: IndexView,
    *,
    skip_unmatched: bool,
    origin: str,
    scope: str = "all",
    require_chunks: bool = False,
) -> tuple[GoldenSet, GoldenCheck]:
    """The golden set to score on this index, and its check.

    Args:
        golden: The set as loaded.
        view: The index version about to be scored.
        skip_unmatched: Leave out items with an unmatched target instead of stopping.
        origin: Where the golden set's path came from (``RagpipeConfig.origin``), so
            that a set picked by a default says so.
        scope: What the run scores (see ``check_golden``).
        require_chunks: See ``check_golden``.

    Raises:
        GoldenMismatch: A target cannot be scored here, as it matches nothing or names
            several files (and ``skip_unmatched`` is off), or
            no file the set names is in the index at all (always: that set belongs to
            another corpus), or nothing would be left to score.
    """
    check = check_golden(golden, view, scope, require_chunks=require_chunks)
    answerable = [i for i in golden.items if i.answerable]
    named = {s for i in answerable for s, g in i.relevance.items() if g > 0}
    if answerable and not any(view.matching(s) for s in named):
        shown = ", ".join(sorted(named)[:5]) + (", ..." if len(named) > 5 else "")
        raise GoldenMismatch(
            f"golden set {golden.name!r} ({golden.source}, from {origin}) names no file in "
            f"this index: none of its {len(answerable)} answerable items' files ({shown}) is "
            f"among the index's {len(view.files)} files. It was written for another corpus: "
            "pass --golden (eval.golden) with a set for this index, or ingest its corpus"
        )
    if check.ok:
        return golden, check
    if not skip_unmatched:
        raise GoldenMismatch(
            f"golden set {golden.name!r} ({golden.source}): {len(check.unmatched)} target(s) of "
            f"{len(check.unmatched_items)} item(s) cannot be scored on this index; fix them, or "
            "pass --skip-unmatched (eval.skip_unmatched) to score the rest:\n  "
            + "\n  ".join(check.lines())
        )
    dropped = set(check.unmatched_items)
    kept = [i for i in golden.items if i.id not in dropped]
    if not any(i.answerable for i in kept) and (scope != "answer" or not kept):
        raise GoldenMismatch(
            f"golden set {golden.name!r}: every answerable item has an unmatched target, "
            "nothing is left to score:\n  " + "\n  ".join(check.lines())
        )
    check.skipped = [i.id for i in golden.items if i.id in dropped]
    return replace(golden, items=kept), check


def evidence(golden: GoldenSet, view: IndexView) -> dict[str, dict[str, str]]:
    """Per golden item, the index files its targets name and their source SHA-256 (the
    evidence its labels were scored on); a file with several stored versions (mid-update)
    joins them."""
    found: dict[str, dict[str, str]] = {}
    for item in golden.items:
        suffixes = {s for s, g in item.relevance.items() if g > 0}
        suffixes.update(t.file for t in item.chunks)
        files = {f for suffix in suffixes for f in view.matching(suffix)}
        found[item.id] = {f: "+".join(sorted(view.shas.get(f, ()))) for f in sorted(files)}
    return found


def evidence_changes(
    before: dict[str, dict[str, str]], now: dict[str, dict[str, str]]
) -> dict[str, str]:
    """Items whose evidence differs between two runs, each with what changed (items absent
    from either run are not compared)."""
    changed = {}
    for item, files in now.items():
        old = before.get(item)
        if old is None or old == files:
            continue
        parts = [f"{f} changed" for f in sorted(set(old) & set(files)) if old[f] != files[f]]
        parts += [f"{f} is new" for f in sorted(set(files) - set(old))]
        parts += [f"{f} is gone" for f in sorted(set(old) - set(files))]
        changed[item] = ", ".join(parts)
    return changed
