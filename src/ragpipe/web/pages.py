"""Fetch web pages (``discover.urls``, ``discover.sitemaps``) as sources beside files.

Each page becomes a :class:`~ragpipe.schemas.SourceFile` whose ``file_path``
is its URL (its identity in the index: the document id is a UUIDv5 of it)
and whose ``abs_path`` is the fetched body under ``work_dir/fetch/bodies``.
From there convert, clean, chunk, embed and upsert treat it like a file.

Requests go through :mod:`ragpipe.web.http` (robots.txt, per-host spacing, caps);
sitemaps are expanded by :mod:`ragpipe.web.sitemaps`. A page robots.txt disallows
is skipped (reason ``robots_disallowed``) and, if it was indexed, removed.

Re-fetching is conditional: the last ETag / Last-Modified of each page is
kept in ``work_dir/fetch/pages.parquet`` and sent back, so an unchanged page
costs one request answered 304. A page served again in full is hashed; the
same bytes are the same version, so nothing downstream re-runs.

Outcomes per URL: a source (200, or 304 with the body kept), a skip (robots,
content type, scheme), or a failure row. A 404/410 failure (``not_found``)
means the page is gone: the plan removes it from the index, under the same
mass-deletion guard as vanished files. Any other failure (timeout, 5xx,
robots.txt unreachable) keeps the indexed version until a later run fetches
it. A sitemap that cannot be read falls back to the pages it listed last
time, so a sitemap outage never empties the index.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import Message
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from ragpipe.config import FetchConfig, url_problem
from ragpipe.schemas import Failure, Skip, SourceFile, WebPage
from ragpipe.web.http import Disallowed, Fetcher, FetchError, Response, normalise_url
from ragpipe.web.sitemaps import STAGE, expand_sitemaps

logger = logging.getLogger(__name__)

GONE_CATEGORIES = frozenset({"not_found"})  # the page no longer exists: remove it
URLS_SOURCE = "urls"

CONTENT_KINDS = {
    "text/html": "html",
    "application/xhtml+xml": "html",
    "text/plain": "text",
    "text/markdown": "markdown",
    "text/x-markdown": "markdown",
    "application/pdf": "pdf",
}
BODY_SUFFIX = {"html": ".html", "text": ".txt", "markdown": ".md", "pdf": ".pdf"}


@dataclass
class FetchResult:
    """Everything one fetch pass saw."""

    files: list[SourceFile] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    pages: list[WebPage] = field(default_factory=list)
    requests: int = 0
    not_modified: int = 0
    downloaded: int = 0

    def redirected(self) -> set[str]:
        """The URLs of the pages whose fetch ended at another URL (a redirect)."""
        return {p.url for p in self.pages if normalise_url(p.final_url) != p.url}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# RFC 9110's type/subtype: two tokens.
_MIME_TYPE = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+/[!#$%&'*+.^_`|~0-9a-z-]+")


def _content_type(headers: httpx.Headers) -> tuple[str, str | None]:
    """(type/subtype, charset) of a response, as browsers extract them (WHATWG Fetch):
    headers sent twice are joined by commas and the last valid type wins, keeping an
    earlier charset of the same type; ``""`` when none is valid, so the body is sniffed.
    (The email parser read 'text/html, text/html; charset=utf-8', 'html' or 'pdf' as
    text/plain: an HTML page was indexed as its markup, a PDF as its bytes.)"""
    essence, charset = "", None
    for value in headers.get_list("content-type", split_commas=True):
        mime = value.partition(";")[0].strip().lower()
        if not _MIME_TYPE.fullmatch(mime) or mime == "*/*":
            continue
        msg = Message()
        msg["content-type"] = value
        param = msg.get_param("charset")
        named = param if isinstance(param, str) and param else None
        if mime != essence:
            essence, charset = mime, named
        elif named:
            charset = named
    return essence, charset


# Types that say nothing of the body ("some bytes"): the body's first bytes tell. A
# server (or a bucket behind it) sends application/octet-stream for a file it has no
# type for; an HTML page served so was skipped, and removed once indexed.
UNTYPED = frozenset(
    {"", "application/octet-stream", "binary/octet-stream", "application/unknown",
     "unknown/unknown"}
)  # fmt: skip


def _sniff(body: bytes) -> str:
    head = body[:1024].lstrip().lower()
    if head.startswith(b"%pdf-"):
        return "application/pdf"
    if head.startswith((b"<!doctype html", b"<html")):
        return "text/html"
    return ""


def kind_of_response(url: str, content_type: str) -> str | None:
    """Document kind of a response, or None when it is not HTML, text or PDF."""
    kind = CONTENT_KINDS.get(content_type)
    if kind == "text" and urlsplit(url).path.lower().endswith((".md", ".markdown")):
        return "markdown"
    return kind


# What a page that declares no encoding is read as when it is not UTF-8: what a browser
# reads it as (WHATWG's default; HTTP/1.1 made ISO-8859-1 the default of text/*, which
# WHATWG reads as windows-1252 too).
UNDECLARED_ENCODING = "windows-1252"


def _decode_text(body: bytes, charset: str | None, kind: str) -> tuple[str, str]:
    """Body as text and the encoding used, never a guess: a byte-order mark, the HTTP
    charset, an HTML page's own declaration (``<meta charset>``), UTF-8, then
    windows-1252 (``UNDECLARED_ENCODING``). Statistics read a French Latin-1 text that
    declared nothing as windows-1250 ("trčs" for "très"), in silence.

    Raises:
        FetchError: ``encoding``, when none of them reads the bytes.
    """
    from bs4.dammit import EncodingDetector

    stripped, bom = EncodingDetector.strip_byte_order_mark(body)
    tries = [(bom, stripped)] if bom else []
    if charset:
        tries.append((charset, body))
    if kind == "html":
        declared = EncodingDetector.find_declared_encoding(body, is_html=True)
        if declared:
            tries.append((declared, body))
    tries += [("utf-8", body), (UNDECLARED_ENCODING, body)]
    failed: UnicodeDecodeError | None = None
    for encoding, data in tries:
        try:
            return data.decode(encoding), encoding
        except LookupError:  # a charset Python does not know: the next one
            continue
        except UnicodeDecodeError as exc:
            failed = exc
    what = "page" if kind == "html" else "text"
    declared = f"its declared charset {charset!r} or " if charset else ""
    byte = f"byte 0x{body[failed.start]:02x} at {failed.start}" if failed else "a byte"
    raise FetchError(
        "encoding",
        f"the {what} is not in {declared}UTF-8, and {byte} is no character of "
        f"{UNDECLARED_ENCODING}, what a page that declares no charset is read as (as browsers "
        "do): its server should declare the charset it is written in (Content-Type: ...; "
        "charset=...)",
    )


_TITLE_RE = re.compile(r"<title[^>]*>(.*?)</title\s*>", re.IGNORECASE | re.DOTALL)


def page_title(kind: str, text: str | None, body: bytes) -> str | None:
    """The page's title: HTML <title>, a PDF's Title, a Markdown first heading."""
    if kind == "html" and text is not None:
        match = _TITLE_RE.search(text[:65536])
        if match:
            title = " ".join(html.unescape(re.sub(r"<[^>]+>", "", match.group(1))).split())
            return title or None
        return None
    if kind == "markdown" and text is not None:
        for line in text.splitlines()[:50]:
            if line.startswith("# "):
                return line[2:].strip() or None
        return None
    if kind == "pdf":
        try:
            import pypdfium2

            pdf = pypdfium2.PdfDocument(body)
            try:
                title = pdf.get_metadata_dict().get("Title", "").strip()
            finally:
                pdf.close()
            return title or None
        except Exception:  # a PDF too broken for metadata still goes to convert
            return None
    return None


def body_path(bodies: Path, url: str, sha256: str, kind: str) -> Path:
    """Where one version of ``url`` is kept: named by URL and content, so the fetch
    state never names a file that a later, interrupted fetch overwrote."""
    key = hashlib.sha256(url.encode()).hexdigest()[:24]
    return bodies / f"{key}-{sha256[:16]}{BODY_SUFFIX[kind]}"


def _stored_body(
    bodies: Path, body: bytes, url: str, sha256: str, kind: str, charset: str | None
) -> tuple[Path, str | None]:
    """Write the body (text as UTF-8) where convert will read it; returns (path, title)."""
    from ragpipe.checkpoint import atomic_write_bytes

    path = body_path(bodies, url, sha256, kind)
    if kind == "pdf":
        atomic_write_bytes(path, body)
        return path, page_title(kind, None, body)
    text, _ = _decode_text(body, charset, kind)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if kind == "html":
        # The bytes become UTF-8; a leading declaration outranks the page's own, which
        # may name another charset than the HTTP header that decoded it (a stale
        # <meta charset="windows-1252"> on a UTF-8 page gave "CafÃ©" in every chunk).
        text = UTF8_DECLARATION + text
    atomic_write_bytes(path, text.encode("utf-8"))
    return path, page_title(kind, text, body)


UTF8_DECLARATION = '<meta charset="utf-8">\n'


def _declare_utf8(page: WebPage) -> None:
    """A kept HTML body stored before every one declared UTF-8 (CONVERT_VERSION 4) gets
    the declaration: a page that answers 304 is never stored again."""
    if page.kind != "html":
        return
    from ragpipe.checkpoint import atomic_write_bytes

    path = Path(page.body_path)
    declared = UTF8_DECLARATION.encode()
    with contextlib.suppress(OSError):  # a body gone is fetched again (_intact)
        with path.open("rb") as fh:  # every kept page, every night: its head only
            if fh.read(len(declared)) == declared:
                return
        atomic_write_bytes(path, declared + path.read_bytes())


def _intact(page: WebPage) -> bool:
    """Whether the body the state names is still there (bodies are written atomically)."""
    path = Path(page.body_path)
    return path.is_file() and path.stat().st_size > 0


def _plan_urls(
    urls: Sequence[str], sitemap_pages: Sequence[tuple[str, str]]
) -> tuple[list[tuple[str, str]], list[Skip]]:
    """(url, source) to fetch, normalised and de-duplicated (first source wins)."""
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    skipped: list[Skip] = []
    for url, source in [*((u, URLS_SOURCE) for u in urls), *sitemap_pages]:
        problem = url_problem(url)
        if problem:
            skipped.append(Skip(url, "unsupported_scheme", f"listed by {source}; {problem}"))
            continue
        norm = normalise_url(url)
        if norm not in seen:
            seen.add(norm)
            out.append((norm, source))
    return out, skipped


def fetch_pages(
    config: FetchConfig,
    urls: Sequence[str],
    sitemaps: Sequence[str],
    bodies: Path,
    previous: Sequence[WebPage],
    progress: Callable[[int], None] | None = None,
    on_total: Callable[[int], None] | None = None,
) -> FetchResult:
    """Fetch every configured page (conditionally when a previous fetch is kept).

    Args:
        config: Fetch settings.
        urls: ``discover.urls``.
        sitemaps: ``discover.sitemaps``.
        bodies: Directory of the bodies.
        previous: The last run's fetch state.
        progress: Called with 1 per page done.
        on_total: Called once with the number of pages, when it is known.
    """
    result = FetchResult()
    before = {p.url: p for p in previous}
    hosts = {urlsplit(u).hostname or "" for u in [*urls, *sitemaps] if url_problem(u) is None}
    with Fetcher(config, listed_hosts=hosts) as fetcher:
        listed = expand_sitemaps(
            fetcher, sitemaps, previous, result.failures, config.max_sitemap_depth
        )
        todo, skipped = _plan_urls(urls, listed)
        result.skipped.extend(skipped)
        if on_total is not None:
            on_total(len(todo))
        for url, source in todo:
            _fetch_one(fetcher, url, source, before.get(url), bodies, result)
            if progress is not None:
                progress(1)
        result.requests = fetcher.requests
    result.files.sort(key=lambda f: f.file_path)
    logger.info(
        "fetch: %d pages (%d not modified, %d downloaded), %d failed, %d skipped, %d requests",
        len(result.files),
        result.not_modified,
        result.downloaded,
        len(result.failures),
        len(result.skipped),
        result.requests,
    )
    return result


def _fetch_one(
    fetcher: Fetcher,
    url: str,
    source: str,
    before: WebPage | None,
    bodies: Path,
    result: FetchResult,
) -> None:
    headers: dict[str, str] = {}
    if before is not None and _intact(before):
        if before.etag:
            headers["If-None-Match"] = before.etag
        if before.last_modified:
            headers["If-Modified-Since"] = before.last_modified
    try:
        response = fetcher.get(url, headers)
        page = _page(response, url, source, before, bodies, bool(headers), result)
    except Disallowed as exc:
        result.skipped.append(Skip(url, "robots_disallowed", str(exc)))
        return
    except FetchError as exc:
        result.failures.append(Failure(url, STAGE, exc.category, str(exc)))
        return
    if page is None:
        return
    result.pages.append(page)
    result.files.append(
        SourceFile(page.url, page.body_path, source, page.kind, page.size_bytes, page.sha256)
    )


def _page(
    response: Response,
    url: str,
    source: str,
    before: WebPage | None,
    bodies: Path,
    conditional: bool,
    result: FetchResult,
) -> WebPage | None:
    now = _now()
    status = response.status
    if status == 304 and conditional and before is not None:
        result.not_modified += 1
        _declare_utf8(before)
        return WebPage(**{**before.__dict__, "source": source, "checked_at": now})
    if status in (404, 410):
        raise FetchError(
            "not_found",
            f"HTTP {status}: the page is gone; it is removed from the index (under "
            "index.max_delete_share)",
        )
    if status != 200:
        raise FetchError("http_error", f"HTTP {status} from {response.url}")
    content_type, charset = _content_type(response.headers)
    if content_type in UNTYPED:
        content_type = _sniff(response.body) or content_type
    kind = kind_of_response(response.url, content_type)
    if kind is None:
        result.skipped.append(
            Skip(
                url,
                "unsupported_content_type",
                f"{content_type or 'no Content-Type'}: only HTML, text and PDF are ingested",
            )
        )
        return None
    if not response.body:
        raise FetchError("empty", "HTTP 200 with an empty body")
    sha = hashlib.sha256(response.body).hexdigest()
    result.downloaded += 1
    if before is not None and before.sha256 == sha and before.kind == kind and _intact(before):
        # Same bytes as last time (a server without validators): keep the version.
        _declare_utf8(before)
        return WebPage(
            **{
                **before.__dict__,
                "source": source,
                "final_url": response.url,
                "etag": response.headers.get("etag"),
                "last_modified": response.headers.get("last-modified"),
                "checked_at": now,
            }
        )
    path, title = _stored_body(bodies, response.body, url, sha, kind, charset)
    return WebPage(
        url=url,
        final_url=response.url,
        source=source,
        kind=kind,
        content_type=content_type,
        etag=response.headers.get("etag"),
        last_modified=response.headers.get("last-modified"),
        sha256=sha,
        size_bytes=len(response.body),
        fetched_at=now,
        checked_at=now,
        title=title,
        body_path=str(path),
    )


def prune_bodies(bodies: Path, keep: Sequence[WebPage]) -> None:
    """Delete bodies of pages no longer fetched."""
    if not bodies.is_dir():
        return
    wanted = {Path(p.body_path).name for p in keep}
    for entry in bodies.iterdir():
        if entry.is_file() and entry.name not in wanted and not entry.name.startswith("."):
            entry.unlink(missing_ok=True)


def detect_language(text: str) -> str | None:
    """ISO 639-1 code of the text's language (py3langid, offline), or None for no text."""
    sample = " ".join(text.split())[:5000]
    if len(sample) < 20:
        return None
    import py3langid

    code, _ = py3langid.classify(sample)
    return str(code)


def iter_metadata(pages: Sequence[WebPage]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(url, payload fields) of each page: what its points carry besides the chunk."""
    for page in pages:
        yield (
            page.url,
            {
                "source_url": page.url,
                "final_url": page.final_url,
                "title": page.title,
                "fetched_at": page.fetched_at,
                "content_type": page.content_type,
            },
        )
