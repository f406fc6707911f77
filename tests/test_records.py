"""JSON and JSONL records as documents: one per record, text and payload fields by config,
re-indexed record by record; bad records are rows, not a sunk file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ragpipe import checkpoint
from ragpipe.config import RagpipeConfig, RecordsRule, load_config
from ragpipe.errors import ConfigError
from ragpipe.ingest.pipeline import run_ingest
from ragpipe.ingest.records import render
from ragpipe.schemas import Failure, Skip
from tests.support.corpora import stored

FAQ = [
    {
        "id": "q1",
        "question": "How do I reset my password?",
        "answer": {"body": "Open the account page and choose Reset password."},
        "tags": ["account", "login"],
        "url": "https://help.example.org/q1",
    },
    {
        "id": "q2",
        "question": "Which ports does the agent use?",
        "answer": {"body": "The agent listens on port 8443 and sends to port 514."},
        "tags": ["network"],
        "url": "https://help.example.org/q2",
    },
    {
        "id": "q3",
        "question": "Can I export my data?",
        "answer": {"body": "Yes: Settings, then Export, gives a ZIP of every document."},
        "tags": [],
        "url": "https://help.example.org/q3",
    },
]
FAQ_RULE = {
    "glob": "**/*.jsonl",
    "text": ["answer.body"],
    "title": "question",
    "id": "id",
    "payload": ["tags", "url"],
}


def _write_jsonl(path: Path, records: list[Any]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _config(root: Path, tmp_path: Path, rules: list[dict[str, Any]]) -> RagpipeConfig:
    return RagpipeConfig(
        discover={"roots": [root], "records": rules},
        embed={"provider": "onnx", "batch_size": 16},
        store={"path": tmp_path / "store"},
        paths={"work_dir": tmp_path / "work"},
        index={"max_delete_share": 0.5},
    )


def _by_file(cfg: RagpipeConfig) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for payload in stored(cfg).values():
        out.setdefault(payload["file_path"], []).append(payload)
    return out


def test_a_record_renders_its_title_and_text_fields() -> None:
    rule = RecordsRule(**FAQ_RULE)
    assert render(FAQ[0], rule) == (
        "# How do I reset my password?\n\nOpen the account page and choose Reset password.\n",
        "How do I reset my password?",
    )
    both = RecordsRule(glob="*.json", text=["question", "tags"])
    assert render(FAQ[0], both) == ("How do I reset my password?\n\naccount\nlogin\n", None)
    assert render({"question": "only a title"}, rule) == ("", "only a title")


def test_a_rule_without_text_fields_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "ragpipe.yaml"
    path.write_text(json.dumps({"discover": {"records": [{"glob": "*.jsonl", "text": []}]}}))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "discover.records.0.text: List should have at least 1 item" in str(info.value)


@pytest.mark.slow
def test_records_are_documents_indexed_and_updated_one_by_one(tmp_path: Path) -> None:
    root = tmp_path / "share"
    root.mkdir()
    _write_jsonl(root / "faq.jsonl", FAQ)
    (root / "tickets.json").write_text(
        json.dumps({"data": {"items": [
            {"subject": "Printer offline", "body": "The third-floor printer shows offline."},
            {"subject": "VPN drops", "body": "The VPN drops every hour on the hour."},
        ]}})
    )  # fmt: skip
    (root / "notes.md").write_text("# Notes\n\nThe office opens at eight.\n")
    (root / "raw.jsonl").write_text('{"no": "rule matches this name"}\n')
    rules = [
        {**FAQ_RULE, "glob": "faq.jsonl"},
        {"glob": "tickets.json", "records": "data.items", "text": ["body"], "title": "subject"},
    ]
    cfg = _config(root, tmp_path, rules)
    first = run_ingest(cfg)
    faq, tickets = f"{root}/faq.jsonl", f"{root}/tickets.json"
    files = _by_file(cfg)
    assert sorted(files) == sorted(
        [f"{faq}#q1", f"{faq}#q2", f"{faq}#q3", f"{tickets}#0", f"{tickets}#1", f"{root}/notes.md"]
    )
    assert (first.added, first.failed) == (6, 0)
    assert first.stages["discover"]["records"] == 5
    assert first.stages["discover"]["records_files_parsed"] == 2
    skips = checkpoint.read_records(cfg.paths.work_dir / "discover" / "skipped.parquet", Skip)
    assert [(s.file_path, s.reason) for s in skips] == [(f"{root}/raw.jsonl", "unsupported_type")]
    (q2,) = files[f"{faq}#q2"]
    assert q2["text"] == "# Which ports does the agent use?\n\n" + FAQ[1]["answer"]["body"]
    assert q2["heading_path"] == ["Which ports does the agent use?"]
    assert (q2["title"], q2["record_id"], q2["source_file"]) == (
        "Which ports does the agent use?",
        "q2",
        faq,
    )
    assert q2["fields"] == {"tags": ["network"], "url": "https://help.example.org/q2"}
    (printer,) = files[f"{tickets}#0"]
    assert (printer["title"], printer["fields"]) == ("Printer offline", {})

    # Unchanged: the files are not parsed again, nothing is re-embedded.
    second = run_ingest(cfg)
    assert "records_files_parsed" not in second.stages["discover"]  # 0 is left out
    assert (second.added, second.changed, second.skipped_unchanged) == (0, 0, 6)

    # One answer changes, one record's payload alone changes, one record leaves.
    changed = [dict(FAQ[0]), dict(FAQ[1])]
    changed[0]["answer"] = {"body": "Use the Forgot password link on the sign-in page."}
    changed[1]["tags"] = ["network", "firewall"]
    _write_jsonl(root / "faq.jsonl", changed)
    third = run_ingest(cfg)
    assert (third.changed, third.removed, third.skipped_unchanged) == (2, 1, 3)
    files = _by_file(cfg)
    assert f"{faq}#q3" not in files
    assert "Forgot password" in files[f"{faq}#q1"][0]["text"]
    assert files[f"{faq}#q2"][0]["fields"]["tags"] == ["network", "firewall"]


def test_a_rule_with_a_folder_matches_below_the_root_dot_and_a_file_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`roots: [.]`: discover matched `exports/tickets.json` against the path, the records
    stage against `./`-prefixed names (never), so the file was one plain-text document."""
    from ragpipe.ingest.records import relative_path

    project = tmp_path / "project"
    (project / "exports").mkdir(parents=True)
    (project / "exports" / "tickets.json").write_text(json.dumps({"items": [
        {"id": "t1", "subject": "Printer offline", "body": "The printer shows offline."},
        {"id": "t2", "subject": "VPN drops", "body": "The VPN drops every hour."},
    ]}))  # fmt: skip
    rule = {"glob": "exports/tickets.json", "records": "items", "text": ["body"],
            "title": "subject", "id": "id"}  # fmt: skip
    monkeypatch.chdir(project)
    cfg = _config(Path("."), tmp_path, [rule])
    assert (run_ingest(cfg).added, sorted(_by_file(cfg))) == (
        2, ["exports/tickets.json#t1", "exports/tickets.json#t2"]
    )  # fmt: skip
    assert relative_path("exports/tickets.json", ".") == "exports/tickets.json"
    assert relative_path("share/exports/tickets.json", "share") == "exports/tickets.json"
    assert relative_path("share/exports/tickets.json", "share/exports/tickets.json") == (
        "tickets.json"  # a file given as the root: its name, in discover too
    )


@pytest.mark.slow
def test_bad_records_are_rows_and_keep_what_the_file_had(tmp_path: Path) -> None:
    root = tmp_path / "share"
    root.mkdir()
    _write_jsonl(root / "faq.jsonl", FAQ)
    cfg = _config(root, tmp_path, [FAQ_RULE])
    run_ingest(cfg)
    before = _by_file(cfg)

    # q3 leaves, a line is torn, an id repeats, one record has no id: the good ones are
    # indexed, the file gets one row naming the lines, and q3 is kept this run.
    lines = [json.dumps(FAQ[0]), '{"id": "q9", "question": "torn', json.dumps(FAQ[1])]
    lines += [json.dumps({**FAQ[1], "question": "again"}), json.dumps({"question": "no id"})]
    new = {"id": "q4", "question": "Is there an API?", "answer": {"body": "Yes, REST."}}
    lines.append(json.dumps(new))
    (root / "faq.jsonl").write_text("\n".join(lines) + "\n")
    run = run_ingest(cfg)
    (failure,) = checkpoint.read_records(cfg.paths.work_dir / "failures.parquet", Failure)
    assert (failure.file_path, failure.category) == (f"{root}/faq.jsonl", "bad_records")
    assert failure.message.startswith(
        "3 records not indexed: line 2: not JSON (Unterminated string starting, column 26); "
        "line 4: id 'q2' again (ids must be unique in a file); line 5: no usable 'id'"
    )
    assert (run.added, run.removed) == (1, 0)
    after = _by_file(cfg)
    assert sorted(after) == sorted([*before, f"{root}/faq.jsonl#q4"])
    assert after[f"{root}/faq.jsonl#q3"] == before[f"{root}/faq.jsonl#q3"]

    # The file is parsed again every run while it has bad records: the row stays.
    again = run_ingest(cfg)
    assert again.stages["discover"]["records_files_parsed"] == 1
    assert again.failures_by_category == {"discover:bad_records": 1}

    # A file that is not JSON at all: one row, every record kept.
    (root / "faq.jsonl").write_bytes(b"\xff\xfe not text")
    broken = run_ingest(cfg)
    (failure,) = checkpoint.read_records(cfg.paths.work_dir / "failures.parquet", Failure)
    assert failure.category == "unreadable_records" and "cannot read records" in failure.message
    assert broken.removed == 0 and sorted(_by_file(cfg)) == sorted(after)

    # Emptied (an export caught mid-write): every record is kept, not deleted.
    (root / "faq.jsonl").write_text("")
    emptied = run_ingest(cfg)
    (failure,) = checkpoint.read_records(cfg.paths.work_dir / "failures.parquet", Failure)
    assert (failure.category, emptied.removed) == ("unreadable_records", 0)
    assert "the file is empty" in failure.message
    assert sorted(_by_file(cfg)) == sorted(after)


@pytest.mark.slow
def test_exports_as_they_come(tmp_path: Path) -> None:
    """A minified one-line export, a BOM, U+2028 inside a string, JSON Lines in a .json file,
    equal records under two ids, an empty record; and a file that was indexed as text
    before a rule matched it."""
    root = tmp_path / "share"
    root.mkdir()
    big = [{"id": f"t{i}", "body": f"Ticket {i}: " + "the printer is offline again. " * 40}
           for i in range(120)]  # fmt: skip
    (root / "tickets.json").write_text(json.dumps(big))  # one line of about 150 KB
    bom = "\ufeff" + json.dumps({"id": "b1", "body": "A record after a byte order mark."})
    (root / "bom.jsonl").write_text(bom + "\n", encoding="utf-8")
    lines = [
        {"id": "s1", "body": "Line one\u2028still line one of the same record."},
        {"id": "s2", "body": "Same text."},
        {"id": "s3", "body": "Same text."},
        {"id": "s4", "body": ""},
    ]
    (root / "lines.json").write_text(
        "\n".join(json.dumps(r, ensure_ascii=False) for r in lines) + "\n", encoding="utf-8"
    )
    (root / "old.json").write_text(json.dumps([{"id": "o1", "body": "Indexed as text first."}]))
    cfg = _config(root, tmp_path, [{"glob": "*.json*", "text": ["body"], "id": "id"}])
    before_rule = cfg.model_copy(
        update={"discover": cfg.discover.model_copy(update={"records": []})}
    )
    run_ingest(before_rule)
    # As text, the one-line export is refused (discover.max_line_bytes); as records it is not.
    assert sorted(_by_file(before_rule)) == [f"{root}/lines.json", f"{root}/old.json"]
    # The rule arrives with one record of old.json lacking its id: the text copy still goes.
    (root / "old.json").write_text(
        json.dumps([{"id": "o1", "body": "Indexed as text first."}, {"body": "no id"}])
    )
    run = run_ingest(cfg, allow_mass_delete=True)  # the text copies give way to records
    assert run.removed == 2
    files = _by_file(cfg)
    assert (
        f"{root}/tickets.json#t119" in files
        and len([f for f in files if f.startswith(f"{root}/tickets.json#")]) == 120
    )
    assert f"{root}/bom.jsonl#b1" in files
    (s1,) = files[f"{root}/lines.json#s1"]
    assert "\u2028still line one" in s1["text"]
    assert f"{root}/lines.json#s2" in files and f"{root}/lines.json#s3" in files  # not deduped
    assert f"{root}/old.json" not in files and f"{root}/old.json#o1" in files
    assert run.failures_by_category == {"discover:bad_records": 1}
    (failure,) = checkpoint.read_records(cfg.paths.work_dir / "failures.parquet", Failure)
    assert failure.message.startswith("1 records not indexed: record 1: no usable 'id'")
    skipped = {(s.file_path, s.reason) for s in checkpoint.read_records(
        cfg.paths.work_dir / "discover" / "skipped.parquet", Skip)}  # fmt: skip
    assert (f"{root}/lines.json#s4", "empty_record") in skipped
    run_ingest(cfg)  # unchanged: the skip row is still there
    skipped = {(s.file_path, s.reason) for s in checkpoint.read_records(
        cfg.paths.work_dir / "discover" / "skipped.parquet", Skip)}  # fmt: skip
    assert (f"{root}/lines.json#s4", "empty_record") in skipped


def test_a_record_cut_mid_character_is_indexed_mended(tmp_path: Path) -> None:
    """A JavaScript exporter's "\\ud83d" (half an emoji) is no character: the record's
    Markdown could not be written, and the whole discovery failed, every run; as an id,
    its skip row could not be written either."""
    from ragpipe.schemas import storable

    root = tmp_path / "share"
    root.mkdir()
    (root / "cut.jsonl").write_text(
        '{"id": "q1", "body": "A great day \\ud83d"}\n'
        '{"id": "q2", "body": "A whole one \\ud83d\\ude00 here."}\n'
        '{"id": "\\ud800", "body": ""}\n',
        encoding="utf-8",
    )
    cfg = _config(root, tmp_path, [{"glob": "*.jsonl", "text": ["body"], "id": "id"}])
    run = run_ingest(cfg)
    assert run.added == 2 and run.failed == 0
    files = _by_file(cfg)
    assert files[f"{root}/cut.jsonl#q1"][0]["text"].startswith("A great day")
    assert "\U0001f600" in files[f"{root}/cut.jsonl#q2"][0]["text"]
    skipped = checkpoint.read_records(cfg.paths.work_dir / "discover" / "skipped.parquet", Skip)
    assert [s.file_path for s in skipped] == [f"{root}/cut.jsonl#\ufffd"]
    assert storable("\ud800x") == "\\ud800x" and storable("caf\udce9") == "caf\\xe9"


def test_records_under_another_spelling_of_their_root_are_refused_not_doubled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relabel check looked for a file at "exports/faq.jsonl#q1": records were indexed
    twice when the root was spelled otherwise. A hard link under the same root is no
    relabel (the check refused it, blocking the nightly)."""
    import os

    from ragpipe.errors import ConfigError

    root = tmp_path / "exports"
    root.mkdir()
    _write_jsonl(root / "faq.jsonl", FAQ)
    monkeypatch.chdir(tmp_path)
    first = run_ingest(_config(Path("exports"), tmp_path, [FAQ_RULE]))
    with pytest.raises(ConfigError, match=r"3 indexed file\(s\) are the same files"):
        run_ingest(_config(root, tmp_path, [FAQ_RULE]))
    # A root that is the records file itself, spelled otherwise: refused too.
    single = tmp_path / "single"
    single.mkdir()
    _write_jsonl(single / "faq.jsonl", FAQ)
    alone = tmp_path / "alone"
    run_ingest(_config(Path("single/faq.jsonl"), alone, [FAQ_RULE]))
    with pytest.raises(ConfigError, match=r"Spell the root as before \('single/faq.jsonl'\)"):
        run_ingest(_config(single / "faq.jsonl", alone, [FAQ_RULE]))
    os.link(root / "faq.jsonl", root / "a-faq.jsonl")  # the same bytes, first in sort order
    linked = run_ingest(_config(Path("exports"), tmp_path, [FAQ_RULE]), allow_mass_delete=True)
    assert linked.points_total == first.points_total
    assert {p.split("#")[0] for p in _by_file(_config(Path("exports"), tmp_path, []))} == {
        "exports/a-faq.jsonl"
    }


@pytest.mark.slow
def test_a_payload_number_no_point_can_hold_is_a_bad_record(tmp_path: Path) -> None:
    """NaN, Infinity and 1e400 (read as infinity) in a payload field sank the whole ingest
    at the upsert ("failed to convert NaN into payload number type"): nothing stored, no
    row. An integer beyond 64 bits came back a float, another number."""
    root = tmp_path / "share"
    root.mkdir()
    (root / "faq.jsonl").write_text(
        '{"id": "q1", "body": "Reset the password from the account page.", "score": 1.5,'
        ' "n": 123456789012345678901234567890}\n'
        '{"id": "q2", "body": "The agent listens on port 8443.", "score": NaN}\n'
        '{"id": "q3", "body": "Export gives a ZIP.", "score": Infinity}\n'
        '{"id": "q4", "body": "The API is REST.", "score": -1e400}\n'
        '{"id": "q5", "body": "Tags may hold numbers.", "score": 2, "n": [1, NaN]}\n'
        '{"id": "q6", "body": "NaN in the text is only text.", "title": NaN, "score": 3,'
        ' "n": -9223372036854775808}\n'
    )
    (root / "notes.txt").write_text("An ordinary note about gardening and tomatoes.\n")
    rule = {"glob": "*.jsonl", "text": ["body"], "title": "title", "id": "id",
            "payload": ["score", "n"]}  # fmt: skip
    cfg = _config(root, tmp_path, [rule])
    run = run_ingest(cfg)
    assert (run.added, run.failed) == (3, 1)
    (failure,) = checkpoint.read_records(cfg.paths.work_dir / "failures.parquet", Failure)
    assert (failure.file_path, failure.category) == (f"{root}/faq.jsonl", "bad_records")
    assert failure.message.startswith(
        "4 records not indexed: line 2: payload field 'score' is not a finite number; "
        "line 3: payload field 'score' is not a finite number; "
        "line 4: payload field 'score' is not a finite number; "
        "line 5: payload field 'n' holds a number that is not finite."
    )
    files = _by_file(cfg)
    assert sorted(files) == [f"{root}/faq.jsonl#q1", f"{root}/faq.jsonl#q6", f"{root}/notes.txt"]
    assert files[f"{root}/faq.jsonl#q1"][0]["fields"] == {
        "score": 1.5,
        "n": "123456789012345678901234567890",  # its digits, not 1.2345678901234568e+29
    }
    (q6,) = files[f"{root}/faq.jsonl#q6"]
    assert q6["fields"] == {"score": 3, "n": -9223372036854775808}  # 64 bits: a number
    assert q6["title"] == "NaN"


def test_a_record_too_deep_or_too_long_to_read_is_a_bad_line_not_a_sunk_run(
    tmp_path: Path,
) -> None:
    """A record of 5000 nested lists raised RecursionError out of the records stage (the
    whole run failed, every night); a line with an integer of 5000 digits (a plain
    ValueError) made the whole file unreadable_records."""
    import hashlib

    from ragpipe.ingest.records import expand
    from ragpipe.schemas import SourceFile

    deep = '{"id": "d", "body": "x", "meta": ' + "[" * 5000 + "]" * 5000 + "}"
    walked = '{"id": "w", "body": "half an emoji \\ud83d", "meta": ' + "[" * 900 + "]" * 900 + "}"
    nested = json.dumps({"id": "p", "body": "x", "meta": json.loads("[" * 65 + "]" * 65)})
    contents = {
        "good.jsonl": '{"id": "g", "body": "A fine record."}\n',
        "lines.jsonl": "\n".join([
            '{"id": "a", "body": "Before the deep one \\ud83d"}', deep,
            '{"id": "n", "body": "x", "n": ' + "1" * 5000 + "}", walked, nested,
            '{"id": "b", "body": "After them."}',
        ]) + "\n",
        "deep.json": "[" + deep + "]",
        "digits.json": '[{"id": "n", "body": "x", "n": ' + "1" * 5000 + "}]",
    }  # fmt: skip
    sources = []
    for name, text in contents.items():
        path = tmp_path / name
        path.write_text(text)
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        sources.append(SourceFile(str(path), str(path), str(tmp_path), "records", 1, sha))
    rule = {"glob": "*.json*", "text": ["body"], "id": "id", "payload": ["meta"]}
    cfg = _config(tmp_path, tmp_path, [rule])
    result = expand(cfg, sources, [], tmp_path / "bodies")
    assert [f.file_path.rpartition("/")[2] for f in result.files] == [
        "good.jsonl#g", "lines.jsonl#a", "lines.jsonl#b"
    ]  # fmt: skip
    problems = {f.file_path.rpartition("/")[2]: (f.category, f.message) for f in result.failures}
    assert sorted(problems) == ["deep.json", "digits.json", "lines.jsonl"]
    assert problems["lines.jsonl"][0] == "bad_records"
    assert problems["lines.jsonl"][1].startswith(
        "4 records not indexed: line 2: nested too deeply to read; line 3: not readable "
        "(Exceeds the limit (4300 digits) for integer string conversion: value has 5000 "
        "digits); line 4: nested too deeply to read; line 5: payload field 'meta' is nested "
        "more than 64 levels deep. The others are"
    )
    assert problems["deep.json"] == (
        "unreadable_records",
        "cannot read records: nested too deeply to read; its indexed records are kept until "
        "it parses",
    )
    assert problems["digits.json"][0] == "unreadable_records"
    assert "not readable (Exceeds the limit (4300 digits)" in problems["digits.json"][1]
