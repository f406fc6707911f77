"""Embedders: unit vectors in input order, Matryoshka, contextual prefix, fingerprints."""

from __future__ import annotations

import numpy as np
import pytest

from ragpipe.config import EmbedConfig
from ragpipe.errors import ConfigError
from ragpipe.ingest.chunk import TokenCounter
from ragpipe.models.embedders import (
    LocalEmbedder,
    OnnxEmbedder,
    TruncatedEmbedder,
    contextual_text,
    embedder_fingerprint,
    embedder_name,
    fit_context,
    length_sorted_batches,
    make_embedder,
    normalise,
)

pytestmark = pytest.mark.integration

TEXTS = [
    "R is a language and environment for statistical computing and graphics.",
    "The cat sat on the mat.",
    "How can I install a package from CRAN? Use install.packages() at the prompt. " * 6,
    "x",
    "Aircraft inspection intervals depend on the maintenance programme.",
]


def test_length_sorted_batches_cover_every_index_once() -> None:
    batches = list(length_sorted_batches(TEXTS, 2))
    assert sorted(i for b in batches for i in b) == list(range(len(TEXTS)))
    assert [len(b) for b in batches] == [2, 2, 1]
    assert batches[0][0] == 2  # longest first


def test_onnx_rows_are_unit_length_and_in_input_order(onnx_embedder: OnnxEmbedder) -> None:
    onnx_embedder.batch_size = 2
    together = onnx_embedder.embed_documents(TEXTS)
    assert together.shape == (5, 384) and together.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    one_by_one = np.stack([onnx_embedder.embed_query(t) for t in TEXTS])
    np.testing.assert_allclose(together, one_by_one, atol=1e-5)
    # semantic sanity: the R question is closest to the R sentence, not the cat
    q = onnx_embedder.embed_query("statistical computing language")
    assert int(np.argmax(together @ q)) == 0


def test_onnx_mean_pooling_matches_the_models_own_pooled_output(
    onnx_embedder: OnnxEmbedder,
) -> None:
    session = onnx_embedder._session
    pooled_outputs = [
        o.name for o in session.get_outputs() if len(o.shape) == 2 and o.shape[1] == 384
    ]
    assert pooled_outputs, "the packaged export has a pooled (batch, 384) output"
    enc = onnx_embedder._tokenizer.encode_batch(TEXTS)
    feeds = {
        "input_ids": np.array([e.ids for e in enc], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
    }
    (reference,) = session.run([pooled_outputs[0]], feeds)
    np.testing.assert_allclose(
        onnx_embedder.embed_documents(TEXTS), normalise(reference), atol=1e-5
    )


def test_local_minilm_matches_raw_sentence_transformers(local_embedder: LocalEmbedder) -> None:
    local_embedder.batch_size = 2
    ours = local_embedder.embed_documents(TEXTS)
    raw = local_embedder._model.encode(TEXTS, batch_size=32, normalize_embeddings=True)
    np.testing.assert_allclose(ours, raw, atol=1e-5)
    assert (local_embedder.name, local_embedder.dim, local_embedder.max_tokens) == (
        "all-MiniLM-L6-v2",
        384,
        256,
    )


def test_matryoshka_truncates_and_renormalises(onnx_embedder: OnnxEmbedder) -> None:
    small = TruncatedEmbedder(onnx_embedder, 128)
    full = onnx_embedder.embed_documents(TEXTS)
    cut = small.embed_documents(TEXTS)
    assert cut.shape == (5, 128) and small.dim == 128
    np.testing.assert_allclose(cut, normalise(full[:, :128]), atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1.0, atol=1e-5)
    assert small.name == "paraphrase-MiniLM-L3-v2@128"
    with pytest.raises(ConfigError, match="exceeds"):
        TruncatedEmbedder(onnx_embedder, 1000)


def test_make_embedder_names_match_config_without_loading() -> None:
    cfg = EmbedConfig(provider="onnx", dimensions=64)  # type: ignore[arg-type]
    assert embedder_name(cfg) == "paraphrase-MiniLM-L3-v2@64"
    embedder = make_embedder(cfg)
    assert embedder.name == "paraphrase-MiniLM-L3-v2@64" and embedder.dim == 64
    assert embedder_name(EmbedConfig(provider="ollama")) == "ollama:nomic-embed-text"  # type: ignore[arg-type]


def test_fingerprint_follows_what_changes_vectors_only() -> None:
    base = embedder_fingerprint(EmbedConfig())
    same = [
        EmbedConfig(batch_size=4),
        EmbedConfig(timeout_s=5, retries=0, ollama_host="http://x:1"),
        EmbedConfig(ollama_api_key="secret"),  # type: ignore[arg-type]
        EmbedConfig(query_prefix="q: "),
    ]
    assert {embedder_fingerprint(c) for c in same} == {base}
    different = [
        EmbedConfig(contextual_prefix=False),
        EmbedConfig(dimensions=128),
        EmbedConfig(provider="onnx"),  # type: ignore[arg-type]
        EmbedConfig(document_prefix="doc: "),
    ]
    prints = {embedder_fingerprint(c) for c in different}
    assert base not in prints and len(prints) == len(different)


def test_contextual_text_is_the_heading_path_without_the_file_path() -> None:
    assert contextual_text(["Intro", "Setup"], "Body.") == "Intro > Setup\nBody."
    assert contextual_text([], "Body.") == "Body."
    assert contextual_text(["", " "], "Body.") == "Body."


def test_fit_context_shortens_the_prefix_never_the_text() -> None:
    counter = TokenCounter("all-MiniLM-L6-v2")
    text = "word " * 200
    headings = ["A very long outer heading " * 3, "Middle section heading", "Inner"]
    full = contextual_text(headings, text)
    assert counter.count(full) > 215
    fitted, trimmed = fit_context(headings, text, 215, counter)
    assert trimmed and fitted.endswith(text) and counter.count(fitted) <= 215
    assert fitted.startswith("Middle section heading > Inner\n")  # the outer heading went first
    untouched, trimmed = fit_context(headings, "short", 215, counter)
    assert not trimmed and untouched == contextual_text(headings, "short")
    bare, trimmed = fit_context(headings, "word " * 260, 215, counter)
    assert trimmed and bare == "word " * 260
