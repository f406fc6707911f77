"""Golden sets checked against the real index before any query: unmatched targets named
with their closest matches, --skip-unmatched, a set meant for another corpus, `eval check`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flows.cli import app
from ragpipe.config import RagpipeConfig, load_config
from ragpipe.evaluation.check import (
    GoldenMismatch,
    IndexView,
    check_golden,
    evidence,
    golden_for_index,
)
from ragpipe.evaluation.golden import GoldenItem, GoldenSet, load_golden
from ragpipe.evaluation.run import run_retrieval
from ragpipe.models.embedders import embedder_name
from ragpipe.store import open_reader

pytestmark = pytest.mark.integration

# Two mistakes a team makes: a heading one letter off, and a misspelled file.
TYPOS = """
name: typos
items:
  - id: calvin
    query: How does the Calvin cycle fix carbon dioxide?
    chunks: [{file: science/photosynthesis.md, heading: Calvin cycle, grade: 3}]
  - id: oven-typo
    query: How hot should the oven be for bread?
    chunks: [{file: kitchen/bread.md, heading: Ovens, grade: 3}]
  - id: backup-typo
    query: How often are backups taken?
    chunks: [{file: ops/backup.md, heading: Schedule, grade: 2}]
  - id: lovelace-text
    query: Who wrote the first program for the Analytical Engine?
    chunks: [{file: computing.md, contains: first published programme for Charles Babbage}]
  - id: capital
    query: What is the capital of France?
    answerable: false
"""
# A set written for another corpus: none of its files is in this index.
ELSEWHERE = """
name: elsewhere
items:
  - id: fk
    query: How do I enable foreign keys?
    chunks: [{file: sqlite/foreignkeys.html, heading: "2. Enabling Foreign Key Support"}]
  - id: cache
    query: Where does pip cache wheels?
    expected_files: [misc/caching.md]
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _view(config: RagpipeConfig) -> Any:
    store = open_reader(config.store, embedder_name(config.embed))
    assert store is not None
    return store, IndexView(store)


def test_each_unmatched_target_is_named_with_its_closest_match(
    indexed_edge: RagpipeConfig, tmp_path: Path
) -> None:
    golden = load_golden(_write(tmp_path, "typos", TYPOS))
    store, view = _view(indexed_edge)
    try:
        check = check_golden(golden, view)
        assert (check.items, check.targets, check.index_files) == (5, 4, 5)
        assert check.unmatched_items == ["oven-typo", "backup-typo", "lovelace-text"]
        lines = check.lines()
        # Paths as the index holds them (absolute here).
        assert lines[0].startswith('oven-typo: heading "Ovens" matches nothing in /')
        assert lines[0].endswith('/kitchen/bread.md; closest: "Oven"')
        assert lines[1].startswith(
            'backup-typo: chunk target file "ops/backup.md" matches no file in the index'
        )
        assert "closest: " in lines[1] and "ops/backups.md" in lines[1]
        assert lines[2].startswith('lovelace-text: text "first published programme for Charles')
        assert "/history/computing.md; closest:" in lines[2] and "is in no chunk of" in lines[2]
        assert "first published program for Charles Babbage" in lines[2]  # the real text
        assert "(under Early computing > Ada Lovelace)" in lines[2]
        with pytest.raises(GoldenMismatch) as caught:
            golden_for_index(golden, view, skip_unmatched=False, origin="a test")
        message = str(caught.value)
        assert "3 target(s) of 3 item(s) cannot be scored" in message
        assert "--skip-unmatched" in message
        assert all(line in message for line in lines)
        kept, skipped = golden_for_index(golden, view, skip_unmatched=True, origin="a test")
        assert [i.id for i in kept.items] == ["calvin", "capital"]
        assert skipped.skipped == ["oven-typo", "backup-typo", "lovelace-text"]
    finally:
        store.close()


def test_a_file_named_twice_is_named_as_never_scoring(
    indexed_edge: RagpipeConfig, tmp_path: Path
) -> None:
    # File granularity credits a file to the first name it matches: the second name of
    # the same file could never score, and would cap the item's recall at 1/2.
    twice = _write(tmp_path, "twice", """
items:
  - id: twice
    query: How does the Calvin cycle fix carbon dioxide?
    relevance: {science/photosynthesis.md: 1, photosynthesis.md: 3}
""")  # fmt: skip
    golden = load_golden(twice)
    store, view = _view(indexed_edge)
    try:
        check = check_golden(golden, view, "file")
        assert check.unmatched_items == ["twice"]
        assert (
            'twice: file "photosynthesis.md" matches only files that an earlier file name'
            in (check.lines()[0])
        )
        assert check_golden(golden, view, "all").unmatched_items == ["twice"]
        assert check_golden(golden, view, "answer").ok  # a citation counts for any name
        # Chunk targets all at grade 0: nothing relevant at chunk level or for citations;
        # the file grade still scores at file granularity.
        zero = load_golden(_write(tmp_path, "zero", """
items:
  - id: zero
    query: How does the Calvin cycle fix carbon dioxide?
    relevance: {science/photosynthesis.md: 3}
    chunks: [{file: science/photosynthesis.md, heading: Calvin cycle, grade: 0}]
"""))  # fmt: skip
        for scope in ("chunk", "answer", "all"):
            (line,) = check_golden(zero, view, scope).lines()
            assert line.startswith("zero: chunk targets all have grade 0"), scope
        assert check_golden(zero, view, "file").ok
    finally:
        store.close()


def test_a_set_for_another_corpus_fails_naming_where_it_came_from(
    indexed_edge: RagpipeConfig, tmp_path: Path
) -> None:
    golden = load_golden(_write(tmp_path, "elsewhere", ELSEWHERE))
    store, view = _view(indexed_edge)
    try:
        for skip in (False, True):  # skipping cannot make a set for another corpus score
            with pytest.raises(GoldenMismatch) as caught:
                golden_for_index(golden, view, skip_unmatched=skip, origin="the built-in default")
            message = str(caught.value)
            assert "golden set 'elsewhere'" in message and "from the built-in default" in message
            assert "names no file in this index" in message and "2 answerable items" in message
            assert "misc/caching.md, sqlite/foreignkeys.html" in message and "5 files" in message
    finally:
        store.close()
    # The shipped default, replayed on an index it does not belong to, says it was the default.
    config = indexed_edge.model_copy(
        update={"eval": indexed_edge.eval.model_copy(update={"reports_dir": tmp_path / "r"})}
    )
    with pytest.raises(GoldenMismatch, match=r"r-faq-dev.*from the built-in default of eval\.gold"):
        run_retrieval(config)
    assert not (tmp_path / "r").exists()  # nothing scored, nothing written
    loaded = load_config(None, {"eval": {"golden": str(tmp_path / "elsewhere.yaml")}})
    assert loaded.origin("eval.golden") == "the command line"
    written = tmp_path / "team.yaml"
    written.write_text("eval: {golden: elsewhere.yaml}\n", encoding="utf-8")
    assert load_config(written).origin("eval.golden") == str(written)


def test_skip_unmatched_scores_the_rest_and_the_report_counts_them(
    indexed_edge: RagpipeConfig, tmp_path: Path
) -> None:
    path = _write(tmp_path, "typos", TYPOS)
    config = indexed_edge.model_copy(
        update={
            "eval": indexed_edge.eval.model_copy(
                update={"golden": path, "reports_dir": tmp_path / "reports", "resamples": 200,
                        "skip_unmatched": True}
            )
        }
    )  # fmt: skip
    result, run = run_retrieval(config)
    # calvin is scored; capital is answerable: false (not applicable to retrieval metrics).
    assert [r.item_id for r in result.rows] == ["calvin"]
    assert run.metrics["default"]["mrr"]["n"] == 1
    assert run.metrics["default"]["mrr"]["n_not_applicable"] == 1
    assert run.metrics["default"]["mrr"]["ci_low"] is None  # one query: no CI
    summary = json.loads(Path(run.report_dir, "summary.json").read_text())
    assert summary["golden_check"]["skipped_items"] == ["oven-typo", "backup-typo",
                                                        "lovelace-text"]  # fmt: skip
    report = Path(run.report_dir, "report.md").read_text()
    assert "3 of 5 golden items skipped (--skip-unmatched)" in report
    assert "checked against the index: 4 targets, 3 items skipped" in report
    assert "## Golden targets that cannot be scored (skipped)" in report
    assert '- oven-typo: heading "Ovens" matches nothing' in report
    assert "| mrr | 1.000 (n=1, no CI, 1 n/a) |" in report
    # The review: history's scope said "all 2 items", as a run of a 2-item set would, and
    # runs that skipped other items shared its trend line.
    from ragpipe.evaluation.run import read_history

    ids = hashlib.sha256(b"backup-typo\nlovelace-text\noven-typo").hexdigest()[:6]
    assert {r["scope"] for r in read_history(tmp_path / "reports")} == {
        f"all 2 items (3 of 5 skipped: unmatched targets, ids #{ids}), depth {run.depth}, "
        f"questions {run.golden.digest}"  # the two items scored
    }


def _cli(config: RagpipeConfig, *args: str) -> Any:
    return CliRunner().invoke(
        app, [*args, "--store-path", str(config.store.path), "--embedder", "onnx"]
    )


def test_eval_check_command(indexed_edge: RagpipeConfig, tmp_path: Path) -> None:
    typos = _write(tmp_path, "typos", TYPOS)
    bad = _cli(indexed_edge, "eval", "check", str(typos))
    assert bad.exit_code == 2, bad.output
    assert "typos" in bad.output and "5 items (1 answerable: false), 4 targets" in bad.output
    flat = "".join(bad.output.split("\n"))  # the console may wrap long lines
    assert 'oven-typo: heading "Ovens" matches nothing in' in flat
    assert 'kitchen/bread.md; closest: "Oven"' in flat
    assert "3 target(s) of 3 item(s) cannot be scored" in bad.output
    good = _write(tmp_path, "good", TYPOS.split("  - id: oven-typo")[0])
    ok = _cli(indexed_edge, "eval", "check", str(good))
    assert ok.exit_code == 0, ok.output
    assert "ok: every target matches" in ok.output
    other = _cli(indexed_edge, "eval", "check", str(_write(tmp_path, "else", ELSEWHERE)))
    assert other.exit_code == 2 and "names no file in this index" in other.output
    broken = _write(tmp_path, "broken", "items:\n  - {id: x, query: q, answerable: maybe}\n")
    malformed = _cli(indexed_edge, "eval", "check", str(broken))
    assert malformed.exit_code == 2 and "'answerable' must be true or false" in malformed.output
    missing = CliRunner().invoke(
        app, ["eval", "check", str(typos), "--store-path", str(tmp_path / "none")]
    )
    assert missing.exit_code == 2 and "run `ragpipe ingest` first" in missing.output


def test_a_target_naming_several_files_is_refused(tmp_path: Path) -> None:
    # The attack review: "README.md" matched the README of three packages; the check
    # passed and a run retrieving only the wrong packages' READMEs scored MRR 1 and NDCG 1.
    from ragpipe.config import StoreConfig
    from ragpipe.store import open_store
    from tests.support.points import DIM, make_points

    store = open_store(StoreConfig(path=tmp_path / "store"), "test-embedder", DIM)
    assert store is not None
    files = {f"pkg-{p}/README.md": [f"Install pkg-{p} with pip."] for p in "abc"}
    store.upsert(make_points(files=files))
    golden = load_golden(_write(tmp_path, "readmes", """
items:
  - id: bare
    query: How do I install pkg-b?
    relevance: {README.md: 3}
  - id: chunk
    query: How do I install pkg-b?
    chunks: [{file: README.md, heading: H, grade: 3}]
  - id: named
    query: How do I install pkg-b?
    chunks: [{file: pkg-b/README.md, heading: H, grade: 3}]
"""))  # fmt: skip
    try:
        view = IndexView(store)
        check = check_golden(golden, view)
        assert check.unmatched_items == ["bare", "chunk"]
        assert check.lines() == [
            'bare: file "README.md" matches 3 files in the index (pkg-a/README.md, '
            "pkg-b/README.md, pkg-c/README.md), and a hit on any of them would score as the "
            "answer: give a longer path that names one",
            'chunk: chunk target file "README.md" matches 3 files in the index '
            "(pkg-a/README.md, pkg-b/README.md, pkg-c/README.md), and a hit on any of them "
            "would score as the answer: give a longer path that names one",
        ]
        kept, _ = golden_for_index(golden, view, skip_unmatched=True, origin="a test")
        assert [i.id for i in kept.items] == ["named"]
    finally:
        store.close()


def test_a_target_matching_chunks_under_several_headings_is_refused(tmp_path: Path) -> None:
    """The attack review: contains "the daemon", also in the install section, credited the
    install chunk at rank 1 to a question about upgrading (MRR 1.0; 0.25 with text only the
    upgrade section holds), and `eval check` said ok. Refused as a suffix naming several
    files is: a hit on any of them would score as the answer."""
    from ragpipe.config import StoreConfig
    from ragpipe.store import open_store
    from tests.support.points import DIM, make_points

    store = open_store(StoreConfig(path=tmp_path / "store"), "test-embedder", DIM)
    assert store is not None
    files = {
        "docs/install.md": ["Run the installer; the daemon starts.",
                            "Stop the daemon first, then run the installer again.",
                            "Your configuration is kept across upgrades."],
        "docs/faq.md": ["Run widget --help for examples.", "Run gadget --help for examples."],
    }  # fmt: skip
    headings = {
        ("docs/install.md", 0): ["Install", "Linux"],
        ("docs/install.md", 1): ["Install", "Upgrade"],
        ("docs/install.md", 2): ["Install", "Upgrade", "Configuration"],
        ("docs/faq.md", 0): ["Widget", "Examples"],
        ("docs/faq.md", 1): ["Gadget", "Examples"],
    }
    points = make_points(files=files)
    for point in points:
        at = (point.payload["file_path"], point.payload["chunk_index"])
        point.payload["heading_path"] = headings[at]
    store.upsert(points)
    golden = load_golden(_write(tmp_path, "sections", """
items:
  - id: toomuch
    query: How do I upgrade?
    chunks: [{file: install.md, contains: the daemon, grade: 3}]
  - id: unique
    query: How do I upgrade?
    chunks: [{file: install.md, contains: Stop the daemon first, grade: 3}]
  - id: section
    query: How do I upgrade?
    chunks: [{file: install.md, heading: Upgrade, grade: 3}]
  - id: whole-file
    query: How do I install it?
    chunks: [{file: install.md, heading: Install, grade: 1}]
  - id: examples
    query: Where are the examples?
    chunks: [{file: faq.md, heading: Examples, grade: 2}]
  - id: one-of-two
    query: Where are the examples?
    chunks: [{file: faq.md, contains: "gadget --help", grade: 2}]
"""))  # fmt: skip
    try:
        view = IndexView(store)
        check = check_golden(golden, view)
        # A section and its subsections are one heading path's: Upgrade, Install pass.
        assert check.unmatched_items == ["toomuch", "examples"]
        assert check.lines() == [
            'toomuch: chunk target "install.md#contains=the daemon" matches chunks under 2 '
            "heading paths (Install > Linux; Install > Upgrade), and a hit on any of them "
            "would score as the answer: give text only the answer's section holds, or target "
            "that section by heading",
            'examples: chunk target "faq.md#heading=Examples" matches chunks under 2 heading '
            "paths (Widget > Examples; Gadget > Examples), and a hit on any of them would "
            "score as the answer: the heading is in several places, so give text only the "
            "answer's section holds (contains)",
        ]
        with pytest.raises(GoldenMismatch, match=r"2 target\(s\) of 2 item\(s\) cannot be"):
            golden_for_index(golden, view, skip_unmatched=False, origin="a test")
        kept, _ = golden_for_index(golden, view, skip_unmatched=True, origin="a test")
        assert [i.id for i in kept.items] == ["unique", "section", "whole-file", "one-of-two"]
    finally:
        store.close()


def test_targets_that_need_the_same_chunk_are_named(
    indexed_edge: RagpipeConfig, tmp_path: Path
) -> None:
    # The Calvin cycle section is one chunk: a heading target and a contains target in it
    # cannot both be credited (a chunk counts for one target), so the item's recall could
    # never reach 1; the lower grade is the one left without a chunk.
    golden = load_golden(_write(tmp_path, "crowded", """
items:
  - id: crowded
    query: How does the Calvin cycle fix carbon dioxide?
    chunks:
      - {file: science/photosynthesis.md, contains: RuBisCO, grade: 2}
      - {file: science/photosynthesis.md, heading: Calvin cycle, grade: 3}
  - id: apart
    query: How does the Calvin cycle fix carbon dioxide?
    chunks:
      - {file: science/photosynthesis.md, contains: RuBisCO, grade: 2}
      - {file: science/photosynthesis.md, heading: Light reactions, grade: 1}
  - id: shared
    query: How does the Calvin cycle fix carbon dioxide?
    chunks:
      - {file: science/photosynthesis.md, heading: Photosynthesis, grade: 3}
      - {file: science/photosynthesis.md, contains: RuBisCO attaches carbon dioxide, grade: 2}
  - id: passage-in-section
    query: How does the Calvin cycle fix carbon dioxide?
    chunks:
      - {file: science/photosynthesis.md, contains: RuBisCO attaches carbon dioxide, grade: 3}
      - {file: science/photosynthesis.md, heading: Photosynthesis, grade: 1}
"""))  # fmt: skip
    store, view = _view(indexed_edge)
    try:
        check = check_golden(golden, view, "chunk")
        assert check.lines()[:1] == [
            'crowded: chunk target "science/photosynthesis.md#contains=RuBisCO" matches only '
            "chunks that the item's other targets need (a chunk counts for one target), so "
            "its targets can never all score: merge them, or point this one at another chunk",
        ]
        # The review's attack: the Calvin chunk satisfies both of "shared"'s targets, the
        # other chunks of the file the heading one: [calvin, light] scored recall@5 0.5,
        # [light, calvin] 1.0. Named (once), so a run refuses it or skips it.
        (shared,) = check.lines()[1:]
        assert shared.startswith(
            'shared: chunk target "science/photosynthesis.md#contains=RuBisCO attaches carbon '
            'dioxide" shares a chunk with chunk target "science/photosynthesis.md#heading='
            'Photosynthesis" (/'
        )
        assert shared.endswith(
            '/science/photosynthesis.md under Photosynthesis > Calvin cycle: "## Calvin cycle '
            "In the stroma the Calvin …\"): a chunk counts for one target, so the item's score "
            "would depend on the order its chunks come back in; make the targets name "
            "different chunks (e.g. a heading target for a subsection), or keep the one you mean"
        )
        # The passage graded above its section is tried first, and every chunk it takes
        # satisfies the section too: any order credits both. Not named (the review).
        assert check.unmatched_items == ["crowded", "shared"]
    finally:
        store.close()


def test_a_file_named_only_by_a_grade_0_chunk_target_is_checked_as_a_file(
    indexed_edge: RagpipeConfig, tmp_path: Path
) -> None:
    # "all" left out of the file checks every file a chunk target names, grade 0 too,
    # which the chunk checks leave out: "ok", then a file run refused the set.
    golden = load_golden(_write(tmp_path, "zero", """
items:
  - id: zero
    query: Who wrote the first program?
    relevance: {history/computing.md: 3, kitchen/typo-bread.md: 2}
    chunks:
      - {file: history/computing.md, heading: Ada Lovelace, grade: 3}
      - {file: kitchen/typo-bread.md, heading: Oven, grade: 0}
"""))  # fmt: skip
    store, view = _view(indexed_edge)
    try:
        for scope in ("all", "file"):
            lines = check_golden(golden, view, scope).lines()
            assert len(lines) == 1 and lines[0].startswith(
                'zero: file "kitchen/typo-bread.md" matches no file in the index'
            ), scope
        assert check_golden(golden, view, "chunk").lines() == []
    finally:
        store.close()


# Files only, no chunks: what a team writes first (chunks: was called optional).
FILES_ONLY = """
name: files-only
items:
  - id: calvin
    query: How does the Calvin cycle fix carbon dioxide?
    relevance: {science/photosynthesis.md: 3}
  - id: oven
    query: How hot should the oven be for bread?
    relevance: {kitchen/bread.md: 2}
"""


def test_eval_check_names_items_without_chunk_targets_at_chunk_granularity(
    indexed_edge: RagpipeConfig, tmp_path: Path
) -> None:
    """A set without chunks passed `eval check` ("ok: every target matches", exit 0), then
    `eval retrieval` at the default chunk granularity refused it with "Use granularity
    'file'", naming no setting."""
    files_only = str(_write(tmp_path, "files-only", FILES_ONLY))
    check = _cli(indexed_edge, "eval", "check", files_only)
    assert check.exit_code == 2, check.output
    flat = " ".join(check.output.split())
    assert "every answerable item has an unmatched target" in flat
    assert "calvin: chunk targets are missing" in flat and "oven: chunk targets" in flat
    assert "set eval.granularity: file" in flat and "ok:" not in flat
    # Beside an item that has chunks: each item named, and the fix, not --skip-unmatched.
    with_chunks = TYPOS.split("items:\n")[1].split("  - id: oven-typo")[0]
    mixed = FILES_ONLY + with_chunks.replace("id: calvin", "id: calvin-section")
    check = _cli(indexed_edge, "eval", "check", str(_write(tmp_path, "mixed", mixed)))
    assert check.exit_code == 2, check.output
    flat = " ".join(check.output.split())
    assert "3 items (0 answerable: false), 5 targets" in flat
    assert "2 item(s) have no chunk targets (first: calvin)" in flat
    assert "set eval.granularity: file" in flat and "ok:" not in flat
    assert "cannot be scored on this index" not in flat  # no target mismatches the index
    run = _cli(indexed_edge, "eval", "retrieval", "--golden", files_only,
               "--reports-dir", str(tmp_path / "reports"))  # fmt: skip
    assert run.exit_code == 2, run.output
    flat = " ".join(run.output.split())
    assert "2 item(s) have none (first: calvin)" in flat
    assert "eval.granularity: file" in flat and "--granularity file" in flat
    # The file scope, and a configuration that scores by file: ok.
    assert _cli(indexed_edge, "eval", "check", files_only, "--scope", "file").exit_code == 0
    by_file = tmp_path / "ragpipe.yaml"
    by_file.write_text("eval:\n  granularity: file\n", encoding="utf-8")
    ok = _cli(indexed_edge, "eval", "check", files_only, "--config", str(by_file))
    assert ok.exit_code == 0, ok.output
    assert "ok: every target matches" in ok.output


def test_items_asking_one_question_are_warned_of(
    indexed_edge: RagpipeConfig, tmp_path: Path
) -> None:
    """Two items with the same query (one pasted, case and spaces aside) loaded and passed
    `eval check` unsaid: the question weighed twice in every mean."""
    path = _write(tmp_path, "twice", """
name: twice
items:
  - id: calvin
    query: How does the Calvin cycle fix carbon dioxide?
    chunks: [{file: science/photosynthesis.md, heading: Calvin cycle, grade: 3}]
  - id: calvin-again
    query: "how does the  Calvin cycle fix carbon dioxide? "
    chunks: [{file: science/photosynthesis.md, contains: RuBisCO, grade: 3}]
  - id: oven
    query: How hot should the oven be for bread?
    chunks: [{file: kitchen/bread.md, heading: Oven, grade: 3}]
""")  # fmt: skip
    said = (
        "items calvin and calvin-again ask the same question ('How does the Calvin cycle fix "
        "carbon dioxide?'): it weighs 2 times in every mean; merge them, or reword one"
    )
    check = _cli(indexed_edge, "eval", "check", str(path))
    assert check.exit_code == 0, check.output  # a warning, not a mismatch
    flat = " ".join(check.output.split())
    assert f"warning: {said}" in flat and "ok: every target matches" in flat
    config = indexed_edge.model_copy(
        update={"eval": indexed_edge.eval.model_copy(
            update={"golden": path, "reports_dir": tmp_path / "reports", "resamples": 200})}
    )  # fmt: skip
    _, run = run_retrieval(config)
    assert f"golden set: {said}" in run.warnings
    summary = json.loads(Path(run.report_dir, "summary.json").read_text())
    assert summary["golden_check"]["warnings"] == [said]


class _Listed:
    """A store that only lists points (what IndexView reads): 20,000 files in seconds,
    where the real engines take minutes to take them in."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def scroll(self, where: Any = None, fields: Any = None) -> Any:
        from ragpipe.store.base import Hit

        for n, path in enumerate(self.paths):
            yield Hit(str(n), 1.0, {"file_path": path, "heading_path": ["T"], "source_sha": "s"})


def test_matching_finds_what_a_scan_finds() -> None:
    from ragpipe.evaluation.golden import file_matches

    paths = ["docs/a.md", "x/docs/a.md", "xdocs/a.md", "a.md", "C:\\win\\docs\\a.md",
             "https://example.org/guide/install", "guide/install", "dir/", "b.md"]  # fmt: skip
    view = IndexView(_Listed(paths))  # type: ignore[arg-type]
    suffixes = ["a.md", "docs/a.md", "/docs/a.md", "win\\docs\\a.md", "install", "guide/install",
                "", "dir/", "B.md", "c.md", "https://example.org/guide/install"]  # fmt: skip
    for suffix in suffixes:
        scan = [p for p in sorted(paths) if file_matches(p, suffix)]
        assert view.matching(suffix) == view.matching(suffix) == scan, suffix
    assert view.matching("docs/a.md") == ["C:\\win\\docs\\a.md", "docs/a.md", "x/docs/a.md"]


def test_checking_1000_items_against_20000_files_takes_no_scan_per_target(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each target's files were found by testing every indexed file, three times per
    target: 1,000 items x 2 targets on 20,000 files took 15 s of CPU to check and 7.5 s
    more for the evidence (120 million path tests). Now a lookup by file name, then the
    suffix test on the files of that name only, once per target: counted, not timed."""
    from ragpipe.evaluation import check as check_module

    tested = 0
    matches = check_module.file_matches

    def counted(path: str, suffix: str) -> bool:
        nonlocal tested
        tested += 1
        return matches(path, suffix)

    monkeypatch.setattr(check_module, "file_matches", counted)
    paths = [f"corpus/d{i % 100}/doc{i}.md" for i in range(20_000)]
    golden_items = [GoldenItem(f"q{i}", f"query {i}", {f"doc{i * 7}.md": 1,
                               f"d{(i * 7 + 1) % 100}/doc{i * 7 + 1}.md": 2})
                    for i in range(1000)]  # fmt: skip
    golden = GoldenSet("big", golden_items)
    view = IndexView(_Listed(paths))  # type: ignore[arg-type]
    _, check = golden_for_index(golden, view, skip_unmatched=False, origin="a test", scope="file")
    found = evidence(golden, view)
    assert check.ok and check.targets == 2000
    assert found["q3"] == {"corpus/d21/doc21.md": "s", "corpus/d22/doc22.md": "s"}
    # One file of each name here: one path test per distinct target, however often asked.
    assert tested == 2000
