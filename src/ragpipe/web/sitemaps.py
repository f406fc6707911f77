"""Sitemaps: parse a sitemaps.org ``urlset``/``sitemapindex`` (optionally gzipped) or
a plain list of URLs, and expand the configured sitemaps, nested ones included, into
the pages they list. A sitemap that cannot be read falls back to the pages it listed
last time, so a sitemap outage never empties the index.
"""

from __future__ import annotations

import gzip
import io
import logging
import re
import zlib
from collections.abc import Sequence
from xml.etree import ElementTree

from ragpipe.config import url_problem
from ragpipe.schemas import Failure, WebPage
from ragpipe.web.http import Disallowed, Fetcher, FetchError, normalise_url, same_site

logger = logging.getLogger(__name__)

STAGE = "fetch"


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def parse_sitemap(body: bytes, cap: int) -> tuple[list[str], list[str]]:
    """(page URLs, nested sitemap URLs) of a sitemap body.

    Accepts a sitemaps.org ``urlset`` or ``sitemapindex`` (optionally gzipped)
    or a plain-text list of URLs.

    Raises:
        FetchError: ``corrupt`` when the body is neither.
    """
    if body[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(body)) as fh:
                body = fh.read(cap + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise FetchError("corrupt", f"sitemap is not valid gzip: {exc}") from exc
        if len(body) > cap:
            raise FetchError("too_large", f"sitemap unpacks to more than {cap} bytes")
    text = body.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not text.startswith(b"<"):
        lines = text.decode("utf-8", errors="replace").splitlines()  # text: no BOM
        urls = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
        if not all(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", u) for u in urls):
            raise FetchError("corrupt", "sitemap is neither XML nor a list of URLs")
        return urls, []
    if b"<!ENTITY" in text[:4096].upper():
        raise FetchError("corrupt", "sitemap declares XML entities; refused")
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as exc:
        raise FetchError("corrupt", f"sitemap is not well-formed XML: {exc}") from exc
    kind = _local(root.tag)
    if kind not in ("urlset", "sitemapindex"):
        raise FetchError("corrupt", f"sitemap root element is <{kind}>, not urlset/sitemapindex")
    child = "url" if kind == "urlset" else "sitemap"
    locs = []
    for entry in root:
        if _local(entry.tag) != child:
            continue
        for part in entry:
            if _local(part.tag) == "loc" and part.text and part.text.strip():
                # The parser undid the XML escapes; html.unescape again read "&section=2"
                # as "§ion=2" (HTML's legacy entities need no ";"). Only a sitemap escaped
                # twice ("&amp;amp;") is mended.
                locs.append(part.text.strip().replace("&amp;", "&"))
    return (locs, []) if kind == "urlset" else ([], locs)


def expand_sitemaps(
    fetcher: Fetcher,
    sitemaps: Sequence[str],
    previous: Sequence[WebPage],
    failures: list[Failure],
    max_depth: int,
) -> list[tuple[str, str]]:
    """(page URL, configured sitemap) for every page the sitemaps list.

    A sitemap (or a nested one) that cannot be read gets a failure row, and its
    configured sitemap's pages from the last run are used instead.
    """
    pages: list[tuple[str, str]] = []
    for top in sitemaps:
        root = normalise_url(top)
        found: list[str] = []
        failed = False
        queue = [(root, 1)]
        visited: set[str] = set()
        while queue:
            url, depth = queue.pop(0)
            if url in visited:
                continue
            visited.add(url)
            try:
                response = fetcher.get(url)
                if response.status in (404, 410):
                    raise FetchError("not_found", f"sitemap answered HTTP {response.status}")
                if response.status != 200:
                    raise FetchError("http_error", f"sitemap answered HTTP {response.status}")
                locs, nested = parse_sitemap(response.body, fetcher.config.max_bytes)
            except (FetchError, Disallowed) as exc:
                category = exc.category if isinstance(exc, FetchError) else "robots_disallowed"
                failures.append(
                    Failure(url, STAGE, f"sitemap_{category}", f"sitemap not read: {exc}")
                )
                failed = True
                continue

            # sitemaps.org: a sitemap lists URLs of its own host only. Others could point the
            # fetcher at internal hosts; they are refused, each with a row.
            def elsewhere(loc: str, sitemap: str = url) -> bool:  # bad URLs are skipped later
                return url_problem(loc) is None and not same_site(loc, sitemap)

            for loc in [*locs, *nested]:
                if elsewhere(loc):
                    failures.append(
                        Failure(
                            loc,
                            STAGE,
                            "sitemap_cross_host",
                            f"listed by {url}, a sitemap on another host; sitemaps.org allows "
                            "a sitemap to list its own host's URLs only (list it in "
                            "discover.urls to fetch it)",
                        )
                    )
            locs = [loc for loc in locs if not elsewhere(loc)]
            nested = [n for n in nested if not elsewhere(n)]
            found.extend(locs)
            for child in nested:
                if depth >= max_depth:
                    failures.append(
                        Failure(
                            child,
                            STAGE,
                            "sitemap_too_deep",
                            f"nested deeper than fetch.max_sitemap_depth={max_depth}",
                        )
                    )
                    failed = True
                elif url_problem(child) is None:
                    queue.append((normalise_url(child), depth + 1))
        if failed:
            kept = [p.url for p in previous if p.source == root]
            logger.warning(
                "sitemap %s not fully read; keeping the %d pages it listed last run", root,
                len(kept),
            )  # fmt: skip
            found.extend(kept)
        pages.extend((u, root) for u in found)
    return pages
