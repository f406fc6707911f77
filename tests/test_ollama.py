"""The ollama embedder end to end: the real ollama client against a loopback
server that speaks the Ollama API and runs the real local ONNX model."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import numpy as np
import pytest

from ragpipe.config import EmbedConfig
from ragpipe.errors import StageError
from ragpipe.models.embedders import OllamaEmbedder, OnnxEmbedder, make_embedder
from tests.support.ollama_server import ollama_server

pytestmark = pytest.mark.integration

TEXTS = ["first passage about R packages", "second passage about aircraft", "third"]


def test_batched_embed_through_the_api_matches_the_model(onnx_embedder: OnnxEmbedder) -> None:
    with ollama_server({"all-minilm": onnx_embedder}) as (host, state):
        embedder = make_embedder(
            EmbedConfig(provider="ollama", model="all-minilm", ollama_host=host, batch_size=2)  # type: ignore[arg-type]
        )
        vectors = embedder.embed_documents(TEXTS)
        assert embedder.dim == 384 and embedder.name == "ollama:all-minilm"
    np.testing.assert_allclose(vectors, onnx_embedder.embed_documents(TEXTS), atol=1e-5)
    embeds = [r["body"]["input"] for r in state.requests if r["path"] == "/api/embed"]
    assert embeds == [TEXTS[:2], TEXTS[2:]]  # batched lists, no prefixes for this model


def test_nomic_prefixes_and_api_key_are_sent(onnx_embedder: OnnxEmbedder) -> None:
    with ollama_server({"nomic-embed-text": onnx_embedder}) as (host, state):
        embedder = make_embedder(
            EmbedConfig(provider="ollama", ollama_host=host, ollama_api_key="s3cret")  # type: ignore[arg-type]
        )
        embedder.embed_documents(["a passage"])
        query = embedder.embed_query("a question")
    inputs = [r["body"]["input"] for r in state.requests]
    assert inputs == [["search_document: a passage"], ["search_query: a question"]]
    assert {r["auth"] for r in state.requests} == {"Bearer s3cret"}
    np.testing.assert_allclose(
        query, onnx_embedder.embed_query("search_query: a question"), atol=1e-5
    )


def test_transient_server_errors_are_retried(onnx_embedder: OnnxEmbedder) -> None:
    with ollama_server({"all-minilm": onnx_embedder}) as (host, state):
        state.fail_next = [503, 500]
        embedder = OllamaEmbedder("all-minilm", host=host, retries=2)
        vectors = embedder.embed_documents(TEXTS)
    assert vectors.shape == (3, 384)
    assert len(state.requests) == 3  # two failures, then success


def test_retries_are_bounded(onnx_embedder: OnnxEmbedder) -> None:
    with ollama_server({"all-minilm": onnx_embedder}) as (host, state):
        state.fail_next = [500, 500, 500]
        embedder = OllamaEmbedder("all-minilm", host=host, retries=1)
        with pytest.raises(StageError, match="failed after 2 attempt"):
            embedder.embed_documents(TEXTS)
    assert len(state.requests) == 2


def test_missing_model_says_to_pull_it(onnx_embedder: OnnxEmbedder) -> None:
    with ollama_server({"all-minilm": onnx_embedder}) as (host, _):
        embedder = OllamaEmbedder("nomic-embed-text", host=host, retries=3)
        with pytest.raises(StageError, match="ollama pull nomic-embed-text"):
            embedder.embed_documents(TEXTS)


def test_unreachable_server_is_a_clear_error_fast() -> None:
    with socket.socket() as sock:  # a loopback port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    embedder = OllamaEmbedder("all-minilm", host=f"http://127.0.0.1:{port}", retries=1)
    started = time.monotonic()
    with pytest.raises(StageError, match="ollama serve") as info:
        embedder.embed_documents(TEXTS)
    assert f"127.0.0.1:{port}" in str(info.value)
    assert time.monotonic() - started < 5


def test_ingest_with_ollama_down_fails_before_any_conversion(tmp_path: Path) -> None:
    from ragpipe.config import RagpipeConfig
    from ragpipe.ingest.pipeline import run_ingest

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.md").write_text("# A\n\ntext\n", encoding="utf-8")
    cfg = RagpipeConfig(
        discover={"roots": [tmp_path / "corpus"]},  # type: ignore[arg-type]
        embed={"provider": "ollama", "ollama_host": f"http://127.0.0.1:{port}", "retries": 0},  # type: ignore[arg-type]
        store={"path": tmp_path / "store"},  # type: ignore[arg-type]
        paths={"work_dir": tmp_path / "work"},  # type: ignore[arg-type]
    )
    with pytest.raises(StageError, match="ollama serve"):
        run_ingest(cfg)
    assert not (tmp_path / "work" / "convert").exists()  # no work was started
    assert not (tmp_path / "work" / "plan" / "manifest.json").exists()  # nor marked done
