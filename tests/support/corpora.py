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


# Install questions: every one matches each section of long.md (its words) before the two
# short install pages, widget.md and gadget.md, that the golden sets target.
INSTALL_QUERIES = [
    "How do I install it?",
    "install the package",
    "installer steps",
    "how to install",
    "run the install",
    "verify the install",
    "installing software",
    "install it now",
    "where do I install it",
    "install guide",
    "the install script",
    "install help",
]


def long_file_project(base: Path) -> RagpipeConfig:
    """Twelve files, one of them (long.md) 24 sections about installing: a search for an
    install question with prefetch 10 (the config's) or 20 holds long.md's chunks alone.
    Not ingested; one chunk a section (size 200)."""
    root = base / "corpus"
    root.mkdir(parents=True)
    long = "# Long install manual\n\n" + "".join(
        f"## Install step {i}\n\nTo install it, step {i}: run the installer, install the "
        f"package number {i}, and verify the install finished.\n\n"
        for i in range(24)
    )
    (root / "long.md").write_text(long, encoding="utf-8")
    pages = {
        "widget": "Download the tarball and run the install script with sudo; it sets up the "
        "daemon.",
        "gadget": "Gadget installs with pip inside a virtual environment and needs Python 3.10.",
        "bread": "Knead the dough, let it rise and bake the loaf at 230 degrees.",
        "tomato": "Tomatoes need full sun, water and stakes; pinch off side shoots.",
        "bikes": "Oil the chain, pump the tyres and check the brakes every month.",
        "tea": "Steep green tea at 80 degrees for two minutes, black tea longer.",
        "stars": "Telescopes gather light; a larger mirror shows fainter stars.",
        "chess": "Control the centre, develop the knights and castle early.",
        "birds": "Robins sing at dawn; feeders with seed bring finches in winter.",
        "rivers": "Rivers carve valleys; floods leave fertile silt on the plain.",
        "knots": "A bowline makes a fixed loop that does not slip under load.",
    }
    for name, text in pages.items():
        (root / f"{name}.md").write_text(f"# {name.title()}\n\n{text}\n", encoding="utf-8")
    return RagpipeConfig(
        discover={"roots": [root]},  # type: ignore[arg-type]
        chunk={"size": 200, "overlap": 20},  # type: ignore[arg-type]
        embed={"provider": "onnx"},  # type: ignore[arg-type]
        store={"path": base / "store"},  # type: ignore[arg-type]
        paths={"work_dir": base / "work"},  # type: ignore[arg-type]
        retrieve={"prefetch": 10},  # type: ignore[arg-type]
    )
