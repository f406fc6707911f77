"""Scale-out: the ingest flow on a local Dask cluster of 2 worker processes gives the
same point set as the default runner, with conversion and embedding fanned out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ragpipe.config import RagpipeConfig
from ragpipe.store import open_store
from tests.support.paths import QUERY_CORPUS

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _config(corpus: Path, base: Path) -> RagpipeConfig:
    return RagpipeConfig(
        discover={"roots": [corpus]},  # type: ignore[arg-type]
        chunk={"size": 200, "overlap": 20},  # type: ignore[arg-type]
        embed={"provider": "onnx"},  # type: ignore[arg-type]
        store={"path": base / "store"},  # type: ignore[arg-type]
        paths={"work_dir": base / "work"},  # type: ignore[arg-type]
    )


def _points(cfg: RagpipeConfig) -> dict[str, Any]:
    store = open_store(cfg.store, "paraphrase-MiniLM-L3-v2", None)
    assert store is not None
    try:
        return {h.point_id: (h.payload["text"], h.payload["source_sha"]) for h in store.scroll()}
    finally:
        store.close()


def test_dask_runner_gives_the_same_point_set(prefect_harness: None, tmp_path: Path) -> None:
    from flows.ingest import dask_ingest_flow, ingest_flow

    corpus = tmp_path / "corpus"
    for name, text in QUERY_CORPUS.items():
        (corpus / name).parent.mkdir(parents=True, exist_ok=True)
        (corpus / name).write_text(text, encoding="utf-8")
    plain = _config(corpus, tmp_path / "plain")
    fanned = _config(corpus, tmp_path / "dask")
    ingest_flow(config=plain)
    summary = dask_ingest_flow(workers=2)(config=fanned, batch_size=2)
    assert summary.added == 5 and summary.failed == 0
    # The batches did the work (a fresh work dir would otherwise convert and embed
    # everything in the stages): the stages only assembled cached documents and vectors.
    assert summary.stages["convert"]["converted"] == 0
    assert summary.stages["embed"]["embedded"] == 0
    assert summary.stages["embed"]["reused"] == summary.chunks > 0
    assert _points(fanned) == _points(plain)
