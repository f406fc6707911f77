"""Query embedding without torch: the index's own sentence-transformers model, exported
once to ONNX and run with onnxruntime.

A search embeds a handful of words; loading torch, transformers and
sentence-transformers to do it costs seconds per CLI call and most of a served
search's time. ``export`` turns the installed model (the packaged all-MiniLM-L6-v2,
or ``embed.model``) into an ONNX graph in the model cache, keyed by the SHA-256 of
the model's files, and **verifies** it before anyone uses it: every probe query
(``PROBES``, plus the questions of the golden sets under ``eval/golden``) must
embed with cosine >= ``MIN_COSINE`` against the torch model, else the graph is
refused (recorded, with the worst cosine) and the torch path stays in use.

``query_embedder`` is what the query side (search, ask, serve, evals) calls: the
verified graph when there is one (exporting it on first use when torch is there
to do so), else the torch embedder. Tokenisation is the model's own
``tokenizer.json`` with its ``max_seq_length``; pooling and normalisation follow its
``modules.json``. The ingest keeps sentence-transformers (see the README for why).

Run ``python -m ragpipe.models.onnx_query`` to export at setup (``make setup`` does).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragpipe.config import EmbedConfig, QueryRuntime
from ragpipe.errors import ConfigError
from ragpipe.models.embedders import (
    Embedder,
    Matrix,
    _embed_sorted,
    _packaged_minilm,
    _row,
    embedder_name,
    normalise,
)

logger = logging.getLogger(__name__)

MIN_COSINE = 0.9999
GRAPH = "model.onnx"
VERDICT = "verified.json"
MODEL_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json",
               "modules.json", "sentence_bert_config.json", "1_Pooling/config.json")  # fmt: skip

# Probe queries: short and long, cased, punctuated, non-ASCII, and one past the window
# (truncation must agree too).
PROBES = (
    "How should I cite R?",
    "What is the capital of France?",
    "restore the database from last night's backup",
    "Is it safe to grant the admin role to every user?",
    "dpkg: error processing package (--configure)",
    "Café crème, naïve façade, Zürich — Ångström units",
    "apt-get install foo=1.2.3-1~bpo12+1",
    "Why does my Debian system not boot after upgrading the kernel?",
    "x",
    " ".join(["long query about packages, mirrors and release codenames"] * 40),
)


def model_key(model_dir: Path) -> str:
    """SHA-256 (16 hex) over the model's files that shape its vectors."""
    digest = hashlib.sha256()
    for name in MODEL_FILES:
        path = model_dir / name
        if path.is_file():
            digest.update(name.encode())
            with open(path, "rb") as fh:
                digest.update(hashlib.file_digest(fh, "sha256").digest())
    return digest.hexdigest()[:16]


def graph_dir(model_dir: Path) -> Path:
    from ragpipe.models.packaged import cache_dir

    return cache_dir() / "onnx" / f"{model_dir.name}-{model_key(model_dir)}"


def _probe_queries() -> list[str]:
    """PROBES plus the questions of the golden sets shipped beside the code (if any)."""
    queries = list(PROBES)
    golden = Path(__file__).resolve().parents[3] / "eval" / "golden"
    if golden.is_dir():
        import yaml

        for path in sorted(golden.glob("*.yaml")):
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            queries += [str(i["query"]) for i in data.get("items") or [] if i.get("query")]
    return queries


def export(model_dir: Path) -> Path | None:
    """Export ``model_dir`` (a sentence-transformers model) to ONNX and verify it; the
    graph's directory, or None when verification refused it (the reason is recorded and
    logged). Needs torch, transformers and onnx (the ingest side's packages)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    target = graph_dir(model_dir)
    target.mkdir(parents=True, exist_ok=True)
    model = AutoModel.from_pretrained(str(model_dir), local_files_only=True,
                                      attn_implementation="eager").eval()  # fmt: skip

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids)  # fmt: skip
            return out.last_hidden_state

    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {n: {0: "batch", 1: "tokens"} for n in [*names, "last_hidden_state"]}
    example = tuple(torch.ones(2, 8, dtype=torch.long) for _ in names)
    tmp = target / f".{GRAPH}.tmp"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(Encoder(), example, str(tmp), input_names=names,
                          output_names=["last_hidden_state"], dynamic_axes=axes,
                          opset_version=17, dynamo=False)  # fmt: skip
    tmp.replace(target / GRAPH)
    reference = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    queries = _probe_queries()
    expected = reference.encode(queries, normalize_embeddings=True, convert_to_numpy=True,
                                show_progress_bar=False)  # fmt: skip
    got = OnnxQueryEmbedder(model_dir, target / GRAPH, verified=False).embed_documents(queries)
    cosines = np.sum(normalise(np.asarray(expected, np.float32)) * got, axis=1)
    worst = float(cosines.min())
    verdict = {"model": str(model_dir), "key": model_key(model_dir), "queries": len(queries),
               "min_cosine": worst, "passed": worst >= MIN_COSINE}  # fmt: skip
    (target / VERDICT).write_text(json.dumps(verdict, indent=1), encoding="utf-8")
    if worst < MIN_COSINE:
        logger.warning("ONNX export of %s refused: cosine %.6f < %s on %d probe queries; "
                       "queries keep the torch path", model_dir.name, worst, MIN_COSINE,
                       len(queries))  # fmt: skip
        return None
    logger.info("ONNX query graph of %s verified (min cosine %.6f on %d queries): %s",
                model_dir.name, worst, len(queries), target)  # fmt: skip
    return target


def verified_graph(model_dir: Path) -> tuple[Path | None, dict[str, Any] | None]:
    """(the verified graph, its verdict) of ``model_dir``; (None, verdict) when refused,
    (None, None) when not exported yet."""
    target = graph_dir(model_dir)
    try:
        verdict = json.loads((target / VERDICT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, None
    if verdict.get("passed") and (target / GRAPH).is_file():
        return target / GRAPH, verdict
    return None, verdict


class OnnxQueryEmbedder:
    """A sentence-transformers model's exported graph run with onnxruntime: its own
    tokenizer and window, mean pooling, normalisation. Same name as the torch embedder
    (the store checks it): the vectors are the same model's."""

    def __init__(self, model_dir: Path, graph: Path, name: str | None = None,
                 verified: bool = True, batch_size: int = 32) -> None:  # fmt: skip
        import onnxruntime as ort
        from tokenizers import Tokenizer

        settings = json.loads((model_dir / "sentence_bert_config.json").read_text("utf-8"))
        modules = json.loads((model_dir / "modules.json").read_text(encoding="utf-8"))
        pooling = json.loads((model_dir / "1_Pooling" / "config.json").read_text("utf-8"))
        if not pooling.get("pooling_mode_mean_tokens"):
            raise ConfigError(f"{model_dir}: only mean pooling runs on ONNX here")
        self._normalise = any(m["type"].endswith("Normalize") for m in modules)
        self._max_tokens = int(settings.get("max_seq_length") or 256)
        self._tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._tokenizer.enable_truncation(max_length=self._max_tokens)
        self._tokenizer.enable_padding()
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = 1  # a query is tiny: threads cost more than they give
        self._session = ort.InferenceSession(str(graph), options,
                                             providers=["CPUExecutionProvider"])  # fmt: skip
        self._dim = int(json.loads((model_dir / "config.json").read_text("utf-8"))["hidden_size"])
        self._name = name or model_dir.name
        self.verified = verified
        self.batch_size = batch_size
        self.progress: Callable[[int], None] | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def max_tokens(self) -> int:
        return self._max_tokens

    def _encode(self, batch: list[str]) -> Matrix:
        encodings = self._tokenizer.encode_batch(batch)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        types = np.array([e.type_ids for e in encodings], dtype=np.int64)
        (tokens,) = self._session.run(
            None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        )
        weights = mask[:, :, None].astype(np.float32)
        pooled = (tokens * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        return normalise(pooled) if self._normalise else pooled.astype(np.float32)

    def embed_documents(self, texts: Sequence[str]) -> Matrix:
        return _embed_sorted(texts, self.batch_size, self._encode, self._dim, self.progress)

    def embed_query(self, text: str) -> Matrix:
        return _row(self._encode([text]))


def onnx_for_queries(config: EmbedConfig) -> Embedder | None:
    """The local model's verified ONNX embedder for queries, or None for the torch path
    (``embed.query_runtime`` torch, or auto with no verified export: logged)."""
    if config.query_runtime == QueryRuntime.TORCH:
        return None
    model_dir = Path(config.model) if config.model else _packaged_minilm()
    strict = config.query_runtime == QueryRuntime.ONNX
    graph, verdict = verified_graph(model_dir)
    if graph is None and verdict is None:  # not exported yet: once, now
        try:
            export(model_dir)
        except Exception as exc:  # no torch/onnx here, a model the exporter cannot take
            if strict:
                raise ConfigError(
                    f"embed.query_runtime onnx: exporting {model_dir} to ONNX failed "
                    f"({type(exc).__name__}: {exc}); set embed.query_runtime torch"
                ) from exc
            logger.warning("queries use torch: exporting %s to ONNX failed (%s: %s)",
                           model_dir, type(exc).__name__, exc)  # fmt: skip
            return None
        graph, verdict = verified_graph(model_dir)
    if graph is None:
        why = f"its ONNX export was refused (min cosine {(verdict or {}).get('min_cosine')})"
        if strict:
            raise ConfigError(f"embed.query_runtime onnx: {why}; set embed.query_runtime torch")
        logger.warning("queries use torch: %s", why)
        return None
    return _loaded(str(model_dir), str(graph), embedder_name(config), config.batch_size)


@functools.lru_cache(maxsize=2)
def _loaded(model_dir: str, graph: str, name: str, batch_size: int) -> OnnxQueryEmbedder:
    return OnnxQueryEmbedder(Path(model_dir), Path(graph), name, batch_size=batch_size)


def main() -> int:
    """Export and verify the packaged model's query graph (``make setup`` runs this)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    model_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else _packaged_minilm()
    graph, verdict = verified_graph(model_dir)
    if graph is None and verdict is None:
        export(model_dir)
        graph, verdict = verified_graph(model_dir)
    print(json.dumps({"graph": str(graph) if graph else None, **(verdict or {})}))
    return 0 if graph is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
