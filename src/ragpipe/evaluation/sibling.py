"""An index built beside the current one with other chunk settings, for ``eval tune``.

A chunk setting (``chunk.whole_sections``) changes the points themselves, so
trying it means a second index of the same sources. It lives under
``<work_dir>/tune/<setting>=<value>/`` (its own work dir and Edge store; on a
Qdrant server a collection named ``<collection>-tune-<setting>-<value>``), is
built by the ordinary ingest (incremental: a second tune re-embeds only what
changed), reuses the current index's converted documents, and has no quality
gate: nobody reads it but the tune run. Delete the folder (or collection) to
drop it.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ragpipe.config import ChunkConfig, RagpipeConfig
from ragpipe.errors import ConfigError

logger = logging.getLogger(__name__)


def slug(chunk: dict[str, Any]) -> str:
    """``whole_sections=true``: the settings as a folder name (sorted, lower-case)."""
    return ",".join(f"{k}={str(v).lower()}" for k, v in sorted(chunk.items()))


def sibling_config(config: RagpipeConfig, chunk: dict[str, Any]) -> RagpipeConfig:
    """``config`` with the ``chunk`` settings changed and its own work dir and store.

    Raises:
        ConfigError: the changed chunk settings are invalid (e.g. whole sections with
            the sentence-window chunker), named.
    """
    try:
        changed = ChunkConfig.model_validate({**config.chunk.model_dump(), **chunk})
    except ValidationError as exc:
        reasons = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise ConfigError(f"chunk settings {chunk} cannot be tried: {reasons}") from exc
    home = config.paths.work_dir.resolve() / "tune" / slug(chunk)
    suffix = slug(chunk).replace("=", "-").replace(",", "-")
    store = config.store.model_copy(
        update={"path": home / "store", "collection": f"{config.store.collection}-tune-{suffix}"}
    )
    return config.model_copy(
        update={
            "chunk": changed,
            "store": store,
            "paths": config.paths.model_copy(update={"work_dir": home / "work"}),
            "index": config.index.model_copy(update={"gate": None}),
        }
    )


def share_conversions(source: RagpipeConfig, target: RagpipeConfig) -> int:
    """Copy ``source``'s converted documents into ``target``'s convert cache (entries it
    lacks); returns how many were copied. The cache is keyed by file, content and
    converter settings, so ``target``'s ingest converts only what ``source`` never did."""
    from ragpipe.ingest.runner import WorkDir

    src, dst = WorkDir.of(source).convert_cache, WorkDir.of(target).convert_cache
    if not src.is_dir():
        return 0
    dst.mkdir(parents=True, exist_ok=True)
    copied = 0
    for entry in src.glob("*.parquet"):
        if not (dst / entry.name).exists():
            _copy(entry, dst / entry.name)
            copied += 1
    return copied


def _copy(src: Path, dst: Path) -> None:
    partial = dst.with_name(dst.name + ".part")
    shutil.copyfile(src, partial)
    partial.replace(dst)  # a cache entry is whole or absent


def build_sibling(config: RagpipeConfig, chunk: dict[str, Any]) -> RagpipeConfig:
    """Build (or bring up to date) the index of ``config``'s sources with the ``chunk``
    settings changed; returns its configuration."""
    from ragpipe.ingest.pipeline import run_ingest

    sibling = sibling_config(config, chunk)
    copied = share_conversions(config, sibling)
    logger.info(
        "tune: indexing the sources with chunk %s into %s (%d converted documents reused)",
        chunk,
        sibling.paths.work_dir.parent,
        copied,
    )
    summary = run_ingest(sibling)
    logger.info("tune: %s", summary.line())
    return sibling
