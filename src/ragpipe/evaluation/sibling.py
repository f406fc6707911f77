"""An index built beside the current one with other chunk settings, for ``eval tune``.

A chunk setting (``chunk.whole_sections``) changes the points themselves, so
trying it means a second index of the same sources. It lives beside the work
dir, in ``<work_dir>.tune/<setting>=<value>-<key>/`` (its own work dir and Edge
store; on a Qdrant server a collection ``<collection>-tune-<setting>-<value>-<key>``),
where ``key`` names what makes two indexes incompatible (the embedder, the
store's quantization and on-disk layout), so a changed embedder gets a new one
instead of an error. It is built by the ordinary ingest (incremental: a second
tune re-embeds only what changed), reuses the current index's converted
documents (hard links), and has no quality gate and no mass-deletion hold:
nobody reads it but the tune run. Delete the folder (or collection) to drop it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ragpipe.checkpoint import atomic_write_bytes
from ragpipe.config import ChunkConfig, RagpipeConfig
from ragpipe.errors import ConfigError, StageError
from ragpipe.locking import index_identity
from ragpipe.models.embedders import embedder_name

logger = logging.getLogger(__name__)

# The chunk settings ``eval tune --ingest-options`` tries, each value on its own index.
INGEST_SPACE: dict[str, list[Any]] = {
    "whole_sections": [False, True],  # a section that fits the embedder's window is one chunk
}


@dataclass(frozen=True)
class Sibling:
    """One chunk setting's value, and the configuration of the index built with it."""

    setting: str
    value: Any
    config: RagpipeConfig

    @property
    def key(self) -> str:
        """``chunk.<setting>``: how reports name it."""
        return f"chunk.{self.setting}"

    @property
    def where(self) -> str:
        """The index, as a user finds it: an Edge store's path, or server URL | collection."""
        return index_identity(self.config)


def slug(chunk: dict[str, Any]) -> str:
    """``whole_sections=true``: the settings as a folder name (sorted, lower-case)."""
    return ",".join(f"{k}={str(v).lower()}" for k, v in sorted(chunk.items()))


def _compatibility(config: RagpipeConfig) -> str:
    """What an existing index must share to be written again: embedder and store layout."""
    parts = [embedder_name(config.embed), str(config.store.quantization), config.store.on_disk]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:8]


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
    name = f"{slug(chunk)}-{_compatibility(config)}"
    work = config.paths.work_dir.resolve()
    # Beside the work dir, not in it: an ingest there clears temp files under it.
    home = work.parent / f"{work.name}.tune" / name
    collection = f"{config.store.collection}-tune-{name.replace('=', '-').replace(',', '-')}"
    return config.model_copy(
        update={
            "chunk": changed,
            "store": config.store.model_copy(
                update={"path": home / "store", "collection": collection}
            ),
            "paths": config.paths.model_copy(update={"work_dir": home / "work"}),
            "index": config.index.model_copy(update={"gate": None}),
        }
    )


def plan_siblings(config: RagpipeConfig, space: dict[str, list[Any]] | None) -> list[Sibling]:
    """The indexes ``space`` asks for: one per value that differs from ``config``'s, each
    validated; nothing is built.

    Raises:
        ConfigError: a setting that cannot be tuned, or a value that is invalid here.
    """
    unknown = sorted(set(space or {}) - INGEST_SPACE.keys())
    if unknown:
        raise ConfigError(
            f"cannot tune chunk setting(s) {', '.join(unknown)}; tunable: {', '.join(INGEST_SPACE)}"
        )
    return [
        Sibling(name, value, sibling_config(config, {name: value}))
        for name, values in (space or {}).items()
        for value in values
        if value != getattr(config.chunk, name)
    ]


def build_siblings(config: RagpipeConfig, space: dict[str, list[Any]] | None) -> list[Sibling]:
    """Build (or bring up to date) every index ``space`` asks for; all are validated
    before the first is built.

    Raises:
        ConfigError: see ``plan_siblings``.
        StageError: an ingest of one failed (its lock taken by another tune, a full disk),
            naming the index.
    """
    from ragpipe.ingest.pipeline import run_ingest

    siblings = plan_siblings(config, space)
    for sibling in siblings:
        reused = share_conversions(config, sibling.config)
        logger.info(
            "tune: indexing the sources with %s=%r into %s (%d converted documents reused)",
            sibling.key, sibling.value, sibling.where, reused,
        )  # fmt: skip
        try:
            summary = run_ingest(sibling.config, allow_mass_delete=True)
        except StageError as exc:
            raise StageError(
                f"building tune's index with {sibling.key}={sibling.value!r} "
                f"({sibling.where}): {exc}"
            ) from exc
        logger.info("tune: %s", summary.line())
    return siblings


def share_conversions(source: RagpipeConfig, target: RagpipeConfig) -> int:
    """Give ``target``'s convert cache the entries of ``source``'s that it lacks (hard
    links, else copies); returns how many. The cache is keyed by file, content and
    converter settings, and an entry is never written in place, so ``target``'s ingest
    converts only what ``source`` never did."""
    from ragpipe.ingest.runner import WorkDir

    src, dst = WorkDir.of(source).convert_cache, WorkDir.of(target).convert_cache
    if not src.is_dir():
        return 0
    dst.mkdir(parents=True, exist_ok=True)
    shared = 0
    for entry in src.glob("*.parquet"):
        if not (dst / entry.name).exists():
            _link_or_copy(entry, dst / entry.name)
            shared += 1
    return shared


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed: a whole copy or nothing
        atomic_write_bytes(dst, src.read_bytes())
