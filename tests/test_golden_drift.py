"""Golden drift: an eval marks the items whose target files changed since the last run of
the same golden set, so that a metric move can be told apart from a stale label (issue 33)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragpipe.evaluation.check import evidence_changes
from ragpipe.evaluation.run import run_retrieval
from ragpipe.ingest.pipeline import run_ingest
from ragpipe.store import published
from tests.support.corpora import TOPICS, make_config, topic_doc, write_topics

pytestmark = pytest.mark.integration


def test_an_eval_after_a_nightly_marks_items_whose_evidence_changed(tmp_path: Path) -> None:
    corpus = write_topics(tmp_path / "corpus", 4, ".txt")
    golden = tmp_path / "golden.yaml"
    items = "".join(f"  - id: {t}\n    query: notes on {t}\n    relevance: {{{t}.txt: 1}}\n"
                    for t in TOPICS[:4])  # fmt: skip
    golden.write_text(f"name: topics\nitems:\n{items}", encoding="utf-8")
    cfg = make_config(corpus, tmp_path, eval={"golden": golden, "granularity": "file",
                                              "reports_dir": tmp_path / "reports",
                                              "resamples": 200})  # fmt: skip
    run_ingest(cfg)
    first_version = published.current(cfg.store.path)
    _, first = run_retrieval(cfg)
    assert first.evidence_changed == {} and first.evidence_since is None  # nothing before
    assert set(first.evidence) == set(TOPICS[:4])
    (wings,) = first.evidence["wings"]  # one file per item, with its stored SHA-256
    assert wings.endswith("wings.txt") and len(first.evidence["wings"][wings]) == 64

    (corpus / "wings.txt").write_text(topic_doc("wings", version=2), encoding="utf-8")
    run_ingest(cfg)  # the nightly changes one targeted file
    _, second = run_retrieval(cfg)
    assert second.evidence_since == {"run_id": first.run_id, "index_version": first_version}
    assert list(second.evidence_changed) == ["wings"]
    assert second.evidence_changed["wings"] == (
        f"evidence changed since index version {first_version[:12]}: {wings} changed"
    )
    assert any("1 golden item(s) target files that changed" in w for w in second.warnings)
    report = (Path(second.report_dir) / "report.md").read_text(encoding="utf-8")
    assert f"## Evidence changed since the last run ({first.run_id})" in report
    saved = json.loads((Path(second.report_dir) / "summary.json").read_text(encoding="utf-8"))
    assert saved["evidence_changed"] == second.evidence_changed

    _, third = run_retrieval(cfg)  # nothing changed since the second run
    assert third.evidence_changed == {} and third.evidence_since["run_id"] == second.run_id

    # Another index sharing the reports folder is not compared with this one's runs.
    other = cfg.model_copy(update={
        "store": cfg.store.model_copy(update={"path": tmp_path / "other-store"}),
        "paths": cfg.paths.model_copy(update={"work_dir": tmp_path / "other-work"}),
    })  # fmt: skip
    run_ingest(other)
    _, elsewhere = run_retrieval(other)
    assert elsewhere.evidence_since is None and elsewhere.evidence_changed == {}


def test_evidence_changes_by_hand() -> None:
    before = {"a": {"x.md": "1"}, "b": {"y.md": "2"}, "c": {"z.md": "3", "w.md": "4"}}
    now = {"a": {"x.md": "1"}, "b": {"y.md": "9"}, "c": {"z.md": "3", "v.md": "5"}, "d": {}}
    assert evidence_changes(before, now) == {
        "b": "y.md changed",
        "c": "v.md is new, w.md is gone",
    }  # a unchanged; d was not in the earlier run
