"""SIGKILL an ingest at every stage, re-run it, and compare with a clean run.

The scenario is a nightly re-index: an index of five files exists, then one
file changes, one is added and one is removed. A child process runs that
re-index and kills itself (SIGKILL: no cleanup of any kind) at one point; the
next run in this process must converge to exactly the store a clean run over
the new files builds: same point ids and payloads, no orphans, no duplicates,
nothing missing, and no half-written checkpoint taken for a finished one.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from ragpipe import checkpoint
from ragpipe.config import RagpipeConfig
from ragpipe.ingest.pipeline import run_ingest
from tests.support.corpora import (
    TOPICS,
    assert_versions_current,
    make_config,
    stored,
    topic_doc,
)
from tests.support.crash import crash, temp_files
from tests.support.crash_ingest import POINTS

pytestmark = pytest.mark.integration

# The stage each point kills, and the manifests that must not claim it finished.
NOT_DONE = {
    "convert": ["convert", "clean", "chunk", "embed", "upsert"],
    "convert-output": ["convert", "clean", "chunk", "embed", "upsert"],
    "clean": ["clean", "chunk", "embed", "upsert"],
    "chunk": ["chunk", "embed", "upsert"],
    "embed": ["embed", "upsert"],
    "upsert": ["upsert"],
    "delete": ["upsert"],
    "delete-partial": ["upsert"],
    "versions": ["upsert"],
    "upsert-manifest": ["upsert"],
}


def _without_time(points: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {pid: {k: v for k, v in p.items() if k != "ingested_at"} for pid, p in points.items()}


class Scenario:
    """The corpus after the change, a snapshot of the index before it, and a clean run."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.corpus = base / "corpus"
        self.corpus.mkdir()
        for topic in TOPICS[:5]:
            (self.corpus / f"{topic}.md").write_text(topic_doc(topic), encoding="utf-8")
        # The files the re-index converts are plain text, so the child process does
        # not spend 5 s importing Docling; conversion's caching is the same for all kinds.
        (self.corpus / "notes.txt").write_text(topic_doc("notes"), encoding="utf-8")
        for backend in ("edge", "qdrant"):
            run_ingest(make_config(self.corpus, base / "before", backend))
        (self.corpus / "notes.txt").write_text(topic_doc("notes", version=2), encoding="utf-8")
        (self.corpus / f"{TOPICS[5]}.txt").write_text(topic_doc(TOPICS[5]), encoding="utf-8")
        (self.corpus / "wings.md").unlink()
        self.clean: dict[str, dict[str, dict[str, Any]]] = {}
        for backend in ("edge", "qdrant"):
            cfg = make_config(self.corpus, base / "clean", backend)
            run_ingest(cfg)
            self.clean[backend] = _without_time(stored(cfg))

    def copy_before(self, tmp_path: Path, backend: str) -> RagpipeConfig:
        """A private copy of the pre-change index (store and work dir) to crash into."""
        for name in (f"store-{backend}", f"work-{backend}"):
            shutil.copytree(self.base / "before" / name, tmp_path / name)
        return make_config(self.corpus, tmp_path, backend)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    return Scenario(tmp_path_factory.mktemp("crash-scenario"))


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("point", POINTS)
def test_sigkill_then_rerun_equals_a_clean_run(
    scenario: Scenario, tmp_path: Path, point: str
) -> None:
    cfg = scenario.copy_before(tmp_path, "edge")
    old_manifests = {
        stage: checkpoint.read_manifest(cfg.paths.work_dir / stage) for stage in NOT_DONE[point]
    }
    crash(cfg, point)

    for stage in NOT_DONE[point]:  # no stage the kill interrupted is marked done
        assert checkpoint.read_manifest(cfg.paths.work_dir / stage) == old_manifests[stage], stage
    if point in ("convert-output", "embed", "versions", "upsert-manifest"):
        assert temp_files(cfg), "the kill should have left a half-finished temp file"

    summary = run_ingest(cfg)
    assert summary.ok and summary.failed == 0
    final = _without_time(stored(cfg))
    assert final == scenario.clean["edge"]  # same ids and payloads: nothing lost or extra
    assert summary.points_total == len(final)
    assert_versions_current(cfg)
    assert temp_files(cfg) == []

    again = run_ingest(cfg)  # and the run after that has nothing left to do
    assert (again.chunks_written, again.chunks_deleted, again.converted) == (0, 0, 0)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("point", ["upsert", "delete-partial"])
def test_sigkill_on_the_qdrant_backend_converges_too(
    scenario: Scenario, tmp_path: Path, point: str
) -> None:
    cfg = scenario.copy_before(tmp_path, "qdrant")
    crash(cfg, point)
    summary = run_ingest(cfg)
    assert summary.ok
    assert _without_time(stored(cfg)) == scenario.clean["qdrant"]
