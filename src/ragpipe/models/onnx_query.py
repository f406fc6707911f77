"""Query embedding without torch: the index's own sentence-transformers model, exported
once to ONNX and run with onnxruntime.

A search embeds a handful of words; loading torch, transformers and
sentence-transformers to do it costs seconds per CLI call and most of a served
search's time. ``export`` turns the installed model (the packaged all-MiniLM-L6-v2,
or ``embed.model``) into an ONNX graph in the model cache, keyed by its files (and the
exporter's versions), and **verifies** it before anyone uses it: every probe query
(``PROBES``, plus the questions of the golden sets under ``eval/golden``) must embed
with cosine >= ``MIN_COSINE`` against the torch model, else the graph is refused
(recorded, with the worst cosine or the error) and the torch path stays in use.

Only models made of a Transformer, mean Pooling and (optionally) Normalize are
exported: anything else (a Dense layer, CLS pooling) is refused, never approximated.
Vectors are always normalised, as ``LocalEmbedder``'s are.

``onnx_for_queries`` is what the query side (search, ask, serve, evals) calls: the
verified graph when there is one (exporting it on first use when torch is there to
do so), else None (the torch embedder). One export at a time per model (a file lock);
the graph is written under a temporary name and renamed, the verdict last.

Run ``python -m ragpipe.models.onnx_query`` to export at setup (``make setup`` does).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from ragpipe.checkpoint import atomic_write_bytes
from ragpipe.config import EmbedConfig, QueryRuntime
from ragpipe.errors import ConfigError
from ragpipe.models.embedders import (
    Embedder,
    Matrix,
    OnnxRuntimeEmbedder,
    local_model_dir,
    mean_pooled,
    normalise,
)

logger = logging.getLogger(__name__)

MIN_COSINE = 0.9999
GRAPH = "model.onnx"
VERDICT = "verified.json"
FORMAT = "2"  # bumped when the export or the embedder changes how vectors are made
SUPPORTED_MODULES = ("Transformer", "Pooling", "Normalize")
# Files this size or smaller are hashed by content; larger ones (the weights) by size and
# modification time, so that locating the graph costs no read of the weights.
HASHED_BYTES = 1 << 20

# Probe queries: short and long, cased, punctuated, non-ASCII, and one of distinct
# sentences past the window (truncation must agree too).
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
    " ".join(
        f"Sentence {i} is about topic {i * 7 % 31}, a mirror in zone {i % 5} and release {i}."
        for i in range(60)
    ),
)


def model_key(model_dir: Path) -> str:
    """16 hex over every file of the model (content, or size and mtime for the large
    ones), the export format and the exporter's versions."""
    digest = hashlib.sha256(FORMAT.encode())
    for package in ("torch", "transformers", "sentence-transformers", "onnx"):
        try:
            digest.update(f"{package}={metadata.version(package)};".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{package}=none;".encode())
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(str(path.relative_to(model_dir)).encode())
        if stat.st_size <= HASHED_BYTES:
            digest.update(path.read_bytes())
        else:
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def graph_dir(model_dir: Path) -> Path:
    from ragpipe.models.packaged import cache_dir

    return cache_dir() / "onnx" / f"{model_dir.name}-{model_key(model_dir)}"


def _modules(model_dir: Path) -> tuple[Path, bool]:
    """The pooling module's directory and whether the model normalises; ConfigError for a
    model the ONNX path would not reproduce."""
    modules = json.loads((model_dir / "modules.json").read_text(encoding="utf-8"))
    kinds = [str(m["type"]).rsplit(".", 1)[-1] for m in modules]
    other = [k for k in kinds if k not in SUPPORTED_MODULES]
    if other or "Pooling" not in kinds:
        raise ConfigError(
            f"{model_dir}: modules {kinds}; the ONNX query path runs Transformer, mean "
            "Pooling and Normalize only"
        )
    pooling_dir = model_dir / next(m["path"] for m in modules if m["type"].endswith("Pooling"))
    pooling = json.loads((pooling_dir / "config.json").read_text(encoding="utf-8"))
    if not pooling.get("pooling_mode_mean_tokens") or any(
        v
        for k, v in pooling.items()
        if k.startswith("pooling_mode_") and k != "pooling_mode_mean_tokens"
    ):
        raise ConfigError(f"{model_dir}: only mean pooling runs on ONNX here ({pooling})")
    return pooling_dir, "Normalize" in kinds


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


@contextmanager
def _exporting(target: Path) -> Iterator[None]:
    """One export of a model at a time (other processes wait, then find it done)."""
    target.mkdir(parents=True, exist_ok=True)
    fd = os.open(target / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _record(target: Path, verdict: dict[str, Any]) -> None:
    atomic_write_bytes(target / VERDICT, json.dumps(verdict, indent=1).encode())


# A verdict that no longer describes the graph on disk (the cache copied, which changes its
# mtime, or the graph removed): exported and verified again, not refused for good.
STALE = ("the verified graph is missing", "the graph changed since verified")


def export(model_dir: Path) -> Path | None:
    """Export ``model_dir`` (a sentence-transformers model) to ONNX and verify it; the
    graph's directory, or None when it was refused (the reason is recorded and logged).
    Needs torch, transformers and onnx (the ingest side's packages): ImportError without.
    """
    target = graph_dir(model_dir)
    with _exporting(target):
        graph, verdict = verified_graph(model_dir)
        if verdict is not None and verdict.get("error") in STALE:
            verdict = None  # exported again below
        if verdict is not None:  # another process finished it meanwhile
            return target if graph is not None else None
        try:
            _modules(model_dir)
            worst, queries, window = _export_and_compare(model_dir, target)
        except ImportError:
            raise  # not this model's fault: nothing recorded, torch is used
        except Exception as exc:  # the model cannot be exported: recorded, not retried
            _record(target, {"model": str(model_dir), "passed": False,
                             "error": f"{type(exc).__name__}: {exc}"})  # fmt: skip
            logger.warning("ONNX export of %s refused (%s: %s); queries keep the torch path",
                           model_dir.name, type(exc).__name__, exc)  # fmt: skip
            return None
        passed = worst >= MIN_COSINE
        graph_stat = (target / GRAPH).stat()
        _record(target, {"model": str(model_dir), "queries": queries, "min_cosine": worst,
                         "max_seq_length": window, "passed": passed,
                         "graph": f"{graph_stat.st_size}:{graph_stat.st_mtime_ns}"})  # fmt: skip
    if not passed:
        logger.warning("ONNX export of %s refused: cosine %.6f < %s on %d probe queries; "
                       "queries keep the torch path", model_dir.name, worst, MIN_COSINE,
                       queries)  # fmt: skip
        return None
    logger.info("ONNX query graph of %s verified (min cosine %.6f on %d queries): %s",
                model_dir.name, worst, queries, target)  # fmt: skip
    return target


def _export_and_compare(model_dir: Path, target: Path) -> tuple[float, int, int]:
    """Write the graph; (worst cosine against torch, probe queries, window)."""
    import warnings

    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(model_dir), local_files_only=True,
                                      attn_implementation="eager").eval()  # fmt: skip
    takes_types = "token_type_ids" in model.forward.__code__.co_varnames

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: Any) -> Any:
            named = dict(zip(names, inputs, strict=True))
            return self.model(**named).last_hidden_state

    names = ["input_ids", "attention_mask", *(["token_type_ids"] if takes_types else [])]
    axes = {n: {0: "batch", 1: "tokens"} for n in [*names, "last_hidden_state"]}
    example = tuple(
        torch.zeros(2, 8, dtype=torch.long) if n == "token_type_ids"
        else torch.ones(2, 8, dtype=torch.long) for n in names
    )  # fmt: skip
    fd, tmp = tempfile.mkstemp(prefix=f".{GRAPH}.", suffix=".tmp", dir=target)
    os.close(fd)
    try:
        with warnings.catch_warnings():  # the TorchScript exporter's deprecation notices
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            torch.onnx.export(Encoder(), example, tmp, input_names=names,
                              output_names=["last_hidden_state"], dynamic_axes=axes,
                              opset_version=17, dynamo=False)  # fmt: skip
        os.chmod(tmp, 0o644)  # a cache others read (mkstemp makes it private)
        os.replace(tmp, target / GRAPH)
    finally:
        Path(tmp).unlink(missing_ok=True)
    reference = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    window = int(reference.max_seq_length or 256)
    queries = _probe_queries()
    expected = reference.encode(queries, normalize_embeddings=True, convert_to_numpy=True,
                                show_progress_bar=False)  # fmt: skip
    onnx = OnnxQueryEmbedder(model_dir, target / GRAPH, max_tokens=window)
    got = normalise(onnx.embed_documents(queries))
    cosines = np.sum(normalise(np.asarray(expected, np.float32)) * got, axis=1)
    return float(cosines.min()), len(queries), window


def verified_graph(model_dir: Path) -> tuple[Path | None, dict[str, Any] | None]:
    """(the verified graph, its verdict) of ``model_dir``; (None, verdict) when refused
    (or its graph is not the one verified), (None, None) when not exported yet."""
    target = graph_dir(model_dir)
    try:
        verdict = json.loads((target / VERDICT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, None
    graph = target / GRAPH
    if not verdict.get("passed"):
        return None, verdict
    try:
        stat = graph.stat()
    except OSError:
        return None, {**verdict, "passed": False, "error": "the verified graph is missing"}
    if verdict.get("graph") != f"{stat.st_size}:{stat.st_mtime_ns}":
        return None, {**verdict, "passed": False, "error": "the graph changed since verified"}
    return graph, verdict


class OnnxQueryEmbedder(OnnxRuntimeEmbedder):
    """A sentence-transformers model's exported graph run with onnxruntime: its own
    tokenizer, window and lowercasing, mean pooling, normalised vectors. Same name as the
    torch embedder (the store checks it): the vectors are the same model's."""

    def __init__(self, model_dir: Path, graph: Path, name: str | None = None,
                 max_tokens: int | None = None, batch_size: int = 32) -> None:  # fmt: skip
        import onnxruntime as ort
        from tokenizers import Tokenizer

        settings = json.loads((model_dir / "sentence_bert_config.json").read_text("utf-8"))
        _modules(model_dir)
        self._lowercase = bool(settings.get("do_lower_case"))
        self._max_tokens = int(max_tokens or settings.get("max_seq_length") or 256)
        self._tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._tokenizer.enable_truncation(max_length=self._max_tokens)
        self._tokenizer.enable_padding()
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = 1  # a query is tiny: threads cost more than they give
        self._session = ort.InferenceSession(str(graph), options,
                                             providers=["CPUExecutionProvider"])  # fmt: skip
        self._inputs = {i.name for i in self._session.get_inputs()}
        self._dim = int(json.loads((model_dir / "config.json").read_text("utf-8"))["hidden_size"])
        self._name = name or model_dir.name
        self.batch_size = batch_size
        self.progress: Callable[[int], None] | None = None

    def reads_whole(self, text: str) -> bool | None:
        return not self._tokenizer.encode(text.lower() if self._lowercase else text).overflowing

    def _encode(self, batch: list[str]) -> Matrix:
        texts = [t.lower() for t in batch] if self._lowercase else batch
        encodings = self._tokenizer.encode_batch(texts)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feed = {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": mask,
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
        }
        (tokens,) = self._session.run(None, {k: v for k, v in feed.items() if k in self._inputs})
        return mean_pooled(tokens, mask)


def onnx_for_queries(config: EmbedConfig) -> Embedder | None:
    """The local model's verified ONNX embedder for queries, or None for the torch path
    (``embed.query_runtime`` torch, or auto with no verified export: logged). Prefixes and
    truncation are applied on top by ``make_embedder``.

    Raises:
        ConfigError: ``embed.query_runtime`` onnx and no verified export can be had.
    """
    if config.query_runtime == QueryRuntime.TORCH:
        return None
    strict = config.query_runtime == QueryRuntime.ONNX
    model_dir = local_model_dir(config.model)  # its errors hold for torch too: raised as they are
    try:
        graph, verdict = verified_graph(model_dir)
        stale = verdict is not None and verdict.get("error") in STALE
        if graph is None and (verdict is None or stale):  # not exported yet: once, now
            export(model_dir)
            graph, verdict = verified_graph(model_dir)
        if graph is None:
            verdict = verdict or {}
            raise ConfigError(
                "its ONNX export was refused ("
                + (verdict.get("error") or f"min cosine {verdict.get('min_cosine')}")
                + f"; remove {graph_dir(model_dir)} to export and verify it again)"
            )
        name = "all-MiniLM-L6-v2" if config.model is None else model_dir.name
        window = verdict.get("max_seq_length") if verdict else None
        return _loaded(str(model_dir), str(graph), name, window, config.batch_size)
    except Exception as exc:  # no torch/onnx, a refused export, a graph that fails to load
        why = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
        if strict:
            raise ConfigError(
                f"embed.query_runtime onnx: {why}; set embed.query_runtime torch"
            ) from exc
        logger.warning("queries use torch: %s", why)
        return None


@functools.lru_cache(maxsize=2)
def _loaded(
    model_dir: str, graph: str, name: str, window: int | None, batch_size: int
) -> OnnxQueryEmbedder:
    return OnnxQueryEmbedder(Path(model_dir), Path(graph), name, window, batch_size)


def main() -> int:
    """Export and verify the packaged model's query graph (``make setup`` runs this)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    model_dir = local_model_dir(sys.argv[1] if len(sys.argv) > 1 else None)
    graph, verdict = verified_graph(model_dir)
    stale = verdict is not None and verdict.get("error") in STALE  # a copied cache: again
    if graph is None and (verdict is None or stale):
        export(model_dir)
        graph, verdict = verified_graph(model_dir)
    print(json.dumps({"graph": str(graph) if graph else None, **(verdict or {})}))
    return 0 if graph is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
