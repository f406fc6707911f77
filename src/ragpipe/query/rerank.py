"""The cross-encoder reranker."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ragpipe.config import expand_home
from ragpipe.errors import ConfigError


class Reranker:
    """A sentence-transformers CrossEncoder from a local directory or the HF cache."""

    def __init__(self, model: str) -> None:
        from sentence_transformers import CrossEncoder

        local = expand_home(Path(model))
        try:
            if local.exists():
                self._model = CrossEncoder(str(local), device="cpu")
            else:
                self._model = CrossEncoder(model, device="cpu", local_files_only=True)
        except Exception as exc:
            raise ConfigError(
                f"retrieve.reranker: cannot load the cross-encoder {model!r} ({exc}). Nothing is "
                "downloaded at run time: fetch the model on a machine with hub access (e.g. "
                "`huggingface-cli download cross-encoder/ms-marco-MiniLM-L6-v2`) and set "
                "retrieve.reranker to its directory, or set retrieve.rerank: false (or "
                "retrieve.reranker: none) to run without reranking."
            ) from exc
        self.name = model

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        scores = self._model.predict([(query, t) for t in texts], show_progress_bar=False)
        return [float(s) for s in np.asarray(scores).reshape(len(texts), -1)[:, 0]]
