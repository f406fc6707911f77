"""An index's versions, whichever store keeps them: the Edge store's published copies
(``published``) or a Qdrant server's collections behind an alias (``server_versions``).

``index.gate`` (``ragpipe.ingest.gatekeep``), ``ragpipe index`` and ``search --version``
go through these; each takes the store's configuration.
"""

from __future__ import annotations

from typing import Any

from ragpipe.config import StoreBackend, StoreConfig
from ragpipe.store import published, server_versions
from ragpipe.store.base import GENERATION_FILE
from ragpipe.store.published import IndexVersion, VersionEntry


def _edge(config: StoreConfig) -> bool:
    return config.backend == StoreBackend.EDGE


def working_generation(config: StoreConfig) -> str | None:
    """The token of the working index's last writing session (None: none yet)."""
    if not _edge(config):
        return server_versions.generation(config)
    if not (config.path / "segments").is_dir():
        return None
    try:
        return (config.path / GENERATION_FILE).read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def current(config: StoreConfig) -> str | None:
    """The live version (None: none)."""
    return published.current(config.path) if _edge(config) else server_versions.current(config)


def damaged(config: StoreConfig, generation: str | None) -> bool:
    """Whether an Edge version's files are missing or cut short (``published.intact``), or
    its folder is gone; a Qdrant server's collections are the server's to keep whole."""
    if generation is None or not _edge(config):
        return False
    return not published.intact(published.root(config.path) / generation)


def statuses(config: StoreConfig) -> dict[str, dict[str, Any]]:
    if _edge(config):
        return published.statuses(config.path)
    return server_versions.statuses(config)


def stage(
    config: StoreConfig, generation: str, points: int, files: int, index_fingerprint: str
) -> IndexVersion | None:
    if _edge(config):
        return published.stage(config.path, generation, points, files, index_fingerprint)
    return server_versions.stage(config, generation, points, files, index_fingerprint)


def hold(config: StoreConfig, generation: str, verdict: dict[str, Any]) -> None:
    if _edge(config):
        published.hold(config.path, generation, verdict)
    else:
        server_versions.hold(config, generation, verdict)


def promote(
    config: StoreConfig,
    generation: str,
    extra: dict[str, Any] | None = None,
    keep_previous: bool = False,
) -> None:
    if _edge(config):
        published.promote(config.path, generation, extra, keep_previous)
    else:
        server_versions.promote(config, generation, extra, keep_previous)


def discard(config: StoreConfig, generation: str) -> None:
    if _edge(config):
        published.discard(config.path, generation)
    else:
        server_versions.discard(config, generation)


def resolve(config: StoreConfig, prefix: str) -> str:
    if _edge(config):
        return published.resolve(config.path, prefix)
    return server_versions.resolve(config, prefix)


def list_versions(config: StoreConfig) -> list[VersionEntry]:
    """Newest first."""
    if _edge(config):
        return published.list_versions(config.path)
    return server_versions.list_versions(config)
