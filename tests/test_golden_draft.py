"""`ragpipe golden draft`: question headings and model-written questions drafted from a real
index, filtered, marked as drafts that evaluations refuse until reviewed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from ragpipe.errors import ConfigError, StageError
from ragpipe.evaluation.draft import (
    Drafted,
    Passage,
    copied_run,
    heading_items,
    llm_items,
    overlap,
    stratified,
    unique_suffixes,
)
from ragpipe.models.llm import Completion

runner = CliRunner()


def _passage(file: str, index: int, headings: tuple[str, ...] = (), text: str = "") -> Passage:
    return Passage(f"id-{file}-{index}", f"/docs/{file}", file, headings, index, text, "sha")


def test_the_filters_measure_what_they_say() -> None:
    # "restore the database from last night" is 6 consecutive words of the passage.
    passage = "To restore the database from last night's copy, stop the service first."
    assert copied_run("How do I restore the database from last night?", passage) == 6
    assert copied_run("Where is yesterday data kept?", passage) == 0
    # {how, do, i, bake, bread} vs {how, do, i, bake, a, loaf}: 4 shared of 7.
    assert overlap("How do I bake bread?", "How do I bake a loaf?") == pytest.approx(4 / 7)
    # A file is named by the shortest end of its path no other file shares; URLs too.
    paths = ["/srv/docs/api/README.md", "/srv/docs/ops/README.md", "/srv/docs/install.md",
             "https://example.org/guide/install", "docs/setup.md"]  # fmt: skip
    assert unique_suffixes(paths) == {
        "/srv/docs/api/README.md": "api/README.md",
        "/srv/docs/ops/README.md": "ops/README.md",
        "/srv/docs/install.md": "install.md",
        "https://example.org/guide/install": "install",
        "docs/setup.md": "setup.md",
    }


def test_a_drafted_span_names_its_own_chunk_only() -> None:
    """The first 80 characters of the longest line were the span: a paragraph cut between
    two chunks starts the second inside the overlap, and every part of a table repeats its
    header row, so a grade-3 target credited the chunk before (or every part of the table)
    as a perfect hit, and `eval check` said "ok"."""
    from ragpipe.evaluation.draft import _span
    from ragpipe.evaluation.golden import ChunkTarget

    paragraph = " ".join(f"word{i}" for i in range(60))
    first = _passage("guide.md", 0, (), "Intro line.\n\n" + paragraph[:300])
    second = _passage("guide.md", 1, (), paragraph[150:])  # starts in the overlap
    head = "| Setting name | Default value | What the setting controls in the client |"
    rows = [f"| option_{i} | {i * 10} | controls the {i}th part of the client |" for i in range(6)]
    table = [_passage("guide.md", 2 + i, (), "\n".join([head, "|---|---|---|", *rows[2 * i :
             2 * i + 2]])) for i in range(3)]  # fmt: skip
    chunks = [first, second, *table]
    for chunk in chunks:
        span = _span(chunk, chunks)
        assert span is not None and len(span) <= 80
        matched = [c.chunk_index for c in chunks
                   if ChunkTarget("guide.md", contains=span).matches(
                       {"file_path": c.file_path, "text": c.text})]  # fmt: skip
        assert matched == [chunk.chunk_index], (span, matched)
    assert not _span(second, chunks).startswith(second.text[:20])  # type: ignore[union-attr]
    assert _span(table[0], chunks) == "| option_1 | 10 | controls the 1th part of the client |"
    # A one-line paragraph cut at 1,000 characters with 150 of overlap: the next chunk's
    # first 12 words all lie in the overlap (the review: 7 of 17 debfaq chunks dropped).
    long = " ".join(f"w{i}" for i in range(400))
    cut = [_passage("long.md", 0, (), long[:1000]), _passage("long.md", 1, (), long[850:1850])]
    span = _span(cut[1], cut)
    assert span is not None and span not in cut[0].text and span in cut[1].text
    twin = _passage("guide.md", 9, (), second.text)  # the same text twice: nothing is its own
    assert _span(twin, [*chunks, twin]) is None


def test_question_headings_become_items_once_per_file_and_heading() -> None:
    chunks = [
        _passage("faq.md", 0, ("FAQ", "2.7 What documentation exists for R?"),
                 "### 2.7 What documentation exists for R?\n\nOnline documentation exists. "
                 "It covers all functions. More is in print."),
        _passage("faq.md", 1, ("FAQ", "2.7 What documentation exists for R?"), "more"),
        _passage("faq.md", 2, ("FAQ", "Installation"), "Not a question heading."),
        _passage("faq.md", 3, ("FAQ", "Why?"), "Too short to ask."),
    ]  # fmt: skip
    drafted = Drafted()
    heading_items(chunks, drafted)
    (item,) = drafted.items
    assert item["query"] == "What documentation exists for R?"
    assert item["chunks"] == [
        {"file": "faq.md", "heading": "2.7 What documentation exists for R?", "grade": 3}
    ]
    assert item["expected_answer"] == "Online documentation exists. It covers all functions."
    assert item["draft"] is True and item["provenance"]["method"] == "heading"
    # The same question heading in two files: one item targeting both.
    twice = Drafted()
    other = _passage("other/faq.md", 0, ("2.7 What documentation exists for R?",), "Docs.")
    heading_items([chunks[0], other], twice)
    (merged,) = twice.items
    assert merged["relevance"] == {"faq.md": 3, "other/faq.md": 3}


class _Scripted:
    """An LLM whose replies are written in advance (the filters' logic is under test, not
    a model): a question per chunk, then a check, or an error."""

    name = "scripted"
    takes_grammar = True

    def __init__(self, replies: list[str | Exception]) -> None:
        self.replies = replies

    def chat(self, messages: Any, **kwargs: Any) -> Completion:
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return Completion(reply, 0, 0, self.name, 0.0)

    def count_tokens(self, text: str) -> int:
        return len(text.split())


def test_model_questions_are_kept_or_dropped_with_the_reason() -> None:
    prose = (
        "Download the installer from the releases page, run it and sign in with your "
        "team account; it needs two hundred megabytes of disk and no admin rights."
    )
    chunks = [_passage(f"{k}.md", 0, (), prose) for k in "abcdefg"]
    ok = '{"question": "%s", "answer": "Run the installer and sign in."}'
    replies: list[str | Exception] = [
        ok % "Which rights does the client setup need?", '{"answers": true}',  # kept
        ok % "Which rights does the client setup need please?",  # near-duplicate of the first
        ok % "Download the installer from the releases page?",  # copies 7 words
        ok % "Tell me about installing",  # not a question
        ok % "How much space does the client take on disk?", '{"answers": false}',  # check
        StageError("the model server answered 500"),  # a failure: counted, the rest go on
        "not json",  # unreadable
    ]  # fmt: skip
    drafted = Drafted()
    llm_items(chunks, _Scripted(replies), 7, 0, drafted)  # type: ignore[arg-type]
    assert [i["query"] for i in drafted.items] == ["Which rights does the client setup need?"]
    (kept,) = drafted.items
    assert kept["chunks"][0]["contains"] in prose and kept["draft"] is True
    assert kept["provenance"]["model"] == "scripted"
    assert kept["expected_answer"].startswith("Download the installer")
    assert drafted.asked == 7
    assert drafted.dropped == {
        "near-duplicate of a kept question": 1,
        "copies 6+ words of its chunk": 1,
        "not a question": 1,
        "its chunk does not answer it (model's check)": 1,
        "the model failed (StageError)": 1,
        "the model wrote no question": 1,
    }


def test_the_sample_takes_files_in_turn_and_each_file_start_middle_and_end() -> None:
    prose = " ".join(["word"] * 30)
    chunks = [_passage(f, i, (), prose) for f in ("a.md", "b.md") for i in range(6)]
    chunks.append(_passage("c.md", 0, (), "too short"))  # under 25 words: never asked about
    picked = stratified(chunks, 6, seed=1)
    assert len(picked) == 6
    assert {p.target for p in picked} == {"a.md", "b.md"}
    for file in ("a.md", "b.md"):  # each file's thirds: chunks 0-1, 2-3, 4-5
        thirds = sorted(p.chunk_index // 2 for p in picked if p.target == file)
        assert thirds == [0, 1, 2]
    assert stratified(chunks, 6, seed=1) == picked  # seeded
    # More files than questions: each file starts at a different third, so the sample
    # still spans starts, middles and ends (30 files of 9 chunks, 20 questions: 7/7/6).
    many = [_passage(f"f{k}.md", i, (), prose) for k in range(30) for i in range(9)]
    thirds = [p.chunk_index // 3 for p in stratified(many, 20, seed=0)]
    assert sorted(thirds.count(t) for t in (0, 1, 2)) == [6, 7, 7]


@pytest.mark.parametrize("stop", ["interrupt", "full disk"])
def test_a_draft_is_written_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop: str
) -> None:
    """A review found: the draft was opened with "x" and written in place, so a Ctrl-C or a
    full disk mid-write left an empty or cut-off file, which then loaded with its last
    items no longer marked draft (and blocked the name for the next draft)."""
    import errno
    import os

    from ragpipe.errors import DiskFull
    from ragpipe.evaluation.draft import write_draft

    golden = {"name": "d", "description": "DRAFT", "items": [
        {"id": f"draft-{i}", "query": f"How do I do thing {i}?",
         "relevance": {"a.md": 3}, "draft": True} for i in range(3)]}  # fmt: skip
    out = tmp_path / "eval" / "draft.yaml"
    assert write_draft(golden, out) == out
    assert yaml.safe_load(out.read_text("utf-8")) == golden
    written: list[Path] = []
    beside = write_draft(golden, out, written)  # never over a file: the draft goes beside it
    assert beside == out.with_name(f"draft-{os.getpid()}.yaml") and out.read_bytes() == (
        beside.read_bytes()
    )
    # What the CLI names when stopped: the file this draft wrote, not the one it found
    # (the review: another process's draft.yaml was said to be this one's).
    assert written == [beside]

    def stopped(fd: int) -> None:  # the draft's bytes are written, not yet on disk
        if stop == "interrupt":
            raise KeyboardInterrupt
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", stopped)
    fresh = tmp_path / "eval" / "fresh.yaml"
    with pytest.raises(KeyboardInterrupt if stop == "interrupt" else DiskFull):
        write_draft(golden, fresh, written)
    assert written == [beside]  # nothing more was written
    assert sorted(p.name for p in fresh.parent.iterdir()) == sorted([out.name, beside.name])


FAQ = """# Database guide

## How do I restore the database?
Stop the service, copy the nightly dump back into the data folder and start the service again.
The restore takes about ten minutes for a database of fifty gigabytes.

## How often are backups taken?
A full backup runs every night at two o'clock and the last fourteen are kept. Incremental
backups run every hour between the full ones.

## Monitoring
Alerts go to the on-call engineer when the replication lag passes thirty seconds.
"""


def _index(tmp_path: Path) -> str:
    from ragpipe.config import RagpipeConfig
    from ragpipe.ingest.pipeline import run_ingest

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "db.md").write_text(FAQ, encoding="utf-8")
    config: dict[str, Any] = {
        "discover": {"roots": [str(tmp_path / "docs")]},
        "embed": {"provider": "onnx"},
        "store": {"path": str(tmp_path / "store")},
        "paths": {"work_dir": str(tmp_path / "work")},
        "eval": {"reports_dir": str(tmp_path / "reports"), "granularity": "chunk"},
    }
    assert run_ingest(RagpipeConfig.model_validate(config)).failed == 0
    path = tmp_path / "ragpipe.yaml"
    path.write_text(json.dumps(config), encoding="utf-8")
    return str(path)


@pytest.mark.integration
def test_a_heading_draft_is_refused_by_evals_until_reviewed(tmp_path: Path) -> None:
    config = _index(tmp_path)
    out = tmp_path / "draft.yaml"
    made = runner.invoke(app, ["golden", "draft", "--config", config, "--out", str(out),
                               "--sample", "0"])  # fmt: skip
    assert made.exit_code == 0, made.output
    assert "2 question headings, 0 of 0 model questions kept" in made.output
    # A heading item asks its chunk's first line: said when drafted, and in the file.
    flat = " ".join(made.output.split())
    note = ("question-heading items test lexical matching only: each asks its section's "
            "heading, the first line of the chunk it targets")  # fmt: skip
    assert f"note: the 2 {note}" in flat
    assert f"The {note}" in yaml.safe_load(out.read_text(encoding="utf-8"))["description"]
    items = yaml.safe_load(out.read_text(encoding="utf-8"))["items"]
    assert [(i["query"], i["chunks"][0]["heading"]) for i in items] == [
        ("How do I restore the database?", "How do I restore the database?"),
        ("How often are backups taken?", "How often are backups taken?"),
    ]
    assert items[0]["relevance"] == {"db.md": 3}
    assert items[0]["expected_answer"] == (
        "Stop the service, copy the nightly dump back into the data folder and start the "
        "service again. The restore takes about ten minutes for a database of fifty gigabytes."
    )
    # Never over a file.
    again = runner.invoke(app, ["golden", "draft", "--config", config, "--out", str(out)])
    assert again.exit_code == 2 and "exists" in again.output
    # eval check reviews drafts; evaluations refuse them, or take them when told.
    check = runner.invoke(app, ["eval", "check", str(out), "--config", config])
    assert check.exit_code == 0, check.output
    assert "2 items are drafts" in check.output and "every target matches" in check.output
    refused = runner.invoke(app, ["eval", "retrieval", "--config", config, "--golden", str(out)])
    assert refused.exit_code == 2 and "2 of 2 items are drafts not yet reviewed" in refused.output
    taken = runner.invoke(app, ["eval", "retrieval", "--config", config, "--golden", str(out),
                                "--allow-draft"])  # fmt: skip
    assert taken.exit_code == 0, taken.output
    # The run says it scored drafts: in its warnings and in its scope (only a log line did).
    (drafted,) = (tmp_path / "reports").glob("*/summary.json")
    said = json.loads(drafted.read_text(encoding="utf-8"))
    assert said["golden"]["selection"].endswith("(2 unreviewed drafts)")
    assert said["warnings"][0].startswith(
        "2 of the 2 scored golden items are unreviewed drafts (draft: true, scored as "
        "--allow-draft asks): "
    )
    assert said["warnings"][0].endswith(
        "No person has read them yet: 2 drafted from question headings: each asks its "
        "section's heading, the first line of the chunk it targets, so they test lexical "
        "matching only (expect scores near 1)"
    )  # not "written by a model", as it said of every draft
    assert "unreviewed drafts" in (drafted.parent / "report.md").read_text(encoding="utf-8")
    # ... for that run only: the next one without the flag is refused again.
    again = runner.invoke(app, ["eval", "retrieval", "--config", config, "--golden", str(out)])
    assert again.exit_code == 2 and "drafts not yet reviewed" in again.output
    # Reviewed: the draft lines removed, the set evaluates as any other.
    reviewed = tmp_path / "reviewed.yaml"
    reviewed.write_text(out.read_text(encoding="utf-8").replace("  draft: true\n", ""), "utf-8")
    ran = runner.invoke(app, ["eval", "retrieval", "--config", config, "--golden",
                              str(reviewed), "--name", "reviewed"])  # fmt: skip
    assert ran.exit_code == 0, ran.output
    (summary,) = (tmp_path / "reports").glob("*-reviewed/summary.json")
    assert json.loads(summary.read_text(encoding="utf-8"))["metrics"]["default"]["mrr"]["n"] == 2


@pytest.mark.integration
def test_model_questions_are_drafted_from_their_chunks_and_checked(tmp_path: Path) -> None:
    import re

    config = _index(tmp_path)
    out = tmp_path / "draft.yaml"
    made = runner.invoke(app, ["golden", "draft", "--config", config, "--out", str(out),
                               "--sample", "3", "--model", "smollm2-135m"])  # fmt: skip
    assert made.exit_code == 0, made.output
    counts = re.search(r"2 question headings, (\d+) of (\d+) model questions kept", made.output)
    assert counts is not None, made.output
    kept, asked = int(counts[1]), int(counts[2])
    # Sections with 25+ words of prose: the two question sections (29 and 25 words);
    # "Monitoring" has 15.
    assert asked == 2
    dropped = [int(n) for n in re.findall(r"^  dropped (\d+): ", made.output, re.M)]
    assert kept + sum(dropped) == asked  # every chunk asked about is kept, or dropped with why
    items = yaml.safe_load(out.read_text("utf-8"))["items"]
    drafted = [i for i in items if i["provenance"]["method"] == "llm"]
    assert len(drafted) == kept
    for item in drafted:
        assert item["draft"] is True and item["query"].endswith("?")
        assert item["provenance"]["model"] == "SmolLM2-135M-Instruct.Q4_1"
        assert item["chunks"][0]["contains"] in " ".join(FAQ.split())
    # Every target a drafted item names is in the index.
    check = runner.invoke(app, ["eval", "check", str(out), "--config", config])
    assert check.exit_code == 0, check.output


def test_a_gate_with_draft_items_stops_the_ingest_before_it_builds_anything(
    tmp_path: Path,
) -> None:
    from ragpipe.config import RagpipeConfig
    from ragpipe.ingest.pipeline import run_ingest

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "db.md").write_text(FAQ, encoding="utf-8")
    golden = tmp_path / "gate.yaml"
    golden.write_text(yaml.safe_dump({"name": "gate", "items": [
        {"id": "r", "query": "How do I restore the database?", "relevance": {"db.md": 3},
         "draft": True}]}), encoding="utf-8")  # fmt: skip
    config = RagpipeConfig.model_validate({
        "discover": {"roots": [str(tmp_path / "docs")]},
        "embed": {"provider": "onnx"},
        "store": {"path": str(tmp_path / "store")},
        "paths": {"work_dir": str(tmp_path / "work")},
        "index": {"gate": {"golden": [str(golden)]}},
    })  # fmt: skip
    with pytest.raises(ConfigError, match="1 of 1 items are drafts not yet reviewed"):
        run_ingest(config)
    assert not (tmp_path / "store").exists() and not (tmp_path / "work").exists()


def test_chunks_and_questions_in_any_script_are_drafted() -> None:
    """Words were [a-z0-9]+: a Korean, Arabic or Chinese chunk had no words (never sampled),
    and a question in those scripts was "not a question" ("？" and "؟" were no question
    marks either)."""
    from ragpipe.evaluation.draft import is_question, word_count

    korean = " ".join(["한국어", "문서는", "이렇게", "띄어", "씁니다"] * 6)  # 30 words
    arabic = " ".join(["هذا", "نص", "عربي", "طويل", "جدا"] * 6)
    chinese = "软件包可以用这个命令安装，也可以从源代码编译安装。" * 3  # 23 characters 3 times
    assert word_count(korean) == word_count(arabic) == 30
    hindi = "क्लाइंट को सर्वर पर कैसे स्थापित करें?"  # 7 words; vowel signs are marks
    assert word_count(hindi) == 7 and is_question(hindi, 4)
    assert word_count(chinese) == 69 / 2  # a character half a word; "，" and "。" none
    chunks = [_passage(f"{n}.md", 0, (), t) for n, t in
              (("ko", korean), ("ar", arabic), ("zh", chinese))]  # fmt: skip
    assert len(stratified(chunks, 3, 0)) == 3
    assert is_question("这个软件包应该怎么安装？", 4)
    assert is_question("كيف أثبت الحزمة في النظام؟", 4)
    assert not is_question("软件包？", 4)  # 3 characters: 1.5 words
    # A Chinese question copying 6 characters of its chunk copies 3 words: kept.
    from ragpipe.evaluation.draft import COPY_WORDS, _piece_words

    asked = "这个命令安装吗？"
    assert copied_run(asked, chinese) == 6 < COPY_WORDS * _piece_words(asked)


def test_a_run_scoring_drafts_says_how_each_was_made(tmp_path: Path) -> None:
    """The warning said every draft's question and targets "were written by a model": a
    heading item's question is its section's heading, the first line of the chunk it
    targets (it scores near 1.000), and no model wrote it."""
    from types import SimpleNamespace

    from ragpipe.evaluation.golden import load_golden
    from ragpipe.evaluation.run import GoldenInfo, with_drafts

    path = tmp_path / "drafts.yaml"
    path.write_text("""
items:
  - id: h1
    query: How do I restore the database?
    chunks: [{file: db.md, heading: "How do I restore the database?", grade: 3}]
    draft: true
    provenance: {method: heading, file: /d/db.md, point_id: p1, source_sha: s1}
  - id: l1
    query: Where do the alerts go?
    chunks: [{file: db.md, contains: Alerts go to the on-call engineer, grade: 3}]
    draft: true
    provenance: {method: llm, file: /d/db.md, point_id: p2, source_sha: s1, model: m}
  - id: m1
    query: When do backups run?
    relevance: {db.md: 2}
    draft: true
  - id: r1
    query: How long does a restore take?
    relevance: {db.md: 3}
""", encoding="utf-8")  # fmt: skip
    golden = load_golden(path)
    assert [i.drafted_by for i in golden.items] == ["heading", "llm", None, None]

    def warned(ids: list[str]) -> tuple[list[str], str]:
        info = GoldenInfo("g", str(path), len(ids), "", {i: "x" for i in ids})
        summary = SimpleNamespace(golden=info, warnings=[])
        with_drafts(summary, golden)  # type: ignore[arg-type]
        return summary.warnings, info.selection

    warnings, selection = warned(["h1", "l1", "m1", "r1"])
    assert selection == "4 items (3 unreviewed drafts)"
    assert warnings == [
        "3 of the 4 scored golden items are unreviewed drafts (draft: true, scored as "
        "--allow-draft asks): h1, l1, m1. No person has read them yet: 1 drafted from "
        "question headings: each asks its section's heading, the first line of the chunk it "
        "targets, so they test lexical matching only (expect scores near 1); 1 written by a "
        "model (question and targets); 1 with no provenance (marked draft by hand)"
    ]
    (headings_only,), _ = warned(["h1", "r1"])
    assert headings_only.endswith(
        "h1. No person has read them yet: 1 drafted from question headings: each asks its "
        "section's heading, the first line of the chunk it targets, so they test lexical "
        "matching only (expect scores near 1)"
    )
    assert "model" not in headings_only
