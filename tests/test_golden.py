"""Golden sets: validation with clear errors, suffix matching, BEIR import, the shipped set."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

import pytest

from ragpipe.errors import ConfigError
from ragpipe.evaluation.golden import (
    ChunkTarget,
    GoldenItem,
    GoldenSet,
    file_matches,
    import_beir,
    load_golden,
    save_golden,
)

REPO = Path(__file__).resolve().parents[1]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "golden.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_formats_and_shorthands(tmp_path: Path) -> None:
    golden = load_golden(_write(tmp_path, """
name: t
items:
  - id: a
    query: What is trig?
    relevance: {math/trig.md: 3, math/algebra.md: 0}
  - id: b
    query: Bread?
    expected_files: [bread.md, oven.md]
    chunks:
      - {file: bread.md, heading: Oven, grade: 2}
    expected_answer: Bake it.
"""))  # fmt: skip
    a, b = golden.items
    assert a.relevance == {"math/trig.md": 3, "math/algebra.md": 0}
    assert b.relevance == {"bread.md": 2, "oven.md": 1}  # a chunk target's higher grade
    assert b.chunks == (ChunkTarget("bread.md", heading="Oven", grade=2),)
    assert b.expected_answer == "Bake it."


def test_a_file_takes_the_highest_grade_of_its_targets_unless_relevance_grades_it(
    tmp_path: Path,
) -> None:
    """A grade-0 distractor first in a file used to give the file grade 0 (the first
    target's): file-level scores called the answer's file irrelevant."""
    golden = load_golden(_write(tmp_path, """
items:
  - id: q1
    query: How should I cite R?
    chunks:
      - {file: a.md, contains: see also, grade: 0}
      - {file: a.md, heading: Citing R, grade: 3}
      - {file: b.md, heading: Other, grade: 1}
  - id: q2
    query: Only one file
    chunks:
      - {file: a.md, contains: see also, grade: 0}
      - {file: a.md, heading: Citing R, grade: 3}
  - id: q3
    query: Graded by hand
    relevance: {a.md: 1}
    expected_files: [b.md]
    chunks:
      - {file: a.md, heading: Citing R, grade: 3}
      - {file: b.md, heading: Other, grade: 0}
"""))  # fmt: skip
    q1, q2, q3 = golden.items
    assert q1.relevance == {"a.md": 3, "b.md": 1}
    assert q2.relevance == {"a.md": 3}  # loads: its file is relevant
    assert q3.relevance == {"a.md": 1, "b.md": 1}  # relevance is the user's word


def test_a_target_names_a_graded_file_by_a_shorter_or_longer_suffix(tmp_path: Path) -> None:
    """relevance: {sample/R-FAQ.pdf: 3} and a chunk target in R-FAQ.pdf: the target's file was
    added as a second name, and the item refused at file level for a name never written
    (scored anyway, a perfect ranking got NDCG 0.613)."""
    golden = load_golden(_write(tmp_path, """
items:
  - id: q1
    query: How should I cite R?
    relevance: {sample/R-FAQ.pdf: 3}
    chunks: [{file: R-FAQ.pdf, heading: Citing R, grade: 3}]
  - id: q2
    query: Implied twice
    expected_files: [R-FAQ.pdf]
    chunks: [{file: sample/R-FAQ.pdf, heading: Citing R, grade: 2}, {file: Q-FAQ.pdf, heading: H}]
"""))  # fmt: skip
    q1, q2 = golden.items
    assert q1.relevance == {"sample/R-FAQ.pdf": 3}
    assert q2.relevance == {"R-FAQ.pdf": 2, "Q-FAQ.pdf": 1}  # not a suffix of R-FAQ.pdf
    assert [c.file for c in q2.chunks] == ["sample/R-FAQ.pdf", "Q-FAQ.pdf"]


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ("- {query: q, relevance: {a.md: 1}}", r"item 1: 'id' is missing"),
        ("- {id: x, relevance: {a.md: 1}}", r"\(id x\): 'query' must be a non-empty string"),
        ("- {id: x, query: q, relevance: {a.md: 5}}", r"relevance of 'a.md': grade 5 must be"),
        ("- {id: x, query: q, relevance: {a.md: 0}}", r"no relevant file \(grade > 0\)"),
        ("- {id: x, query: q, expected_files: [a], colour: red}", r"unknown keys \['colour'\]"),
        ("- {id: x, query: q, chunks: [{file: a.md}]}", r"one of 'contains' or 'heading'"),
        ("- {id: x, query: q, chunks: [{file: a.md, heading: 2.7}]}",
         r"'heading' must be text, got 2\.7; quote it \(heading: \"2\.7\"\)"),
        ("- {id: x, query: q, chunks: [{file: a.md, contains: 2020}]}", r"'contains' must be text"),
        ("- {id: x, query: q, answerable: maybe}", r"'answerable' must be true or false"),
        ("- {id: x, query: q, answerable: false, expected_files: [a.md]}",
         r"'answerable: false' means the corpus holds no answer; remove expected_files"),
        ("- {id: x, query: q, expected_files: [a]}\n- {id: x, query: r, expected_files: [a]}",
         r"item 2 \(id x\): duplicate id"),
        # One target twice: its second chunk credited as relevant (MAP 0.833 for 0.75 by
        # hand), its grade the last one listed (the review's attack).
        ("- {id: x, query: q, chunks: [{file: a.md, heading: H, grade: 3}, "
         "{file: b.md, heading: G}, {file: a.md, heading: H, grade: 1}]}",
         r"\(id x\), chunk target 3: the same target as chunk target 1 \(a\.md#heading=H; "
         r"grades 3 and 1\): keep one, with the grade you mean"),
        ("- {id: x, query: q, chunks: [{file: a.md, contains: 'two  words'}, "
         "{file: a.md, contains: 'two words'}]}",
         r"chunk target 2: the same target as chunk target 1"),  # whitespace as matches reads it
        # One file under two suffixes: two chunks of one section credited (P@5 0.4).
        ("- {id: x, query: q, chunks: [{file: science/p.md, heading: P}, "
         "{file: p.md, heading: P}]}",
         r"chunk target 2: the same target as chunk target 1 \(p\.md#heading=P"),
        # Every answer scored F1 0 against it, as a value (the attack review).
        ("- {id: x, query: q, expected_files: [a], expected_answer: '   '}",
         r"'expected_answer' '   ' has no word to score an answer against \(blank, or only "
         r"punctuation and articles\); write the answer or remove the key"),
        ("- {id: x, query: q, expected_files: [a], expected_answer: 'The.'}",
         r"'expected_answer' 'The\.' has no word"),
        # Found by the attack review: each loaded, and scored something else.
        ("- {id: x, query: q, chunks: [{file: a.md, contains: '   '}]}",
         r"chunk target 1: 'contains' is blank; it would match every chunk"),
        ("- {id: x, query: q, chunks: [{file: ' ', heading: H}]}", r"'file' is blank"),
        ("- {id: x, query: q, expected_files: R-FAQ.pdf}",  # the letters R, -, F, ...
         r"'expected_files' must be a list of file suffixes, got 'R-FAQ\.pdf'"),
        ("- {id: x, query: q, expected_files: {R-FAQ.pdf: 3}}",  # grade 1, silently
         r"'expected_files' must be a list .*\(grades go under 'relevance'\)"),
        ("- {id: x, query: q, chunks: {file: a.md, heading: H}}", r"'chunks' must be a list"),
        ("- {id: 0, query: q, expected_files: [a]}\n- {id: false, query: q, expected_files: [a]}",
         r"item 2: 'id' must be text or a number, got False"),
        ("- {id: [a, b], query: q, expected_files: [a]}", r"'id' must be text or a number"),
        # A misspelt key in a chunk target was read as absent: garde: 3 loaded as grade 1
        # (the attack review's 07-grade-typo.yaml, and `eval check` said ok).
        ("- {id: x, query: q, chunks: [{file: a.md, heading: H, garde: 3}]}",
         r"\(id x\), chunk target 1: unknown keys \['garde'\] \('garde' looks like 'grade'; "
         r"allowed: contains, file, grade, heading\)$"),
        ("- {id: x, query: q, chunks: [{fiel: a.md, heading: H}]}",  # named before 'needs file'
         r"chunk target 1: unknown keys \['fiel'\] \('fiel' looks like 'file'; allowed"),
        ("- {id: x, query: q, chunks: [{file: a.md, contains: t, weight: 2}]}",
         r"chunk target 1: unknown keys \['weight'\] \(allowed: contains, file, grade, "
         r"heading\)$"),
        ("- {id: x, query: q, expected_files: [a], querry: r}",
         r"item 1: unknown keys \['querry'\] \('querry' looks like 'query'; allowed"),
        ("- {id: x, query: q, expected_files: [a], provenance: {methd: heading}}",
         r"\(id x\), provenance: unknown keys \['methd'\] \('methd' looks like 'method'; "
         r"allowed: file, method, model, point_id, source_sha\)$"),
        ("- {id: x, query: q, expected_files: [a], provenance: {method: hand}}",
         r"provenance 'method' is 'hand'; it must be one of heading, llm"),
        ("- {id: x, query: q, expected_files: [a], provenance: heading}",
         r"'provenance' must be a mapping \(file, method, model, point_id, source_sha\), got "
         r"'heading'"),
    ],
)  # fmt: skip
def test_validation_names_the_item_and_the_fix(tmp_path: Path, items: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_golden(_write(tmp_path, f"items:\n{items}\n"))


def test_a_misspelt_key_of_the_file_is_refused(tmp_path: Path) -> None:
    """'nmae' was ignored: the set took its file's name, and its reports and trend line
    another name than the one written."""
    with pytest.raises(
        ConfigError,
        match=r"golden set .*golden\.yaml: unknown keys \['nmae'\] "
        r"\('nmae' looks like 'name'; allowed: description, items, name; keys starting with "
        r"'x-' are free, to hold YAML anchors\)$",
    ):
        load_golden(_write(tmp_path, "nmae: faq\nitems:\n- {id: x, query: q, "
                                     "expected_files: [a]}\n"))  # fmt: skip


def test_a_drafted_items_provenance_loads(tmp_path: Path) -> None:
    golden = load_golden(_write(tmp_path, """
items:
  - id: heading-1
    query: How do I upgrade the client?
    chunks: [{file: docs/install.md, heading: "How do I upgrade the client?", grade: 3}]
    draft: true
    provenance: {method: heading, file: /c/docs/install.md, point_id: 0d4c, source_sha: 9b1e}
  - id: llm-2
    query: Where are the logs?
    chunks: [{file: docs/logs.md, contains: kept in /var/log, grade: 3}]
    draft: true
    provenance: {method: llm, file: /c/docs/logs.md, point_id: 1a, source_sha: 2b, model: m}
"""))  # fmt: skip
    assert [i.chunks[0].grade for i in golden.items] == [3, 3]


def test_items_asking_one_question_are_named() -> None:
    items = [
        GoldenItem("a", "Where are the logs?", {"x.md": 1}),
        GoldenItem("b", "Capital of France?", {}, answerable=False),
        GoldenItem("c", "where are  the LOGS?", {"y.md": 1}),
        GoldenItem("d", "Where are the logs kept?", {"x.md": 1}),
        GoldenItem("e", "Where are the\tlogs?", {"z.md": 2}),
        GoldenItem("f", "capital of france?", {}, answerable=False),
    ]
    assert GoldenSet("g", items).duplicate_queries() == [
        "items a, c and e ask the same question ('Where are the logs?'): it weighs 3 times "
        "in every mean; merge them, or reword one",
        "items b and f ask the same question ('Capital of France?'): it weighs 2 times in "
        "every mean; merge them, or reword one",
    ]
    assert GoldenSet("g", items[:2]).duplicate_queries() == []


def test_unanswerable_items_load_and_save(tmp_path: Path) -> None:
    golden = load_golden(_write(tmp_path, "items:\n- {id: u, query: 'Capital of France?', "
                                          "answerable: false}\n- {id: a, query: q, "
                                          "expected_files: [a.md]}\n"))  # fmt: skip
    unanswerable, answerable = golden.items
    assert not unanswerable.answerable and unanswerable.relevance == {}
    assert golden.answerable == [answerable]
    save_golden(golden, tmp_path / "again.yaml")
    assert load_golden(tmp_path / "again.yaml").items == golden.items


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_golden(tmp_path / "none.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_golden(_write(tmp_path, "items: [\n"))


def test_suffix_matching_on_component_boundaries() -> None:
    assert file_matches("docs/math/trig.md", "math/trig.md")
    assert file_matches("math/trig.md", "math/trig.md")
    assert not file_matches("docs/xmath/trig.md", "math/trig.md")
    target = ChunkTarget("trig.md", contains="sine  of\nan angle")
    assert target.matches({"file_path": "d/trig.md", "text": "The sine of an angle is..."})
    assert not target.matches({"file_path": "d/trig.md", "text": "cosine only"})


def test_beir_import(tmp_path: Path) -> None:
    beir = tmp_path / "scifact-mini"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text(
        "\n".join(json.dumps(d) for d in [
            {"_id": "d1", "title": "Vitamin D", "text": "Vitamin D helps bones."},
            {"_id": "d/2", "title": "", "text": "Unrelated text."},
        ]) + "\n", encoding="utf-8")  # fmt: skip
    (beir / "queries.jsonl").write_text(
        json.dumps({"_id": "q1", "text": "Does vitamin D help bones?"}) + "\n"
        + json.dumps({"_id": "q2", "text": "no judgements"}) + "\n", encoding="utf-8")  # fmt: skip
    (beir / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td/2\t0\n", encoding="utf-8"
    )
    golden = import_beir(beir, tmp_path / "docs")
    assert [i.id for i in golden.items] == ["q1"]  # q2 has no relevant document
    assert golden.items[0].relevance == {"d1.md": 1, "d_2.md": 0}
    assert (tmp_path / "docs" / "d1.md").read_text() == "# Vitamin D\n\nVitamin D helps bones.\n"
    with pytest.raises(ConfigError, match=r"qrels/dev\.tsv is missing"):
        import_beir(beir, tmp_path / "docs", split="dev")

    from typer.testing import CliRunner

    from flows.cli import app

    out = tmp_path / "beir.yaml"
    docs = str(tmp_path / "cli-docs")
    args = ["eval", "import-beir", str(beir), "--corpus-out", docs, "--golden-out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "wrote 2 documents" in result.output and "1 queries" in result.output
    assert load_golden(out).items[0].relevance == {"d1.md": 1, "d_2.md": 0}


def _beir(root: Path, corpus: list[str], queries: list[str], qrels: str) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("\n".join(corpus) + "\n", encoding="utf-8")
    (root / "queries.jsonl").write_text("\n".join(queries) + "\n", encoding="utf-8")
    (root / "qrels" / "test.tsv").write_text(qrels, encoding="utf-8")
    return root


GOOD_CORPUS = [json.dumps({"_id": "d1", "title": "Bones", "text": "Vitamin D helps bones."})]
GOOD_QUERIES = [json.dumps({"_id": "q1", "text": "Does vitamin D help bones?"})]
GOOD_QRELS = "query-id\tcorpus-id\tscore\nq1\td1\t1\n"


@pytest.mark.parametrize(
    ("part", "bad", "message"),
    [
        ("queries", '{"_id": "q2"}',
         r"queries\.jsonl:2: no 'text'; each line must be a JSON object with '_id' and 'text'"),
        ("queries", "not json", r"queries\.jsonl:2: not JSON \(Expecting value\)"),
        # The review: a null text became the query 'None', an empty one ''.
        # (a query the qrels use: the file holds every split's queries, and an unused one is
        # never read)
        ("used query", '{"_id": "q2", "text": null}',
         r"queries\.jsonl:2: 'text' is null; a query's text must be a non-empty string"),
        ("used query", '{"_id": "q2", "text": "  "}', r"queries\.jsonl:2: 'text' is \"  \";"),
        ("corpus", '{"_id": null, "text": "x"}',
         r"corpus\.jsonl:2: '_id' is null; it must be a non-empty string or a whole number"),
        ("qrels", "q1\td1\thigh",
         r"test\.tsv:3: score 'high' is not a whole number; each line is query-id, corpus-id "
         r"and a whole-number score, separated by tabs"),
        ("qrels", "q1\td1", r"test\.tsv:3: 2 field\(s\); each line is query-id"),
        ("corpus", '["d2"]', r"corpus\.jsonl:2: not a JSON object; each line must be a JSON "
         r"object with '_id'"),
    ],
)  # fmt: skip
def test_a_bad_beir_line_writes_nothing(tmp_path: Path, part: str, bad: str, message: str) -> None:
    """A review found: the corpus was written before the queries and qrels were read, so
    a queries line without 'text' or a score that is not a number ended in a traceback
    (exit 1) with the documents already written; and --golden-out was written in place."""
    beir = _beir(
        tmp_path / "beir",
        GOOD_CORPUS + ([bad] if part == "corpus" else []),
        GOOD_QUERIES + ([bad] if part in ("queries", "used query") else []),
        GOOD_QRELS
        + (bad + "\n" if part == "qrels" else "q2\td1\t1\n" if part == "used query" else ""),
    )
    with pytest.raises(ConfigError, match=message):
        import_beir(beir, tmp_path / "docs")
    assert not (tmp_path / "docs").exists()

    from typer.testing import CliRunner

    from flows.cli import app

    golden_out = tmp_path / "beir.yaml"
    golden_out.write_text("name: kept\n", encoding="utf-8")  # a set from an earlier import
    args = ["eval", "import-beir", str(beir), "--corpus-out", str(tmp_path / "cli"),
            "--golden-out", str(golden_out)]  # fmt: skip
    result = CliRunner().invoke(app, args, terminal_width=400)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and len(result.output.splitlines()) == 1
    assert re.search(message, result.output), result.output
    assert not (tmp_path / "cli").exists()
    assert golden_out.read_text(encoding="utf-8") == "name: kept\n"


def test_a_blank_query_of_another_split_does_not_stop_the_import(tmp_path: Path) -> None:
    # queries.jsonl holds every split's queries: a blank one the chosen qrels never use is
    # not this import's to refuse.
    beir = _beir(tmp_path / "beir", GOOD_CORPUS, [*GOOD_QUERIES, '{"_id": "q9", "text": ""}'],
                 GOOD_QRELS)  # fmt: skip
    golden = import_beir(beir, tmp_path / "docs")
    assert [(i.id, i.query) for i in golden.items] == [("q1", "Does vitamin D help bones?")]


def test_a_golden_set_is_saved_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """save_golden wrote over the set in place: a full disk or an interrupt mid-write left
    a cut-off set that loads with fewer items and no word of the rest."""
    import errno
    import os

    from ragpipe.errors import DiskFull

    beir = _beir(tmp_path / "beir", GOOD_CORPUS, GOOD_QUERIES, GOOD_QRELS)
    golden = import_beir(beir, tmp_path / "docs")
    path = tmp_path / "golden.yaml"
    save_golden(golden, path)
    before = path.read_bytes()

    def full(fd: int) -> None:  # the new set's bytes are written, not yet on disk
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(DiskFull, match="no space left to write"):
        save_golden(dataclasses.replace(golden, name="changed"), path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir() if p.is_file()] == [
        "golden.yaml"
    ]


def test_the_shipped_dev_set_is_the_faq_and_rebuilds_identically(tmp_path: Path) -> None:
    import subprocess
    import sys

    shipped = REPO / "eval" / "golden" / "r-faq-dev.yaml"
    golden = load_golden(shipped)
    assert len(golden.items) >= 60
    assert all(i.chunks and i.chunks[0].file == "R-FAQ.pdf" for i in golden.items)
    item = next(i for i in golden.items if i.id == "faq-2.7")
    assert item.query == "What documentation exists for R?"
    assert item.chunks[0].heading == "2.7 What documentation exists for R?"
    out = tmp_path / "rebuilt.yaml"
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_golden_rfaq.py"), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    assert out.read_text(encoding="utf-8") == shipped.read_text(encoding="utf-8")


def test_a_sample_gives_every_item_the_same_chance_and_each_stratum_its_share() -> None:
    from ragpipe.evaluation.golden import GoldenItem, stratified_sample

    items = [GoldenItem(f"a{i}", "q", {"a.md": 1}) for i in range(6)]
    items += [GoldenItem(f"b{i}", "q", {"b.md": 1}) for i in range(3)]
    items += [GoldenItem(f"x{i}", "q", {}, answerable=False) for i in range(2)]
    order = [i.id for i in items]
    chosen: dict[str, int] = dict.fromkeys(order, 0)
    for seed in range(2000):
        ids = [item.id for item in stratified_sample(items, 5, seed=seed)]
        assert len(set(ids)) == 5 and ids == sorted(ids, key=order.index)  # golden order
        # Each stratum gets its share of 5 of 11, rounded down or up: a 6 x 5/11 = 2.7,
        # b 1.4, unanswerable 0.9.
        counts = {k: [i[0] for i in ids].count(k) for k in "abx"}
        assert counts["a"] in (2, 3) and counts["b"] in (1, 2) and counts["x"] in (0, 1)
        for i in ids:
            chosen[i] += 1
    # Every item is in 5 of 11 samples (0.455; binomial sd over 2000 seeds: 0.011).
    assert all(abs(c / 2000 - 5 / 11) < 0.04 for c in chosen.values()), chosen
    sample = stratified_sample(items, 5, seed=7)
    assert stratified_sample(items, 5, seed=7) == sample  # the same items for the same seed
    assert stratified_sample(items, 50, seed=7) == items  # asking for more keeps all


def test_a_sample_mean_estimates_the_sets_mean_not_the_strata_count() -> None:
    # The attack review's set: 30 questions on one file (F1 0.8 each), 5 on five small
    # files (0.2 each), 5 unanswerable. One item per stratum in turn took 2 of the 30 and
    # all 5 small ones: a mean of 0.371 for a set whose answerable mean is 0.714.
    from ragpipe.evaluation.golden import GoldenItem, stratified_sample

    items = [GoldenItem(f"big{i}", "q", {"big.md": 1}) for i in range(30)]
    items += [GoldenItem(f"small{i}", "q", {f"s{i}.md": 1}) for i in range(5)]
    items += [GoldenItem(f"none{i}", "q", {}, answerable=False) for i in range(5)]
    f1 = {i.id: 0.8 if i.id.startswith("big") else 0.2 for i in items if i.answerable}
    means = []
    for seed in range(400):
        sample = stratified_sample(items, 10, seed=seed)
        assert sum(i.id.startswith("big") for i in sample) in (7, 8)  # 30 x 10/40 = 7.5
        scored = [f1[i.id] for i in sample if i.answerable]
        means.append(sum(scored) / len(scored))
    hand = (30 * 0.8 + 5 * 0.2) / 35  # 0.714
    assert abs(sum(means) / len(means) - hand) < 0.02


def test_an_expected_answer_is_stripped(tmp_path: Path) -> None:
    golden = load_golden(_write(tmp_path, "items:\n- {id: x, query: q, expected_files: [a], "
                                          "expected_answer: '  In 1998.  '}\n"))  # fmt: skip
    assert golden.items[0].expected_answer == "In 1998."


def test_a_long_beir_id_gets_a_file_name_a_file_system_holds(tmp_path: Path) -> None:
    """A 300-character id crashed the import (File name too long) after writing documents."""
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    long_id = "é" * 300
    (beir / "corpus.jsonl").write_text(json.dumps({"_id": long_id, "text": "Long."}) + "\n")
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q", "text": "long?"}) + "\n")
    (beir / "qrels" / "test.tsv").write_text(f"q\t{long_id}\t1\n")
    golden = import_beir(beir, tmp_path / "docs")
    ((name, grade),) = golden.items[0].relevance.items()
    assert grade == 1 and len(name.encode()) <= 204 and name.startswith("é" * 94)
    assert name.endswith("-" + hashlib.sha256(long_id.encode()).hexdigest()[:10] + ".md")
    assert (tmp_path / "docs" / name).read_text() == "Long.\n"
    # Again into the same folder: its own documents are rewritten; another dataset's file
    # there would be indexed with it, a distractor no qrel knows: refused, nothing written.
    assert import_beir(beir, tmp_path / "docs").items[0].relevance == {name: 1}
    (tmp_path / "docs" / ".DS_Store").write_bytes(b"\0")  # hidden: never indexed, allowed
    assert import_beir(beir, tmp_path / "docs").items[0].relevance == {name: 1}
    (tmp_path / "docs" / "other.md").write_text("Another dataset's document.\n")
    (tmp_path / "docs" / name).unlink()
    with pytest.raises(ConfigError, match=r"holds 1 file\(s\) that are not this dataset's "
                       r"documents \(other\.md\)"):  # fmt: skip
        import_beir(beir, tmp_path / "docs")
    assert not (tmp_path / "docs" / name).exists()


def test_beir_import_never_overwrites_a_document_and_counts_what_it_drops(tmp_path: Path) -> None:
    # The attack review: "doc:1" and "doc_1" both became doc_1.md (the cats text lost under
    # the rockets one), and qrels naming a missing document vanished in silence, shrinking
    # a query's relevant set (its recall rose).
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    docs = [{"_id": "doc_1", "title": "Rockets", "text": "Rockets burn fuel."},
            {"_id": "doc:1", "title": "Cats", "text": "Cats purr."},
            {"_id": "Doc_1", "title": "Moons", "text": "Moons orbit."}]  # fmt: skip
    (beir / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    (beir / "queries.jsonl").write_text("\n".join(json.dumps({"_id": q, "text": t}) for q, t in [
        ("q1", "why do cats purr"), ("q2", "how do rockets fly"), ("q3", "moons and cats"),
        ("q4", "unjudged"), ("q5", "another split's")]) + "\n")  # fmt: skip
    # Graded twice: q1's 1 then 0 (the last row won: q1 was dropped), q2's 1 then 5 (read
    # as 3, in silence).
    (beir / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\tdoc:1\t1\nq2\tdoc_1\t1\nq3\tDoc_1\t1\nq3\tgone\t2\n"
        "q3\tgone-too\t0\nq9\tdoc_1\t1\nq1\tdoc:1\t0\nq2\tdoc_1\t5\nq4\tdoc_1\t0\n"
    )
    golden = import_beir(beir, tmp_path / "docs")
    cats = "doc_1-" + hashlib.sha256(b"doc:1").hexdigest()[:10] + ".md"
    moons = "Doc_1-" + hashlib.sha256(b"Doc_1").hexdigest()[:10] + ".md"  # case-blind clash
    by_id = {i.id: i.relevance for i in golden.items}
    assert by_id == {"q1": {cats: 1}, "q2": {"doc_1.md": 3}, "q3": {moons: 1}}
    assert (tmp_path / "docs" / "doc_1.md").read_text() == "# Rockets\n\nRockets burn fuel.\n"
    assert (tmp_path / "docs" / cats).read_text() == "# Cats\n\nCats purr.\n"
    assert golden.notes == [
        "2 document id(s) would have shared a file name with another (after replacing "
        "characters a file name cannot hold): their files end in a hash of the id",
        "1 relevant qrel(s) of 1 query(ies) name documents not in corpus.jsonl: left out, so 1 "
        "kept query(ies) have fewer relevant documents than the dataset says (their recall is "
        "not comparable with published numbers)",
        "1 qrel(s) name queries not in queries.jsonl: left out",
        "1 qrel(s) grade above 3, read as 3: graded metrics (NDCG) are not comparable with "
        "published numbers",
        "2 (query, document) pair(s) are graded twice, differently, in test.tsv: the higher "
        "grade kept",
        # q5 is another split's, never judged here: not counted (it was, as dropped).
        "1 of 4 queries judged in test.tsv have no relevant document (or none left): not in "
        "the golden set",
    ]
    from typer.testing import CliRunner

    from flows.cli import app

    args = ["eval", "import-beir", str(beir), "--corpus-out", str(tmp_path / "cli"),
            "--golden-out", str(tmp_path / "beir.yaml")]  # fmt: skip
    shown = CliRunner().invoke(app, args, terminal_width=400)
    assert shown.exit_code == 0, shown.output
    assert "wrote 3 documents" in shown.output
    assert "note: 1 relevant qrel(s) of 1 query(ies) name documents not in corpus.jsonl" in (
        shown.output
    )
    (beir / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in [*docs, docs[0]]) + "\n")
    with pytest.raises(ConfigError, match=r"corpus\.jsonl:4: document id 'doc_1' repeats"):
        import_beir(beir, tmp_path / "again")
