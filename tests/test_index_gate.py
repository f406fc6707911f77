"""The nightly that proves itself: a new index version goes live only when its golden sets
and canaries say it is no worse (issue 33)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flows.cli import app
from ragpipe.config import RagpipeConfig, load_config
from ragpipe.errors import ConfigError, IndexHeld, StageError
from ragpipe.evaluation.check import GoldenMismatch
from ragpipe.ingest import gatekeep
from ragpipe.ingest.pipeline import run_ingest
from ragpipe.query.retrieve import Retriever
from ragpipe.store import open_reader, published
from ragpipe.store import versions as index_versions
from tests.support.corpora import TOPICS, make_config, topic_doc, write_topics

pytestmark = pytest.mark.integration

ONNX = "paraphrase-MiniLM-L3-v2"


def _golden(path: Path) -> Path:
    """One item per topic, its file the only relevant one: each scores 1 or 0 at file
    granularity (the topic's own file first, or absent)."""
    items = "".join(
        f"  - id: {t}\n    query: notes that explain {t}\n    relevance: {{{t}.txt: 1}}\n"
        for t in TOPICS
    )
    path.write_text(f"name: topics\nitems:\n{items}", encoding="utf-8")
    return path


def _config(corpus: Path, tmp_path: Path, backend: str = "edge", **gate: Any) -> RagpipeConfig:
    settings = {"golden": [_golden(tmp_path / "golden.yaml")], "min_score": 0.5, **gate}
    return make_config(corpus, tmp_path, backend, index={"gate": settings},
                       eval={"granularity": "file", "resamples": 200})  # fmt: skip


# The same contract on both stores: Edge (published copies) and qdrant-client's local mode
# (a collection per version behind an alias, as on a Qdrant server).
BACKENDS = pytest.mark.parametrize("backend", ["edge", "qdrant"])


def _aliases(cfg: RagpipeConfig) -> dict[str, str]:
    from qdrant_client import QdrantClient

    client = QdrantClient(path=str(cfg.store.path))
    try:
        return {a.alias_name: a.collection_name for a in client.get_aliases().aliases}
    finally:
        client.close()


def _held_version(corpus: Path, cfg: RagpipeConfig) -> str:
    """Half the corpus removed: the gate holds the version (answers lost); its generation."""
    for topic in TOPICS[3:]:
        (corpus / f"{topic}.txt").unlink()
    with pytest.raises(IndexHeld):
        run_ingest(cfg, allow_mass_delete=True)
    return next(v.generation for v in index_versions.list_versions(cfg.store)
                if v.status == "held")  # fmt: skip


def _points(cfg: RagpipeConfig, version: str | None = None) -> int:
    store = open_reader(cfg.store, ONNX, version)
    assert store is not None
    try:
        return store.count()
    finally:
        store.close()


@BACKENDS
def test_a_version_that_loses_half_its_answers_is_held_and_readers_keep_the_live_one(
    tmp_path: Path,
    backend: str,
) -> None:
    corpus = write_topics(tmp_path / "corpus", 6, ".txt")
    canary = {"query": "astronomy", "files": ["astronomy.txt"], "k": 3}
    cfg = _config(corpus, tmp_path, backend, canaries=[canary])
    first = run_ingest(cfg)
    assert first.gate["outcome"] == "promoted"  # the first version: floor and canary only
    assert first.gate["verdict"]["golden"][0]["staged"] == 1.0  # 6 of 6 at rank 1
    assert first.gate["verdict"]["golden"][0]["live"] is None
    live = index_versions.current(cfg.store)
    assert live == first.gate["generation"] and _points(cfg) == first.points_total
    if backend == "qdrant":  # readers query the alias, which names the live version's collection
        assert _aliases(cfg) == {"ragpipe": f"ragpipe-ragpipe-{live}"}

    for topic in TOPICS[3:]:  # the corpus loses the files of 3 of the 6 golden items
        (corpus / f"{topic}.txt").unlink()
    with pytest.raises(IndexHeld, match=r"fell by 0.5000 on the same 6 items") as held:
        run_ingest(cfg, allow_mass_delete=True)
    assert "astronomy.txt not in the top 3" in str(held.value)
    assert index_versions.current(cfg.store) == live  # readers keep the old version
    if backend == "qdrant":
        assert _aliases(cfg) == {"ragpipe": f"ragpipe-ragpipe-{live}"}
    assert _points(cfg) == first.points_total
    summary = json.loads((cfg.paths.work_dir / "summary.json").read_text(encoding="utf-8"))
    staged = summary["gate"]["generation"]
    assert summary["gate"]["outcome"] == "held" and staged != live
    golden = summary["gate"]["verdict"]["golden"][0]
    # Hand-computed: each item scores 1 (its file first) or 0 (its file gone).
    assert (golden["staged"], golden["live"], golden["delta"]) == (0.5, 1.0, -0.5)
    assert golden["delta_low"] is None is golden["delta_high"]  # 6 items: too few for a CI
    assert golden["lost"] == ["gardening", "astronomy", "cooking"]
    assert len(golden["unmatched_staged"]) == 3
    assert _points(cfg, staged[:10]) == summary["points_total"] < first.points_total

    with pytest.raises(IndexHeld, match=r"still held"):  # a no-op night: not judged again
        run_ingest(cfg)
    assert index_versions.current(cfg.store) == live

    for topic in TOPICS[3:]:  # the next good nightly (the files back, revised)
        (corpus / f"{topic}.txt").write_text(topic_doc(topic, version=2), encoding="utf-8")
    good = run_ingest(cfg)
    assert good.gate["outcome"] == "promoted" and good.gate["live_before"] == live
    judged = good.gate["verdict"]["golden"][0]
    assert judged["delta"] == 0.0  # every item's delta 0: no CI, not [0, 0]
    assert judged["delta_low"] is None and judged["delta_high"] is None
    assert index_versions.current(cfg.store) == good.gate["generation"]
    versions = {v.generation: v for v in index_versions.list_versions(cfg.store)}
    assert staged not in versions  # a held version older than the live one: superseded
    assert versions[good.gate["generation"]].live
    assert versions[live].status == "promoted"  # kept to roll back to


@BACKENDS
def test_index_list_promote_and_discard_from_the_cli(tmp_path: Path, backend: str) -> None:
    corpus = write_topics(tmp_path / "corpus", 6, ".txt")
    cfg = _config(corpus, tmp_path, backend)
    run_ingest(cfg)
    live = index_versions.current(cfg.store)
    for topic in TOPICS[3:]:
        (corpus / f"{topic}.txt").unlink()
    with pytest.raises(IndexHeld):
        run_ingest(cfg, allow_mass_delete=True)
    staged = next(v.generation for v in index_versions.list_versions(cfg.store) if not v.live)
    config_file = tmp_path / "ragpipe.yaml"
    config_file.write_text(json.dumps(cfg.model_dump(mode="json")), encoding="utf-8")
    args = ["--config", str(config_file)]
    runner = CliRunner()

    listed = runner.invoke(app, ["index", "list", "--json", *args])
    assert listed.exit_code == 0, listed.output
    rows = {r["generation"]: r for r in json.loads(listed.output)}
    assert rows[staged]["status"] == "held" and rows[live]["live"]
    table = runner.invoke(app, ["index", "list", *args])
    assert staged[:12] in table.output and "held" in table.output
    assert "fell by 0.5000" in rows[staged]["verdict"]["reasons"][0]

    found = runner.invoke(app, ["search", "cooking", "--version", staged[:10], "--format",
                                "json", *args])  # fmt: skip
    assert found.exit_code == 0, found.output
    assert not any("cooking" in h["file_path"] for h in json.loads(found.output)["hits"])
    wrong = runner.invoke(app, ["search", "cooking", "--version", "ffffzz", *args])
    assert wrong.exit_code == 2 and "no index versions match 'ffffzz'" in wrong.output

    refused = runner.invoke(app, ["index", "discard", live[:10], *args])
    assert refused.exit_code == 2 and "is live" in refused.output
    promoted = runner.invoke(app, ["index", "promote", staged[:10], *args])
    assert promoted.exit_code == 0, promoted.output
    assert index_versions.current(cfg.store) == staged  # a held version made live by hand
    assert index_versions.statuses(cfg.store)[staged]["by_hand"] is True
    back = runner.invoke(app, ["index", "promote", live[:10], *args])  # roll back
    assert back.exit_code == 0 and index_versions.current(cfg.store) == live
    # Promoting the live version again recorded it as its own roll-back target, and the
    # version to roll back to was pruned; "" matched the only version on disk.
    again = runner.invoke(app, ["index", "promote", live[:10], *args])
    assert again.exit_code == 0 and "is live already: nothing changed" in again.output
    assert {v.generation for v in index_versions.list_versions(cfg.store)} == {live, staged}
    empty = runner.invoke(app, ["index", "promote", "", *args])
    assert empty.exit_code == 2 and "give an index version" in empty.output
    discarded = runner.invoke(app, ["index", "discard", staged[:10], *args])
    assert discarded.exit_code == 0, discarded.output
    assert [v.generation for v in index_versions.list_versions(cfg.store)] == [live]


@BACKENDS
def test_a_first_version_is_checked_on_itself_and_unreadable_until_it_passes(
    tmp_path: Path,
    backend: str,
) -> None:
    corpus = write_topics(tmp_path / "corpus", 2, ".txt")  # 2 of the 6 golden topics
    cfg = _config(corpus, tmp_path, backend)
    with pytest.raises(GoldenMismatch, match=r"4 target.* of 4 item.* cannot be scored"):
        run_ingest(cfg)  # as any eval: labels that match nothing are refused, not scored 0
    assert index_versions.current(cfg.store) is None
    assert [v.status for v in index_versions.list_versions(cfg.store)] == ["staged"]
    with pytest.raises(StageError, match=r"no version of the index .* is live"):
        Retriever(cfg)  # the undecided version is not served

    canary = {"query": "gardening", "files": ["gardening.txt"], "k": 5}  # not in the corpus
    cfg = _config(corpus, tmp_path, backend, canaries=[canary])
    cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"skip_unmatched": True})})
    with pytest.raises(IndexHeld, match=r"gardening.txt not in the top 5"):
        run_ingest(cfg)  # the 2 matched items score 1.0 >= 0.5; the canary fails
    assert index_versions.current(cfg.store) is None
    assert [v.status for v in index_versions.list_versions(cfg.store)] == ["held"]
    with pytest.raises(StageError, match=r"no version of the index .* is live"):
        Retriever(cfg)


def test_a_gate_set_with_no_answerable_item_is_refused_not_passed(tmp_path: Path) -> None:
    # Its mean is of nothing (NaN), and NaN < min_score is false: it once promoted.
    corpus = write_topics(tmp_path / "corpus", 2, ".txt")
    moon = tmp_path / "moon.yaml"
    moon.write_text(
        'items:\n  - {id: moon, query: "What is beyond the moon?", answerable: false}\n',
        encoding="utf-8",
    )
    cfg = _config(corpus, tmp_path, golden=[moon], min_score=0.99)
    with pytest.raises(ConfigError, match=r"moon.yaml has no answerable item, and the gate"):
        run_ingest(cfg)
    assert not (cfg.paths.work_dir / "discover").exists()  # refused before building anything
    assert index_versions.current(cfg.store) is None


def test_a_gate_set_without_chunk_targets_is_refused_before_anything_is_built(
    tmp_path: Path,
) -> None:
    """Scored by chunk (the default), a gate set of file-only items was refused by the gate,
    after the whole ingest: rc 2, a version staged and never judged, every night again."""
    corpus = write_topics(tmp_path / "corpus", 2, ".txt")
    cfg = make_config(corpus, tmp_path, "edge",
                      index={"gate": {"golden": [_golden(tmp_path / "golden.yaml")]}})  # fmt: skip
    assert cfg.eval.granularity == "chunk"
    with pytest.raises(ConfigError) as refused:
        run_ingest(cfg)
    assert str(refused.value) == (
        f"index.gate.golden: {tmp_path / 'golden.yaml'}: granularity 'chunk' needs chunk "
        "targets; 6 item(s) have none (first: engines): score by file with eval.granularity: "
        "file in the configuration (--granularity file on `ragpipe eval retrieval`), or add "
        "chunks: to each item (docs/reference/golden-format.md)"
    )
    assert not (cfg.paths.work_dir / "discover").exists()  # refused before building anything
    assert index_versions.current(cfg.store) is None
    assert index_versions.list_versions(cfg.store) == []


def test_without_a_gate_every_version_is_published(tmp_path: Path) -> None:
    corpus = write_topics(tmp_path / "corpus", 3, ".txt")
    cfg = make_config(corpus, tmp_path)
    summary = run_ingest(cfg)
    assert summary.gate == {} and summary.stages["upsert"]["published"] == 1
    entries = index_versions.list_versions(cfg.store)
    assert [(e.status, e.live) for e in entries] == [("promoted", True)]


def test_gate_config_is_checked_at_load() -> None:
    with pytest.raises(ConfigError, match=r"index.gate.metric: unknown metric 'ndcg'"):
        load_config(None, {"index": {"gate": {"golden": ["g.yaml"], "metric": "ndcg"}}})
    with pytest.raises(ConfigError, match=r"a gate needs golden sets"):
        load_config(None, {"index": {"gate": {"max_drop": 0.1}}})
    with pytest.raises(ConfigError, match=r"index.gate.canaries.0.files"):
        load_config(None, {"index": {"gate": {"canaries": [{"query": "q", "files": []}]}}})


def _ragpipe_events(resource: str, expected: int) -> list[dict[str, Any]]:
    """The ragpipe.* events of ``resource`` the Prefect API stored (the harness's real
    server stores them asynchronously: waits up to 30 s for ``expected`` of them)."""
    from prefect.client.orchestration import get_client
    from prefect.events.worker import EventsWorker

    EventsWorker.drain_all()
    deadline = time.monotonic() + 30
    with get_client(sync_client=True) as client:
        while True:
            reply = client.request(
                "POST", "/events/filter",
                json={"filter": {"event": {"prefix": ["ragpipe."]}}, "limit": 50},
            )  # fmt: skip
            events = [e for e in reply.json()["events"]
                      if e["resource"]["prefect.resource.id"] == resource]  # fmt: skip
            if len(events) >= expected or time.monotonic() > deadline:
                return events
            time.sleep(0.5)


def _run_logs(run_id: Any) -> list[str]:
    """The messages the Prefect API stored for flow run ``run_id`` (shipped in the
    background: waits up to 30 s for the emit's line)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    deadline = time.monotonic() + 30
    with get_client(sync_client=True) as client:
        while True:
            found = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
            lines = [log.message for log in found]
            if any(line.startswith("emitted ") for line in lines) or time.monotonic() > deadline:
                return lines
            time.sleep(0.5)


def test_the_flow_emits_promoted_and_held_events(
    prefect_harness: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import flows.logs
    from flows.events import index_resource
    from flows.ingest import ingest_flow

    # A flow's own level (INFO), as on a worker: a CLI test earlier in this process asked
    # for WARNING (flows.logs._level), which kept the INFO line below from the run's logs.
    monkeypatch.setattr(flows.logs, "_level", None)

    corpus = write_topics(tmp_path / "corpus", 6, ".txt")
    cfg = _config(corpus, tmp_path)
    state = ingest_flow(config=cfg, return_state=True)
    assert state.is_completed()
    # (The summary as written: a state from the API can come back without its data.)
    promoted = json.loads((cfg.paths.work_dir / "summary.json").read_text("utf-8"))["gate"]
    assert promoted["outcome"] == "promoted"
    # The emit's log line reaches the run's logs, as ragpipe's lines do (flows.events
    # logged under its module name, a logger no handler of the run's logs listens to).
    assert "emitted ragpipe.index.promoted (sent)" in _run_logs(state.state_details.flow_run_id)
    for topic in TOPICS[3:]:
        (corpus / f"{topic}.txt").unlink()
    with pytest.raises(IndexHeld):
        ingest_flow(config=cfg, allow_mass_delete=True)
    # The run's summary artifact says why, not only the gate's one line.
    from prefect.artifacts import Artifact

    summary = Artifact.get("ingest-summary")
    assert summary is not None
    markdown = str(summary.data)
    assert "  - topics: ndcg@10 fell by 0.5000 on the same 6 items" in markdown
    assert f"Readers keep version {promoted['generation'][:12]}." in markdown
    assert "- held: index version " in markdown and "`ragpipe index promote " in markdown
    events = _ragpipe_events(index_resource(cfg)["prefect.resource.id"], 2)
    by_name = {e["event"]: e for e in events}
    assert set(by_name) == {"ragpipe.index.promoted", "ragpipe.index.held"}
    held = by_name["ragpipe.index.held"]["payload"]
    assert held["outcome"] == "held" and held["live_before"] == promoted["generation"]
    assert held["golden"][0]["delta"] == -0.5 and "fell by 0.5000" in held["reasons"][0]
    low, high = held["golden"][0]["delta_low"], held["golden"][0]["delta_high"]
    assert low is None is high  # 6 items, too few for a CI: the drop's mean decides
    assert by_name["ragpipe.index.promoted"]["payload"]["version"] == promoted["generation"]
    # Discarded by hand: the next nights say so and succeed, and tell no one it is held.
    gatekeep.discard_by_hand(cfg, held["version"][:12])
    assert ingest_flow(config=cfg, allow_mass_delete=True).gate["outcome"] == "discarded"
    with pytest.raises(IndexHeld):  # a new change, held again: the one more event
        (corpus / "wings.txt").write_text(topic_doc("wings", version=2), encoding="utf-8")
        ingest_flow(config=cfg, allow_mass_delete=True)
    names = [e["event"] for e in _ragpipe_events(index_resource(cfg)["prefect.resource.id"], 3)]
    assert sorted(names) == ["ragpipe.index.held", "ragpipe.index.held", "ragpipe.index.promoted"]


def test_a_gate_that_fails_leaves_a_summary_artifact_saying_so(
    prefect_harness: None, tmp_path: Path
) -> None:
    """A gate that raised (here a golden target naming no file) skipped the summary: the
    run had no ingest-summary artifact, only a traceback."""
    from prefect.artifacts import Artifact

    from flows.ingest import ingest_flow

    corpus = write_topics(tmp_path / "corpus", 2, ".txt")  # 2 of the 6 golden topics
    cfg = _config(corpus, tmp_path)
    with pytest.raises(GoldenMismatch) as failed:
        ingest_flow(config=cfg)
    summary = Artifact.get("ingest-summary")
    assert summary is not None
    assert f"- index gate: error: {failed.value}\n" in str(summary.data)
    assert "cannot be scored" in str(summary.data)


def test_a_gated_qdrant_index_refuses_a_collection_where_its_alias_goes(tmp_path: Path) -> None:
    corpus = write_topics(tmp_path / "corpus", 6, ".txt")
    plain = make_config(corpus, tmp_path, "qdrant")
    run_ingest(plain)  # no gate: the collection store.collection names, written in place
    with pytest.raises(ConfigError, match=r"store.collection 'ragpipe' is a collection"):
        run_ingest(_config(corpus, tmp_path, "qdrant"))
    runner = CliRunner()
    config_file = tmp_path / "plain.yaml"
    config_file.write_text(json.dumps(plain.model_dump(mode="json")), encoding="utf-8")
    refused = runner.invoke(app, ["index", "list", "--config", str(config_file)])
    assert refused.exit_code == 2 and "only with index.gate" in refused.output


def test_a_gated_qdrant_index_is_not_written_through_its_alias_with_the_gate_off(
    tmp_path: Path,
) -> None:
    """With index.gate taken out, an ingest opened store.collection, now the readers' alias,
    and wrote the live version's own collection in place: its record said 36 points while
    it held 45, and the version a roll-back returns to was no longer what was judged."""
    from ragpipe.store import server_versions

    corpus = write_topics(tmp_path / "corpus", 6, ".txt")
    gated = _config(corpus, tmp_path, "qdrant")
    live = run_ingest(gated).gate["generation"]
    (corpus / "extra.txt").write_text(topic_doc("extra"), encoding="utf-8")
    plain = make_config(corpus, tmp_path, "qdrant")  # the same store, no gate
    with pytest.raises(ConfigError, match=r"is the alias readers of a gated index query"):
        run_ingest(plain)
    (version,) = server_versions.list_versions(gated.store)
    assert version.generation == live and server_versions.current(gated.store) == live
    with server_versions._client(gated.store) as client:
        collection = server_versions.version_collection(gated.store, live)
        assert client.count(collection, exact=True).count == version.points


@BACKENDS
def test_a_roll_back_and_a_discard_survive_the_next_nightly(tmp_path: Path, backend: str) -> None:
    corpus = write_topics(tmp_path / "corpus", 6, ".txt")
    cfg = _config(corpus, tmp_path, backend)
    first = run_ingest(cfg).gate["generation"]
    (corpus / "wings.txt").write_text(topic_doc("wings", version=2), encoding="utf-8")
    second = run_ingest(cfg)
    assert second.gate["outcome"] == "promoted"
    gatekeep.promote_by_hand(cfg, first[:10])  # a roll-back
    again = run_ingest(cfg)  # nothing changed: the rolled-back version stays off
    assert again.gate["outcome"] == "rolled-back" and again.ok
    assert index_versions.current(cfg.store) == first

    held = _held_version(corpus, cfg)
    index_versions.discard(cfg.store, held)
    after = run_ingest(cfg)  # the same working version: not staged, judged or held again
    assert after.gate["outcome"] == "discarded" and after.ok
    assert held not in {v.generation for v in index_versions.list_versions(cfg.store)}
    assert index_versions.current(cfg.store) == first
    if backend != "edge":
        return
    # versions.json damaged, or removed as its error said: the discard was lost, and the
    # next night judged the discarded version again and promoted it. Its copy keeps it.
    status = published.root(cfg.store.path) / published.STATUS_FILE
    for damage in ("{truncated", None):
        if damage is None:
            status.unlink()
        else:
            status.write_text(damage, encoding="utf-8")
        kept = run_ingest(cfg)
        assert kept.gate["outcome"] == "discarded" and index_versions.current(cfg.store) == first
    copy = published.root(cfg.store.path) / published.STATUS_COPY
    status.write_text("{", encoding="utf-8")
    copy.write_text("{", encoding="utf-8")
    with pytest.raises(StageError, match=r"nor is its copy .*a version discarded or rolled "
                       r"back from by hand may be judged, and promoted, again"):  # fmt: skip
        run_ingest(cfg)


@BACKENDS
def test_held_versions_are_pruned_to_the_newest_three(tmp_path: Path, backend: str) -> None:
    corpus = write_topics(tmp_path / "corpus", 6, ".txt")
    cfg = _config(corpus, tmp_path, backend, max_drop=0.0, min_score=0.9)
    run_ingest(cfg)
    live = index_versions.current(cfg.store)
    (corpus / "cooking.txt").unlink()  # item "cooking" scores 0 from now on: every night held
    for night in range(5):
        (corpus / "wings.txt").write_text(topic_doc("wings", version=night + 2),
                                          encoding="utf-8")  # fmt: skip
        with pytest.raises(IndexHeld):
            run_ingest(cfg, allow_mass_delete=True)
    versions = index_versions.list_versions(cfg.store)
    assert [v.status for v in versions] == ["held", "held", "held", "promoted"]
    assert versions[-1].generation == live and versions[-1].live
    if backend == "edge":
        on_disk = [p for p in published.root(cfg.store.path).iterdir() if p.is_dir()]
        assert len([p for p in on_disk if p.name != published.READERS]) == 4
    else:  # a collection per version kept, beside the working collection
        from qdrant_client import QdrantClient

        client = QdrantClient(path=str(cfg.store.path))
        names = sorted(c.name for c in client.get_collections().collections)
        client.close()
        assert names == sorted(
            [f"ragpipe-ragpipe-{v.generation}" for v in versions]
            + ["ragpipe-ragpipe-versions", "ragpipe-ragpipe-work"]
        )


@BACKENDS
def test_a_first_version_held_then_discarded_stays_unreadable(tmp_path: Path, backend: str) -> None:
    corpus = write_topics(tmp_path / "corpus", 6, ".txt")
    canary = {"query": "gardening", "files": ["volcanoes.txt"], "k": 5}  # in no version
    cfg = _config(corpus, tmp_path, backend, canaries=[canary])
    with pytest.raises(IndexHeld):
        run_ingest(cfg)
    (held,) = index_versions.list_versions(cfg.store)
    index_versions.discard(cfg.store, held.generation)
    with pytest.raises(StageError, match=r"no version of the index .* is live"):
        Retriever(cfg)  # not the working shard the gate refused


def test_golden_items_for_a_new_document_are_not_a_mismatch(tmp_path: Path) -> None:
    corpus = write_topics(tmp_path / "corpus", 5, ".txt")  # cooking comes later
    golden = tmp_path / "golden.yaml"
    _golden(golden)  # six items, cooking's file absent from the first version
    items = golden.read_text(encoding="utf-8").split("  - id: cooking")[0].split("items:\n")[1]
    golden.write_text(f"name: topics\nitems:\n{items}", encoding="utf-8")
    cfg = make_config(corpus, tmp_path, index={"gate": {"golden": [golden], "min_score": 0.5}},
                      eval={"granularity": "file", "resamples": 200})  # fmt: skip
    run_ingest(cfg)
    (corpus / "cooking.txt").write_text(topic_doc("cooking"), encoding="utf-8")
    golden.write_text(  # the team labels the new document in the same change
        f"name: topics\nitems:\n{items}  - id: cooking\n    query: notes that explain "
        "cooking\n    relevance: {cooking.txt: 1}\n",
        encoding="utf-8",
    )
    added = run_ingest(cfg)
    assert added.gate["outcome"] == "promoted"
    (verdict,) = added.gate["verdict"]["golden"]
    assert verdict["new_items"] == ["cooking"] and verdict["items"] == 5  # compared: 5
    assert verdict["staged"] == 1.0 and verdict["delta"] == 0.0  # the new item scores 1 too
    assert verdict["staged_compared"] == 1.0  # the 5 compared items alone


def test_a_target_that_names_several_staged_files_holds_the_version_not_scores_it(
    tmp_path: Path,
) -> None:
    """The staged version rewrites cooking.txt about gardening and adds old/cooking.txt with
    the cooking notes. 'cooking.txt' now names both, and old/cooking.txt at rank 1 scored the
    item 1: the gate promoted a version whose labelled file lost its answer (delta 0 on 6
    items). Now the item is left out and the version held, or (eval.skip_unmatched) judged
    on the other 5 and the item listed."""
    corpus = write_topics(tmp_path / "corpus", 6, ".txt")
    cfg = _config(corpus, tmp_path)
    first = run_ingest(cfg)
    assert first.gate["outcome"] == "promoted"
    live = index_versions.current(cfg.store)
    (corpus / "old").mkdir()
    (corpus / "old" / "cooking.txt").write_text(topic_doc("cooking"), encoding="utf-8")
    (corpus / "cooking.txt").write_text(topic_doc("gardening", version=3), encoding="utf-8")
    with pytest.raises(IndexHeld, match=r"1 item\(s\) have a target that names several files"):
        run_ingest(cfg)
    assert index_versions.current(cfg.store) == live
    summary = json.loads((cfg.paths.work_dir / "summary.json").read_text(encoding="utf-8"))
    (golden,) = summary["gate"]["verdict"]["golden"]
    assert golden["items"] == 5 and golden["delta"] == 0.0  # the other 5, as before
    (line,) = golden["ambiguous_staged"]
    assert line.startswith('cooking: file "cooking.txt" matches 2 files in the index')

    lenient = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"skip_unmatched": True})})
    (corpus / "cooking.txt").write_text(topic_doc("gardening", version=4), encoding="utf-8")
    judged = run_ingest(lenient)
    assert judged.gate["outcome"] == "promoted"
    (golden,) = judged.gate["verdict"]["golden"]
    assert (golden["items"], golden["staged"], golden["live"]) == (5, 1.0, 1.0)
    assert golden["new_items"] == [] and len(golden["ambiguous_staged"]) == 1


def test_a_gate_set_left_with_nothing_to_judge_holds_even_when_skipping(tmp_path: Path) -> None:
    """Its one item's target names two staged files: with the item left out, no mean (not a
    NaN that no floor refuses) and the version held."""
    corpus = write_topics(tmp_path / "corpus", 2, ".txt")
    golden = tmp_path / "one.yaml"
    golden.write_text("name: one\nitems:\n  - id: wings\n    query: notes that explain wings\n"
                      "    relevance: {wings.txt: 1}\n", encoding="utf-8")  # fmt: skip
    gate = {"golden": [golden], "min_score": 0.5}
    lenient = {"granularity": "file", "resamples": 200, "skip_unmatched": True}
    cfg = make_config(corpus, tmp_path, index={"gate": gate}, eval=lenient)
    assert run_ingest(cfg).gate["outcome"] == "promoted"
    (corpus / "old").mkdir()
    (corpus / "old" / "wings.txt").write_text(topic_doc("wings", version=2), encoding="utf-8")
    with pytest.raises(IndexHeld, match=r"one: no answerable item is left to judge"):
        run_ingest(cfg)
    summary = json.loads((cfg.paths.work_dir / "summary.json").read_text(encoding="utf-8"))
    (verdict,) = summary["gate"]["verdict"]["golden"]
    assert verdict["staged"] is None and verdict["items"] == 0


def test_the_gate_line_sets_staged_against_live_on_the_same_items() -> None:
    """Four compared items score 0.75 on both versions, a new one 0 on the staged: the line
    read 'ndcg@10 0.6000 vs live 0.7500 (+0.0000)', a drop of 0.15 shown as none."""
    from ragpipe.evaluation.gate import GateVerdict, GoldenVerdict

    golden = GoldenVerdict("faq", 4, 0.6, 0.75, 0.0, None, None, None, True,
                           new_items=["new-doc"], staged_compared=0.75)  # fmt: skip
    first = GoldenVerdict("first", 5, 0.8, None, None, None, None, None, True)
    line = GateVerdict("abcdef1234567", "live", "ndcg@10", 0.02, True, [], [golden, first], [],
                       1.0).line()  # fmt: skip
    assert line == (
        "version abcdef123456 promoted: faq: ndcg@10 0.7500 vs live 0.7500 (+0.0000) on the "
        "same 4 items, 0.6000 with the 1 new; first: ndcg@10 0.8000"
    )


def test_a_qdrant_index_keeps_other_collections_and_a_promotion_killed_before_its_switch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qdrant_client import QdrantClient

    corpus = write_topics(tmp_path / "corpus", 6, ".txt")
    cfg = _config(corpus, tmp_path, "qdrant")
    first = run_ingest(cfg).gate["generation"]
    client = QdrantClient(path=str(cfg.store.path))
    for name in ("ragpipe-ragpipe-archive", "ragpipe-ragpipe-x-ragpipe-work"):  # not ours
        client.create_collection(name, vectors_config={})
    client.close()

    def killed(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("killed before the switch")

    (corpus / "wings.txt").write_text(topic_doc("wings", version=2), encoding="utf-8")
    monkeypatch.setattr(QdrantClient, "update_collection_aliases", killed)
    with pytest.raises(RuntimeError, match="killed before the switch"):
        run_ingest(cfg)
    monkeypatch.undo()
    assert index_versions.current(cfg.store) == first  # readers never saw the half promotion
    staged = [v.generation for v in index_versions.list_versions(cfg.store) if not v.live]
    assert len(staged) == 1  # recorded as promoted, its collection kept
    again = run_ingest(cfg)  # the same working version: promoted now
    assert again.gate["outcome"] == "promoted" and again.gate["generation"] == staged[0]
    assert _aliases(cfg) == {"ragpipe": f"ragpipe-ragpipe-{staged[0]}"}
    client = QdrantClient(path=str(cfg.store.path))
    names = {c.name for c in client.get_collections().collections}
    client.close()
    assert {"ragpipe-ragpipe-archive", "ragpipe-ragpipe-x-ragpipe-work"} <= names


def _damage(cfg: RagpipeConfig, generation: str) -> None:
    from ragpipe.store import published

    copy = published.root(cfg.store.path) / generation
    largest = max((p for p in copy.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    largest.write_bytes(b"")


def test_a_damaged_live_version_of_a_gated_index_is_published_again(tmp_path: Path) -> None:
    """As without a gate: a live version cut short is written again, under a new token and
    live at once (the gate passed that index already), reported as published, and the
    version it replaced stays the one to roll back to; the damaged copy goes."""
    from ragpipe.store import published

    corpus = write_topics(tmp_path / "corpus", 6, ".txt")
    cfg = _config(corpus, tmp_path)
    first = run_ingest(cfg)
    (corpus / "extra.txt").write_text("The knitting circle meets on Tuesdays.\n", "utf-8")
    second = run_ingest(cfg)
    before, live = first.gate["generation"], index_versions.current(cfg.store)
    assert second.gate["outcome"] == "promoted" and live == second.gate["generation"]
    _damage(cfg, live)
    with pytest.raises(StageError, match=r"is damaged .* the next `ragpipe ingest` publishes"):
        _points(cfg)
    with pytest.raises(StageError, match=r"is damaged .* cannot be made live"):
        index_versions.promote(cfg.store, live)
    again = run_ingest(cfg)
    renewed = index_versions.current(cfg.store)
    assert renewed not in (None, live, before) and again.failed == 0
    assert again.stages["upsert"]["published"] == 1  # it said 0: a new version went live
    assert _points(cfg) == second.points_total
    statuses = published.statuses(cfg.store.path)
    assert statuses[renewed]["previous"] == before and statuses[renewed]["keep_previous"]
    assert live not in statuses and sorted(statuses) == sorted([before, renewed])
    assert _points(cfg, before) == first.points_total  # still there to roll back to


def test_a_changed_corpus_over_a_damaged_live_version_is_judged_as_a_first_version(
    tmp_path: Path,
) -> None:
    """The gate opened the damaged live version to compare with, and every ingest failed
    on it ("the next ingest publishes the index again", which never came)."""
    corpus = write_topics(tmp_path / "corpus", 6, ".txt")
    cfg = _config(corpus, tmp_path)
    first = run_ingest(cfg)
    live = index_versions.current(cfg.store)
    assert live is not None
    _damage(cfg, live)
    (corpus / "extra.txt").write_text("The knitting circle meets on Tuesdays.\n", "utf-8")
    again = run_ingest(cfg)
    assert (
        again.gate["outcome"] == "promoted" and again.gate["verdict"]["golden"][0]["live"] is None
    )
    assert index_versions.current(cfg.store) == again.gate["generation"] != live
    assert _points(cfg) == first.points_total + again.chunks_written - again.chunks_deleted


def test_a_live_version_whose_folder_is_gone_is_damaged_not_a_crash(tmp_path: Path) -> None:
    """A live version's folder removed by hand (or lost to a disk): readers said the
    versions "changed five times while opening one; try again", and the gate judged the
    next version against it and failed with "no index versions match" every night."""
    import shutil

    corpus = write_topics(tmp_path / "corpus", 6, ".txt")
    cfg = _config(corpus, tmp_path)
    first = run_ingest(cfg)
    live = index_versions.current(cfg.store)
    assert live is not None
    shutil.rmtree(published.root(cfg.store.path) / live)
    assert index_versions.damaged(cfg.store, live)
    with pytest.raises(StageError, match=r"is damaged \(its folder is gone\); the next `ragpi"):
        _points(cfg)
    (corpus / "extra.txt").write_text("The knitting circle meets on Tuesdays.\n", "utf-8")
    again = run_ingest(cfg)
    assert again.gate["outcome"] == "promoted"
    assert again.gate["verdict"]["golden"][0]["live"] is None  # judged as a first version
    assert index_versions.current(cfg.store) == again.gate["generation"] != live
    assert _points(cfg) == first.points_total + again.chunks_written - again.chunks_deleted


def test_a_damaged_held_version_is_written_again_and_the_roll_back_target_survives(
    tmp_path: Path,
) -> None:
    """The third review: a held version cut short stayed so (promote refused it, discard
    left the intact working index unable to go live); a version promoted over a damaged
    live one dropped the intact version to roll back to."""
    from ragpipe.store import published

    corpus = write_topics(tmp_path / "corpus", 6, ".txt")
    cfg = _config(corpus, tmp_path)
    first = run_ingest(cfg)
    (corpus / "extra.txt").write_text("The knitting circle meets on Tuesdays.\n", "utf-8")
    second = run_ingest(cfg)
    before, live = first.gate["generation"], second.gate["generation"]
    for topic in TOPICS[3:]:
        (corpus / f"{topic}.txt").unlink()
    with pytest.raises(IndexHeld):
        run_ingest(cfg, allow_mass_delete=True)
    held = index_versions.working_generation(cfg.store)
    assert held is not None and held not in (before, live)
    _damage(cfg, held)
    with pytest.raises(IndexHeld):  # still held, and whole again: promotable by hand
        run_ingest(cfg, allow_mass_delete=True)
    assert published.intact(published.root(cfg.store.path) / held)
    _damage(cfg, live)  # the live version now: the held one is judged against `before`
    with pytest.raises(IndexHeld, match="fell by"):
        run_ingest(cfg, allow_mass_delete=True)
    with pytest.raises(StageError, match=r"puts the working index in its place"):
        _points(cfg)
    index_versions.promote(cfg.store, before)  # roll back: still there
    assert _points(cfg) == first.points_total


def test_a_promotion_killed_before_its_event_is_announced_the_next_night(
    tmp_path: Path,
) -> None:
    """A run killed after the switch, before ``ragpipe.index.promoted`` was sent: no later
    night decided anything (the version was live), so the event, and the evaluation it
    triggers, were lost for good; gate.json kept the night before's verdict."""
    corpus = write_topics(tmp_path / "corpus", 6, ".txt")
    cfg = _config(corpus, tmp_path)
    first = run_ingest(cfg).gate["generation"]
    (corpus / "wings.txt").write_text(topic_doc("wings", version=2), encoding="utf-8")
    second = run_ingest(cfg)
    gate_file = cfg.paths.work_dir / "gate.json"
    said = json.loads(gate_file.read_text(encoding="utf-8"))
    assert (said["outcome"], said["announced"]) == ("promoted", True)
    assert run_ingest(cfg).gate == {}  # announced: a no-op night decides nothing
    for killed in (
        {**said, "announced": False},  # after the switch, before the event
        {
            "outcome": "pending",
            "generation": said["generation"],
            "live_before": first,
            "announced": False,
        },
    ):  # at the verdict's write
        gate_file.write_text(json.dumps(killed), encoding="utf-8")
        late = run_ingest(cfg).gate
        assert (late["outcome"], late["generation"], late["live_before"]) == (
            "promoted", second.gate["generation"], first)  # fmt: skip
        assert late["line"].endswith("stopped before announcing it: announced now")
        assert run_ingest(cfg).gate == {}  # once
    # A version promoted by hand: `index promote` sent its own event; never again.
    gatekeep.promote_by_hand(cfg, first[:12])
    gatekeep.promote_by_hand(cfg, second.gate["generation"][:12])
    gate_file.write_text(json.dumps({**said, "announced": False}), encoding="utf-8")
    assert run_ingest(cfg).gate == {}


def test_a_promotion_by_hand_killed_before_its_switch_is_finished_not_judged_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ragpipe index promote` records the version, then switches: killed between, the next
    ingest took the record for a gate's killed promotion, judged the version again and held
    it, and the person's decision was lost (the kill/resume review)."""
    corpus = write_topics(tmp_path / "corpus", 6, ".txt")
    cfg = _config(corpus, tmp_path)
    first = run_ingest(cfg).gate["generation"]
    held = _held_version(corpus, cfg)
    write = published.atomic_write_bytes

    def killed(path: Path, data: bytes) -> None:
        if path.name == published.CURRENT:
            raise KeyboardInterrupt  # as a kill would, before the switch
        write(path, data)

    monkeypatch.setattr(published, "atomic_write_bytes", killed)
    with pytest.raises(KeyboardInterrupt):
        gatekeep.promote_by_hand(cfg, held[:12])
    monkeypatch.undo()
    assert index_versions.current(cfg.store) == first  # readers never saw half of it
    after = run_ingest(cfg, allow_mass_delete=True)
    assert (after.gate["outcome"], after.gate["generation"]) == ("promoted", held)
    assert after.gate["live_before"] == first and after.ok
    assert after.gate["line"].endswith(f"finished now (was {first[:12]})")
    assert index_versions.current(cfg.store) == held
    assert run_ingest(cfg, allow_mass_delete=True).gate == {}  # once


def test_a_discard_killed_before_its_folder_is_removed_stays_a_discard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder went first, then the record: killed between, the version was staged
    again the next night and held ("still held") every night after."""
    corpus = write_topics(tmp_path / "corpus", 6, ".txt")
    cfg = _config(corpus, tmp_path)
    run_ingest(cfg)
    held = _held_version(corpus, cfg)

    def killed(base: Path, generation: str) -> bool:
        raise KeyboardInterrupt  # as a kill would, before the folder goes

    monkeypatch.setattr(published, "_remove_version", killed)
    with pytest.raises(KeyboardInterrupt):
        index_versions.discard(cfg.store, held)
    monkeypatch.undo()
    after = run_ingest(cfg, allow_mass_delete=True)
    assert after.gate["outcome"] == "discarded" and after.ok


def test_a_version_the_gate_could_not_judge_is_listed_as_waiting(tmp_path: Path) -> None:
    """A gate that failed (a golden target naming no file) left the version staged, and
    `ragpipe index list` said "not gated" on a gated index; gate.json kept the night
    before's verdict."""
    corpus = write_topics(tmp_path / "corpus", 6, ".txt")
    cfg = _config(corpus, tmp_path)
    run_ingest(cfg)
    golden = Path(cfg.index.gate.golden[0])  # type: ignore[union-attr]
    golden.write_text(golden.read_text(encoding="utf-8") + "  - id: typo\n    query: q\n"
                      "    relevance: {engins.txt: 1}\n", encoding="utf-8")  # fmt: skip
    (corpus / "wings.txt").write_text(topic_doc("wings", version=2), encoding="utf-8")
    with pytest.raises(GoldenMismatch):
        run_ingest(cfg)
    gate = json.loads((cfg.paths.work_dir / "gate.json").read_text(encoding="utf-8"))
    assert gate["outcome"] == "pending"
    config_file = tmp_path / "ragpipe.yaml"
    config_file.write_text(json.dumps(cfg.model_dump(mode="json")), encoding="utf-8")
    listed = CliRunner().invoke(app, ["index", "list", "--config", str(config_file)],
                                env={"COLUMNS": "200"})  # fmt: skip
    assert listed.exit_code == 0 and "not judged yet (the next ingest judges it)" in listed.output
