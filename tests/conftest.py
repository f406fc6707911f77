"""Shared fixtures: the real shared corpus, small corpora, a Prefect harness."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

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
