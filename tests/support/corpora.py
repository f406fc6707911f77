"""Generated corpora, their configs, and what a store holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ragpipe.config import RagpipeConfig
from ragpipe.ingest.plan import saved_versions
from ragpipe.store import open_store

TOPICS = ["engines", "wings", "statistics", "gardening", "astronomy", "cooking"]


def topic_doc(topic: str, version: int = 1, sections: int = 4) -> str:
    parts = [f"# Notes on {topic}\n"]
    for s in range(sections):
        parts.append(f"## {topic.title()} part {s}\n")
        parts.append(
            " ".join(
                f"Sentence {i} of section {s} explains {topic} in revision {version}."
                for i in range(12)
            )
            + "\n"
        )
    return "\n".join(parts)


def write_project(root: Path, docs: dict[str, str], golden: str, eval_extra: str = "") -> None:
    """A project folder as a user keeps one: ``corpus/`` with ``docs``, ``golden.yaml`` and a
    ragpipe.yaml with relative paths (test embedder, Edge store, 100 resamples);
    ``eval_extra`` adds eval settings (``", granularity: file"``)."""
    (root / "corpus").mkdir()
    for name, text in docs.items():
        (root / "corpus" / name).write_text(text, encoding="utf-8")
    (root / "golden.yaml").write_text(golden, encoding="utf-8")
    (root / "ragpipe.yaml").write_text(
        "discover: {roots: [corpus]}\nembed: {provider: onnx}\nstore: {path: store}\n"
        "paths: {work_dir: work}\neval: {golden: golden.yaml, reports_dir: reports, "
        f"resamples: 100{eval_extra}}}\n",
        encoding="utf-8",
    )


def make_config(
    root: Path, tmp_path: Path, backend: str = "edge", **sections: Any
) -> RagpipeConfig:
    data: dict[str, Any] = {
        "discover": {"roots": [root]},
        "chunk": {"size": 400, "overlap": 50},
        "embed": {"provider": "onnx", "batch_size": 16},
        "store": {"backend": backend, "path": tmp_path / f"store-{backend}", "batch_size": 8},
        "paths": {"work_dir": tmp_path / f"work-{backend}"},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return RagpipeConfig(**data)


def stored(cfg: RagpipeConfig) -> dict[str, dict[str, Any]]:
    """point id -> payload of everything in the store."""
    store = open_store(cfg.store, "paraphrase-MiniLM-L3-v2", None)
    assert store is not None
    try:
        return {h.point_id: h.payload for h in store.scroll()}
    finally:
        store.close()


def assert_versions_current(cfg: RagpipeConfig) -> None:
    """What the next plan will trust instead of scrolling is what a scroll returns."""
    saved = saved_versions(cfg)
    store = open_store(cfg.store, "paraphrase-MiniLM-L3-v2", None)
    assert store is not None
    try:
        assert saved == store.file_versions()
    finally:
        store.close()


def write_topics(root: Path, count: int, suffix: str = ".md") -> Path:
    """A corpus of the first ``count`` topics, one generated document each, in ``root``."""
    root.mkdir(parents=True)
    for topic in TOPICS[:count]:
        (root / f"{topic}{suffix}").write_text(topic_doc(topic), encoding="utf-8")
    return root
