"""The fetch stage: web pages of discover.urls and discover.sitemaps, fetched into the
work dir (the fetching itself is ``ragpipe.web``)."""

from __future__ import annotations

import logging

from ragpipe import checkpoint
from ragpipe.config import RagpipeConfig
from ragpipe.ingest.runner import WorkDir
from ragpipe.progress import reporter
from ragpipe.schemas import WebPage
from ragpipe.web.pages import GONE_CATEGORIES, FetchResult, fetch_pages, prune_bodies

logger = logging.getLogger(__name__)


def web_pages(config: RagpipeConfig) -> list[WebPage]:
    """The fetch state: what the last run fetched of each web page ([] when none)."""
    return checkpoint.read_state(
        WorkDir.of(config).fetch_state, WebPage, "fetching every page in full"
    )


def run_fetch(config: RagpipeConfig) -> FetchResult:
    """Fetch ``discover.urls`` and ``discover.sitemaps``, then save the fetch state.

    The state is written after every body it names (bodies are written as
    they arrive), so it never points at a body that is not on disk.
    """
    work = WorkDir.of(config)
    previous = web_pages(config)
    if not (config.discover.urls or config.discover.sitemaps):
        if previous:  # URL sources were removed from the config: forget them
            checkpoint.write_records(work.fetch_state, [], WebPage)
            prune_bodies(work.fetch_bodies, [])
        return FetchResult()
    progress = reporter()
    started: list[int] = []  # the page count is known once the sitemaps are read

    def start(total: int) -> None:
        started.append(total)
        progress.start("fetch", total)

    try:
        result = fetch_pages(
            config.fetch,
            config.discover.urls,
            config.discover.sitemaps,
            work.fetch_bodies,
            previous,
            progress=progress.advance,
            on_total=start,
        )
    finally:
        if started:
            progress.finish()
    # Pages that failed this time keep their last state: the next run asks conditionally.
    failed = {f.file_path for f in result.failures if f.category not in GONE_CATEGORIES}
    failed -= {p.url for p in result.pages}
    kept = [p for p in previous if p.url in failed]
    pages = sorted([*result.pages, *kept], key=lambda p: p.url)
    checkpoint.write_records(work.fetch_state, pages, WebPage)
    prune_bodies(work.fetch_bodies, pages)
    return result
